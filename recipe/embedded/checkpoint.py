"""Checkpoints in verl's layout, written atomically, and everything a bit-exact resume needs.

``<trainer.default_local_dir>/global_step_<N>/`` holds ``actor/`` (the model and tokenizer, Hugging Face format:
load it with ``from_pretrained``) and ``trainer_state.pt`` (optimizer, LR scheduler, RNG states of python / numpy /
torch, the data position, the dynamic-sampling ``BatchFiller`` state, the W&B run id).
``latest_checkpointed_iteration.txt`` names the newest one, as in verl.

A checkpoint is written to ``global_step_<N>.tmp`` and renamed into place only when complete, and the tracker file
is replaced atomically after that, so a kill at any moment leaves the previous checkpoint intact and findable.
``run.json`` records the run the checkpoint belongs to (``recipe.common.identity``).

A checkpoint damaged after it was written (a truncated ``trainer_state.pt`` or ``model.safetensors``, a disk that
filled up, a copy cut short) is found by :func:`damage` before anything is loaded from it; :func:`find_intact` then
names it and falls back to the newest intact checkpoint.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from recipe.common.identity import check_same_run
from recipe.embedded.config import ConfigError, EngineConfig

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


def save_checkpoint(
    run_dir: Path, step: int, model, tokenizer, state: dict, max_to_keep: int | None, identity: dict | None = None
) -> Path:
    """Write ``global_step_<step>`` atomically, point the tracker at it, prune to ``max_to_keep``."""
    final = run_dir / f"global_step_{step}"
    tmp = run_dir / f"global_step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp / "actor")
        tokenizer.save_pretrained(tmp / "actor")
        torch.save(state, tmp / STATE_FILE)
        if identity is not None:
            from recipe.common.identity import write_identity

            write_identity(tmp, identity)
    except Exception as err:  # noqa: BLE001 - OSError, safetensors' SafetensorError, torch's RuntimeError
        cause = _os_cause(err, run_dir)  # before the partial files go: a full disk is seen by what is left free
        shutil.rmtree(tmp, ignore_errors=True)  # never left where it could pass for a checkpoint
        from recipe.common.rundir import RunStopped

        raise RunStopped(
            f"saving the step-{step} checkpoint into {run_dir} failed ({cause}); nothing of it was kept, and the "
            f"latest intact checkpoint ({find_latest(run_dir) or 'none yet'}) is unchanged. Free space there (or set "
            "trainer.default_local_dir=<a directory with room>) and run the same command again to resume"
        ) from None
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


def _os_cause(err: Exception, directory: Path) -> str:
    """The cause in words: errno's name for a full disk or a quota, whatever the library wrapped it in (torch's
    zip writer reports a full disk as ``unexpected pos``, with no errno), else the error itself."""
    text = f"{type(err).__name__}: {err}".strip()
    for code, words in ((28, "no space left on device"), (122, "disk quota exceeded"), (13, "permission denied")):
        if getattr(err, "errno", None) == code or os.strerror(code).lower() in text.lower():
            return f"{words}: {text[:200]}"
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        free = None
    if free is not None and free < 1 << 20:
        return f"no space left on device: {free // 1024} KiB free; {text[:200]}"
    return text[:300]


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


def damage(checkpoint: Path) -> str | None:
    """What is wrong with a checkpoint's files (``None``: intact), from their structure
    (:mod:`recipe.common.integrity`): a cut-short ``trainer_state.pt`` or ``model.safetensors`` is found without
    loading it."""
    from recipe.common.integrity import file_damage

    state = checkpoint / STATE_FILE
    if not state.is_file():
        return f"{STATE_FILE} is missing"
    problem = file_damage(state)
    if problem:
        return problem
    for weights in sorted((checkpoint / "actor").glob("*.safetensors")):
        problem = file_damage(weights)
        if problem:
            return problem
    if not any((checkpoint / "actor").glob("*.safetensors")) and not any((checkpoint / "actor").glob("*.bin")):
        return f"{checkpoint / 'actor'} holds no model weights"
    return None


def find_intact(run_dir: Path, log=print) -> Path | None:
    """:func:`find_latest`, except that a damaged checkpoint is named and skipped for the newest intact one."""
    latest = find_latest(run_dir)
    if latest is None:
        return None
    from recipe.common.integrity import newest_intact

    candidates = [latest] + [
        run_dir / f"global_step_{s}"
        for s in sorted(checkpoint_steps(run_dir), reverse=True)
        if run_dir / f"global_step_{s}" != latest
    ]
    return newest_intact(run_dir, candidates, damage, log)


def training_state(step: int, optimizer, scheduler, stream, filler, wandb_id: str | None) -> dict:
    """The contents of ``trainer_state.pt``, written here and read back by :func:`restore_training_state` only."""
    return {
        "global_step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(),
        "data": stream.state_dict(),
        "filler": None if filler is None else filler.state_dict(),
        "wandb_id": wandb_id,
    }


def restore_training_state(state: dict, optimizer, scheduler, stream, filler) -> tuple[int, str | None]:
    """Load :func:`training_state`'s contents into the objects (and the RNGs); return (step, W&B run id)."""
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    stream.load_state_dict(state["data"])
    if filler is not None and state.get("filler") is not None:
        filler.load_state_dict(state["filler"])
    set_rng_state(state["rng"])
    return int(state["global_step"]), state.get("wandb_id")


def load_state(checkpoint: Path) -> dict:
    # our own file: optimizer and RNG states hold numpy arrays and python tuples, so weights_only is off
    return torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=False)


# ---------------------------------------------------------------------------------------------------- resume


def resume_checkpoint(c: EngineConfig, run_dir: Path, identity: dict) -> Path | None:
    """verl's ``trainer.resume_mode``: auto = the latest intact checkpoint in the run dir if any; disable = start
    over; resume_path = ``trainer.resume_from_path``. A checkpoint of another run is refused (run.json)."""
    if c.trainer.resume_mode == "disable":
        return None
    if c.trainer.resume_mode == "resume_path":
        path = Path(c.trainer.resume_from_path).expanduser()
        if not (path / STATE_FILE).is_file():
            raise ConfigError(
                f"trainer.resume_from_path={c.trainer.resume_from_path!r} is not a checkpoint "
                "(a global_step_N directory)"
            )
        problem = damage(path)
        if problem:
            raise ConfigError(
                f"trainer.resume_from_path={c.trainer.resume_from_path!r}: {problem}; point it at an intact checkpoint"
            )
    else:
        path = find_intact(run_dir)
    if path is not None:
        check_same_run(path, identity)
    return path


def finished(c: EngineConfig, resume_from: Path) -> bool:
    """True (and says so) when the checkpoint is the last step of ``trainer.total_training_steps``; a length given
    in epochs is known only once the data is read, so that case is told after loading (``run``)."""
    step = int(resume_from.name.rsplit("_", 1)[1]) if resume_from.name.startswith("global_step_") else None
    if (
        c.trainer.val_only
        or step is None
        or c.trainer.total_training_steps is None
        or step < c.trainer.total_training_steps
    ):
        return False
    finished_message(c, resume_from, step, c.trainer.total_training_steps)
    return True


def finished_message(c: EngineConfig, resume_from: Path, step: int, total_steps: int) -> None:
    print(
        f"this run is complete: {resume_from} is step {step} of trainer.total_training_steps={total_steps}; nothing "
        f"to train. Its metrics and plots are in {resume_from.parent}. To train further raise "
        "trainer.total_training_steps; to start a new run set trainer.experiment_name=<new name> (or "
        "trainer.resume_mode=disable to start over in this directory)"
    )
