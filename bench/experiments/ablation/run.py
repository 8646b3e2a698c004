"""Running the ablation: the start model built once, the runs of the plan in parallel processes, each an ordinary
``dapo-train`` run, finished runs reused and interrupted ones resumed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from bench.experiments.ablation.figures import final_val
from bench.experiments.ablation.plan import CONFIG_NAME


def compose_setting(overrides: list[str], config_name: str = CONFIG_NAME):
    from recipe.config import compose

    return compose(overrides, config_name)


def prepare_start_model(extra: list[str], config_name: str = CONFIG_NAME) -> Path:
    """Build the task files and the warmed-up start model once, before the parallel runs (they all reuse it); the
    start model's folder."""
    import torch

    from recipe.embedded.config import read_config

    c = read_config(compose_setting(extra, config_name))
    if c.data.train_files is None or c.data.val_files is None:
        c.tiny.task_dir()
    if c.model.path is not None:
        return Path(c.model.path)
    torch.set_num_threads(c.embedded.num_threads or torch.get_num_threads())
    cuda = c.embedded.device == "cuda" or (c.embedded.device == "auto" and torch.cuda.is_available())
    return c.tiny.model_dir(torch.device("cuda" if cuda else "cpu"))


def evaluate_runs(
    plan: list[tuple[str, int, list[str], Path]],
    steps: int,
    k: int,
    start_model: Path,
    out: Path,
    config_name: str,
    extra: list[str],
) -> dict:
    """Final accuracy with ``k`` answers a held-out problem (:mod:`bench.experiments.paired_eval`: one validation
    run of the model, every row's on the same problems and sampling settings): of each run's checkpoint at step
    ``steps`` (``<run>/eval-k<k>/``, None where the run saved none there) and of the start model
    (``<out>/start/eval-k<k>/``). Each answer file is reused by a later call with the same model, ``k`` and
    overrides. ``{"start": accuracy, "rows": {row: [accuracy of seed 0, ...]}}``."""
    import statistics

    from bench.experiments.paired_eval import evaluate, per_problem

    def accuracy(model: Path, where: Path) -> float:
        return statistics.fmean(per_problem(evaluate(model, f"eval-k{k}", where, k, config_name, extra)).values())

    rows: dict[str, list[float | None]] = {}
    for name, seed, _, run_dir in plan:
        actor = run_dir / f"global_step_{steps}" / "actor"
        saved = (actor / "config.json").is_file()
        if not saved:
            print(f"{name} / seed {seed}: no checkpoint at step {steps} ({actor}); not evaluated", flush=True)
        rows.setdefault(name, []).append(accuracy(actor, run_dir) if saved else None)
    return {"start": accuracy(start_model, out / "start"), "rows": rows}


def finished(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` ended (its ``ablation_done.json``)."""
    return (run_dir / "ablation_done.json").is_file()


def run_one(
    name: str, overrides: list[str], run_dir: Path, config_name: str = CONFIG_NAME
) -> tuple[str, Path, int, float]:
    """One ``dapo-train`` run in its own process, its output in ``run_dir/log.txt``; (name, dir, rc, seconds)."""
    start = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_SILENT": "true"}
    with open(run_dir / "log.txt", "a") as log:
        rc = subprocess.run(
            [sys.executable, "-m", "recipe.cli", "--config-name", config_name, *overrides],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        ).returncode
    seconds = time.perf_counter() - start
    if rc == 0:
        (run_dir / "ablation_done.json").write_text(json.dumps({"overrides": overrides, "seconds": seconds}) + "\n")
    return name, run_dir, rc, seconds


def steps_done(run_dir: Path, steps: int) -> int:
    """Training steps a run of the plan has behind it: all of them when finished, else its latest checkpoint's."""
    if finished(run_dir):
        return steps
    from recipe.embedded.checkpoint import TRACKER

    tracker = run_dir / TRACKER
    return min(steps, int(tracker.read_text() or 0)) if tracker.is_file() else 0


def run_all(
    plan: list[tuple[str, int, list[str], Path]],
    jobs: int,
    config_name: str = CONFIG_NAME,
    deadline_s: float | None = None,
) -> tuple[list[str], int]:
    """Run every unfinished (row, seed) of ``plan``, ``jobs`` at a time, starting none once ``deadline_s`` seconds
    have passed; return the failures' descriptions and the count of runs left unstarted."""
    todo = [p for p in plan if not finished(p[3])]
    if len(todo) < len(plan):
        print(f"reusing {len(plan) - len(todo)} finished run(s) under {plan[0][3].parents[1]}")
    failures, start, skipped = [], time.perf_counter(), []

    def one(name, overrides, run_dir):
        if deadline_s is not None and time.perf_counter() - start >= deadline_s:
            skipped.append(name)
            return None
        return run_one(name, overrides, run_dir, config_name)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [
            pool.submit(one, f"{name} / seed {seed}", overrides, run_dir) for name, seed, overrides, run_dir in todo
        ]
        done = 0
        for future in as_completed(futures):
            if (result := future.result()) is None:  # not started: past the deadline
                continue
            done += 1
            name, run_dir, rc, seconds = result
            status = "ok" if rc == 0 else f"FAILED (exit {rc}; see {run_dir / 'log.txt'})"
            final = final_val(run_dir)
            acc = f", val acc {final:.3f}" if final is not None else ""
            print(
                f"[{done}/{len(todo)}] {name}: {status} in {seconds:.0f} s{acc}  "
                f"(elapsed {time.perf_counter() - start:.0f} s)",
                flush=True,
            )
            if rc != 0:
                tail = (run_dir / "log.txt").read_text().strip().splitlines()[-5:]
                failures.append(f"{name}: exit {rc}\n    " + "\n    ".join(tail))
    return failures, len(skipped)
