"""Checkpoints in verl's layout, written atomically, and everything a bit-exact resume needs.

``<trainer.default_local_dir>/global_step_<N>/`` holds ``actor/`` (the model and tokenizer, Hugging Face format:
load it with ``from_pretrained``) and ``trainer_state.pt`` (optimizer, LR scheduler, RNG states of python / numpy /
torch, the data position, the dynamic-sampling ``BatchFiller`` state, the W&B run id).
``latest_checkpointed_iteration.txt`` names the newest one, as in verl.

A checkpoint is written to ``global_step_<N>.tmp`` and renamed into place only when complete, and the tracker file
is replaced atomically after that, so a kill at any moment leaves the previous checkpoint intact and findable.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

TRACKER = "latest_checkpointed_iteration.txt"
STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict, max_to_keep: int | None) -> Path:
    """Write ``global_step_<step>`` atomically, point the tracker at it, prune to ``max_to_keep``."""
    final = run_dir / f"global_step_{step}"
    tmp = run_dir / f"global_step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp / "actor")
    tokenizer.save_pretrained(tmp / "actor")
    torch.save(state, tmp / STATE_FILE)
    if final.exists():  # a run restarted with resume_mode=disable overwrites its old checkpoints
        old = run_dir / f"global_step_{step}.old"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    tracker_tmp = run_dir / f"{TRACKER}.tmp"
    tracker_tmp.write_text(str(step))
    os.replace(tracker_tmp, run_dir / TRACKER)
    if max_to_keep is not None and max_to_keep > 0:
        for old_step in sorted(checkpoint_steps(run_dir))[:-max_to_keep]:
            shutil.rmtree(run_dir / f"global_step_{old_step}", ignore_errors=True)
    return final


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of the complete checkpoints under ``run_dir``."""
    if not run_dir.is_dir():
        return []
    steps = []
    for child in run_dir.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file():
            steps.append(int(match.group(1)))
    return steps


def find_latest(run_dir: Path) -> Path | None:
    """The checkpoint the tracker names (or, if it is missing or stale, the newest complete one)."""
    tracker = run_dir / TRACKER
    if tracker.is_file():
        candidate = run_dir / f"global_step_{tracker.read_text().strip()}"
        if (candidate / STATE_FILE).is_file():
            return candidate
    steps = checkpoint_steps(run_dir)
    return run_dir / f"global_step_{max(steps)}" if steps else None


def load_state(checkpoint: Path) -> dict:
    # our own file: optimizer and RNG states hold numpy arrays and python tuples, so weights_only is off
    return torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=False)
