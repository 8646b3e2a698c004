"""Running the ablation: the start model built once, the runs of the plan in parallel processes, each an ordinary
``dapo-train`` run, finished runs reused and interrupted ones resumed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
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


def evaluate_run(run_dir: Path, steps: int, k: int, config_name: str, extra: list[str]) -> float | None:
    """The run's checkpoint at step ``steps`` answering every held-out problem ``k`` times
    (:mod:`bench.experiments.paired_eval`, one validation run of the model): its mean accuracy, from the answers
    kept in the run's folder where they are (the checkpoint may be gone then), None where neither is there."""
    from bench.experiments.paired_eval import answers_file

    actor = run_dir / f"global_step_{steps}" / "actor"
    if not (actor / "config.json").is_file() and not answers_file(run_dir, eval_label(k)).is_file():
        return None
    return evaluate_run_model(actor, run_dir, k, config_name, extra)


def evaluate_runs(
    plan: list[tuple[str, int, list[str], Path]],
    steps: int,
    k: int,
    start_model: Path,
    out: Path,
    config_name: str,
    extra: list[str],
) -> dict:
    """Final accuracy with ``k`` answers a held-out problem (:func:`evaluate_run`: every row's on the same problems
    and sampling settings) of each run's checkpoint at step ``steps`` (None where the run saved none there and no
    answers are kept) and of the start model (``<out>/start/eval-k<k>/``). Each answer file is reused by a later
    call with the same model, ``k`` and overrides. ``{"start": accuracy, "rows": {row: [accuracy of seed 0, ...]}}``."""
    rows: dict[str, list[float | None]] = {}
    for name, seed, _, run_dir in plan:
        accuracy = evaluate_run(run_dir, steps, k, config_name, extra)
        if accuracy is None:
            print(f"{name} / seed {seed}: no checkpoint at step {steps} under {run_dir}; not evaluated", flush=True)
        rows.setdefault(name, []).append(accuracy)
    start = evaluate_run_model(start_model, out / "start", k, config_name, extra)
    return {"start": start, "rows": rows}


def eval_label(k: int) -> str:
    """The folder of a model's answers at ``k`` answers a problem, under its run's (``eval-k<k>``)."""
    return f"eval-k{k}"


def evaluate_run_model(model: Path, where: Path, k: int, config_name: str, extra: list[str]) -> float:
    """A model folder's mean accuracy at ``k`` answers a held-out problem, its answers under ``where``."""
    import statistics

    from bench.experiments.paired_eval import evaluate, per_problem

    return statistics.fmean(per_problem(evaluate(model, eval_label(k), where, k, config_name, extra)).values())


START_MODEL_FILE = "start_model.json"


def fingerprint(model: Path) -> str:
    """sha256 over a Hugging Face folder's weights (its ``*.safetensors``, by name and content)."""
    digest = hashlib.sha256()
    for file in sorted(Path(model).glob("*.safetensors")):
        digest.update(file.name.encode())
        with open(file, "rb") as stream:
            while chunk := stream.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def check_start_model(out: Path, model: Path) -> None:
    """Record the start model's weights (:func:`fingerprint`) in ``<out>/start_model.json`` on the first call; on a
    later one, refuse to add to or report runs that another start model began (a rebuilt ``make model`` whose
    weights came out different): every row's seeds must start from the same weights to be paired."""
    record = out / START_MODEL_FILE
    current = {"path": str(Path(model).resolve()), "sha256": fingerprint(model)}
    if not record.is_file():
        out.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(current, indent=1) + "\n")
        return
    recorded = json.loads(record.read_text())
    if recorded["sha256"] != current["sha256"]:
        raise SystemExit(
            f"bench.experiments.ablation: the runs under {out} started from other weights than {model} holds now "
            f"(sha256 {recorded['sha256'][:12]} recorded in {record}, {current['sha256'][:12]} now): rebuild the "
            "start model that trained them, or start the plan over with --fresh (or another --out)"
        )


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
    on_finished: Callable[[Path], object] | None = None,
) -> tuple[list[str], int]:
    """Run every unfinished (row, seed) of ``plan``, ``jobs`` at a time, starting none once ``deadline_s`` seconds
    have passed, and call ``on_finished`` with each run's folder as it ends well (the final evaluation, so that it
    is kept with the run while its checkpoint is there); return the failures' descriptions and the count of runs
    left unstarted."""
    todo = [p for p in plan if not finished(p[3])]
    if len(todo) < len(plan):
        print(f"reusing {len(plan) - len(todo)} finished run(s) under {plan[0][3].parents[1]}")
    failures, start, skipped = [], time.perf_counter(), []

    def one(name, overrides, run_dir):
        if deadline_s is not None and time.perf_counter() - start >= deadline_s:
            skipped.append(name)
            return None
        result = run_one(name, overrides, run_dir, config_name)
        if result[2] == 0 and on_finished is not None:
            on_finished(run_dir)
        return result

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
