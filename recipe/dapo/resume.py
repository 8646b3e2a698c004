"""What a verl run resumes from, decided in the driver before Ray starts: the newest *intact* checkpoint, and a
``metrics.jsonl`` that holds each step once.

verl 0.9.1 resumes whatever ``latest_checkpointed_iteration.txt`` names (``trainer.resume_mode=auto``), damaged or
not, and its ``file`` logger opens its file with ``"wb"``, so a resumed run loses the records of the steps before
the restart (``verl/utils/tracking.py:FileLogger``). Here, as in the embedded engine:

- :func:`choose_checkpoint` checks the tracked checkpoint's files (:mod:`recipe.common.integrity`) and, when one
  is damaged (a file cut short by a kill during the save, a disk that filled up), names it and points verl at the
  newest intact one (``trainer.resume_mode=resume_path``, ``trainer.resume_from_path``); a checkpoint whose step
  never reached ``metrics.jsonl`` (killed between verl's save and its log) is skipped the same way (the run's
  only checkpoint: the run starts over);
- :func:`trim_metrics` keeps the records of the steps up to the resumed checkpoint and drops those a killed run
  logged after it (they are trained and logged again), and
  :func:`recipe.dapo.verl_patches.patch_file_logger_append` makes verl's file
  logger append to what is kept.

What a resume keeps in each trainer mode is in ``docs/testing.md`` ("Resume").
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from omegaconf import DictConfig, open_dict

from dapo.settings import select
from recipe.common.integrity import newest_intact

TRACKER = "latest_checkpointed_iteration.txt"  # verl's tracker file
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def checkpoint_damage(checkpoint: Path) -> str | None:
    """What is wrong with a verl ``global_step_N`` directory (``None``: intact)."""
    from recipe.common.integrity import directory_damage

    return directory_damage(checkpoint, required=("actor", "data.pt"))


def choose_checkpoint(config: DictConfig, log=print) -> Path | None:
    """The checkpoint this run resumes from (``None``: it starts at step 0); re-points ``config`` at the newest
    intact checkpoint when the tracked one is damaged. Only ``resume_mode=auto`` on a local directory is
    decided here; ``resume_path`` and ``disable`` are verl's as given."""
    mode = select(config, "trainer.resume_mode", "auto")
    run_dir = select(config, "trainer.default_local_dir")
    if mode == "resume_path":
        path = select(config, "trainer.resume_from_path")
        return Path(path) if path else None
    if mode != "auto" or not run_dir or "://" in str(run_dir):
        return None
    run_dir = Path(os.path.expanduser(str(run_dir)))
    tracker = run_dir / TRACKER
    if not tracker.is_file():
        return None
    tracked = run_dir / f"global_step_{tracker.read_text().strip()}"
    steps = sorted((int(m.group(1)) for p in run_dir.iterdir() if (m := _STEP_DIR.match(p.name))), reverse=True)
    # the tracked one first, even if missing (then named as such and skipped), then the others newest first
    candidates = [tracked] + [run_dir / f"global_step_{s}" for s in steps if run_dir / f"global_step_{s}" != tracked]
    path = metrics_path(config)
    unlogged = unlogged_step(path) if path is not None else None
    if [step_of(c) for c in candidates] == [unlogged]:
        # the run's only checkpoint, saved and never logged: nothing before it to resume from, so it starts over
        log(
            f"warning: checkpoint {tracked} is skipped: step {unlogged} has no record in {path} (the run stopped "
            "after saving the checkpoint and before logging the step); the run starts over from step 0"
        )
        with open_dict(config):
            config.trainer.resume_mode = "disable"
        return None
    chosen = newest_intact(run_dir, candidates, _damage_or_unlogged(path, unlogged), log)
    if chosen != tracked:  # verl would resume the tracked one: point it at the chosen one
        with open_dict(config):
            config.trainer.resume_mode = "resume_path"
            config.trainer.resume_from_path = str(chosen)
    return chosen


def _damage_or_unlogged(path: Path | None, unlogged: int | None):
    """:func:`checkpoint_damage`, and the checkpoint of step ``unlogged`` (:func:`unlogged_step` of ``path``).

    verl saves a step's checkpoint before it logs the step's metrics (``trainer_base.py``, ``fit``: the save inside
    the step, the record after validation), so a run killed in between leaves a checkpoint of a step that was never
    logged; resuming from it would lose that record for good. Such a checkpoint is skipped like a damaged one and
    the run resumes from the one before, training and logging that step again."""

    def damage(checkpoint: Path) -> str | None:
        problem = checkpoint_damage(checkpoint)
        if problem is None and step_of(checkpoint) == unlogged:
            return (
                f"step {unlogged} has no record in {path} (the run stopped after saving the checkpoint "
                "and before logging the step); that step is trained and logged again"
            )
        return problem

    return damage


def unlogged_step(path: Path) -> int | None:
    """The step a run logging to ``path`` stopped in between saving and logging: the first step with no record
    there, when ``path`` exists (verl's file logger creates it before step 1). A checkpoint of a later step was
    not written by a run logging here (it would have logged the steps before), and a missing file means the run
    logged elsewhere until now: neither is skipped."""
    if not path.is_file():
        return None
    logged = logged_steps(path)
    return next(step for step in range(1, len(logged) + 2) if step not in logged)


def _records(path: Path) -> list[tuple[int | None, str]]:
    """Each line of verl's ``{"step", "data"}`` records in ``path`` with its step (``None``: a line cut short by a
    kill); none when the file does not exist."""
    out = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                out.append((int(json.loads(line)["step"]), line))
            except (ValueError, KeyError, TypeError):
                out.append((None, line))
    return out


def logged_steps(path: Path) -> set[int]:
    """The steps of the records in ``path``."""
    return {step for step, _ in _records(path) if step is not None}


def metrics_path(config: DictConfig) -> Path | None:
    """Where verl's ``file`` logger writes (``VERL_FILE_LOGGER_PATH``), when this run logs to a file."""
    loggers = select(config, "trainer.logger", []) or []
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    path = os.environ.get("VERL_FILE_LOGGER_PATH")
    if "file" not in loggers or not path:
        return None
    return Path(path)


def trim_metrics(path: Path, resumed_step: int) -> int:
    """Keep the records of steps ``<= resumed_step`` (0: none) in verl's ``{"step", "data"}`` lines; return how
    many were dropped. A line cut short by a kill is dropped too."""
    if not path.is_file():
        return 0
    records = _records(path)
    kept = [line for step, line in records if step is not None and step <= resumed_step]
    dropped = len(records) - len(kept)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    os.replace(tmp, path)
    return dropped


def step_of(checkpoint: Path | None) -> int:
    match = _STEP_DIR.match(checkpoint.name) if checkpoint is not None else None
    return int(match.group(1)) if match else 0


def prepare_metrics(config: DictConfig, resumed: Path | None) -> None:
    """:func:`trim_metrics` to the step of the checkpoint :func:`choose_checkpoint` chose (the driver, before Ray,
    once every check has passed)."""
    path = metrics_path(config)
    if path is not None and select(config, "trainer.resume_mode", "auto") != "disable":
        dropped = trim_metrics(path, step_of(resumed))
        if dropped:
            print(
                f"{path}: dropped {dropped} records after step {step_of(resumed)} (logged by the run that "
                "stopped; they are trained and logged again)"
            )
    elif path is not None and path.is_file():
        path.unlink()  # resume_mode=disable starts over: so does its metrics file
