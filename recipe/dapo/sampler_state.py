"""The dynamic-sampling state in verl's checkpoints: ``global_step_N/dapo_sampler.pt``.

verl 0.9.1's V1 trainer checkpoints the actor, the data loader and (asynchronous modes only) the TransferQueue;
the DAPO sampler's :class:`dapo.sampling.BatchFiller` state (the adaptive round-size estimate, the saturation
history, the running totals, the carried groups) would start afresh on resume. :class:`recipe.dapo.trainer.DAPOTrainer`
saves it next to verl's files before verl writes ``latest_checkpointed_iteration.txt`` (so a checkpoint that verl
resumes from always has it) and restores it after verl's own load.

Carried groups (``dapo.sampling.carry_over``) are the exception: their trajectories live in the TransferQueue,
which verl does not checkpoint for the synchronous trainer, so they are dropped on restore (logged; the resumed step
generates in their place).
"""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)

FILE_NAME = "dapo_sampler.pt"
_FORMAT = 1


def save_sampler_state(replay_buffer, step_dir: str) -> str | None:
    """Write the sampler's filler state into ``step_dir``; ``None`` when the sampler has no filler (filter off)."""
    filler = getattr(replay_buffer, "filler", None)
    if filler is None:
        return None
    os.makedirs(step_dir, exist_ok=True)
    path = os.path.join(step_dir, FILE_NAME)
    tmp = f"{path}.tmp-{os.getpid()}"
    torch.save({"format": _FORMAT, "filler": filler.state_dict(), "carried": sorted(replay_buffer._carried)}, tmp)
    os.replace(tmp, path)
    return path


def load_sampler_state(replay_buffer, step_dir: str) -> dict | None:
    """Restore what :func:`save_sampler_state` wrote; returns the restored filler state (``None``: nothing to do).

    Raises ``FileNotFoundError`` naming the file when the checkpoint lacks it (written by another trainer)."""
    filler = getattr(replay_buffer, "filler", None)
    if filler is None:
        return None
    path = os.path.join(step_dir, FILE_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} is missing: this checkpoint was not written by the DAPO trainer (trainer.v1.trainer_mode=dapo), "
            "so the dynamic-sampling state cannot be restored; resume it with the trainer that wrote it, or start "
            "afresh with trainer.resume_mode=disable"
        )
    saved = torch.load(path, weights_only=False)
    if saved.get("format") != _FORMAT:
        raise ValueError(f"{path}: unknown format {saved.get('format')!r} (expected {_FORMAT})")
    state = dict(saved["filler"])
    if state["carried_payloads"]:
        logger.warning(
            "dropping %d carried groups from %s: their trajectories lived in the TransferQueue, which verl's "
            "synchronous trainer does not checkpoint; the resumed step generates in their place",
            len(state["carried_payloads"]),
            path,
        )
        state.update(carried_payloads=[], carried_versions=[])
    filler.load_state_dict(state)
    replay_buffer._carried = set()
    return state
