"""The paper's Table 1, small: DAPO built up from naive GRPO one technique at a time, on the embedded engine.

Six rows, in the paper's order, each the one before it with one technique switched on (``ROWS``):

  naive GRPO                   clip 0.2/0.2, per-sequence loss (seq-mean-token-mean), no overlong filtering,
                               no soft overlong punishment, no dynamic sampling; no KL in any row (DAPO has none)
  + overlong filtering         dapo.overlong_filter=true
  + clip-higher                actor_rollout_ref.actor.clip_ratio_high=0.28
  + soft overlong punishment   reward.reward_kwargs.overlong_buffer_cfg.enable=true
  + token-level loss           actor_rollout_ref.actor.loss_agg_mode=token-mean
  + dynamic sampling (DAPO)    algorithm.filter_groups.enable=true

Every run composes ``configs/ablation.yaml`` (the shared setting: the ``addition_steps`` task, whose worked
solutions are 8 to 30 tokens long against a 28-token budget with a 6-token overlong buffer, so truncation and the
punishment both happen; the held-out validation set; the step budget) plus its row's overrides, and is an ordinary
``dapo-train`` run in its own process: ``--print-commands`` shows each one, to rerun a single row by hand. Every
row of a seed starts from the same warmed-up model (built once, cached); the seed changes the RL sampling and the
prompt order (``embedded.seed``).

What it writes under ``--out`` (default ``bench/results/ablation``): one run directory per row and seed (the
engine's ``metrics.jsonl``, plots, last checkpoint, ``log.txt``), ``report.md`` (the table and the plots),
``plots/{accuracy,entropy,response_length}.png`` (one line per row: the mean over seeds, shaded from the lowest to
the highest seed) and, with ``--json PATH``, the figures. Finished runs are kept: running the command again reuses
them and resumes an interrupted one from its last checkpoint, so a killed ablation loses at most a few steps.

Figures, per row, over seeds:
  val acc            held-out validation accuracy (mean@k, ``rollout.val_kwargs``) at the last step: mean ± std
  steps to target    first validation step at or above the target accuracy: the median over seeds, a seed that
                     never reaches it counting as never (so "-" when most seeds do not)
  responses to tgt   responses generated up to that step (dynamic sampling generates more per step): median
  final entropy      actor/entropy (mean per-token entropy of the trained responses) over the last 5 steps
  final length       response_length/mean over the last 5 steps
  truncated          dapo/overlong_frac, the share of trained responses cut at the length limit, over all steps
The target (``--target``) defaults to the start accuracy plus 0.8 x the best row's gain (its mean final accuracy
less the start), a level the best row reaches late in the budget, so that the steps to reach it tell rows apart.

Run: python -m bench.ablation [--quick] [--seeds N] [--jobs N] [--json PATH] [--out DIR] [key=value ...]
Default: 3 seeds x 6 rows of 40 steps (configs/ablation.yaml), 2 runs at a time with one torch thread each: 21
minutes on 2 cores as measured (2 to 4 minutes a run, depending on the machine's load), including a one-time
warm-up of the start model (2 to 5 minutes) when it is not cached. ``--quick``: 2 seeds, 8 steps, validation on 64
problems every 4 steps, about 3 minutes.
``key=value`` overrides (verl's names) apply to every run, after the row's own.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from bench.common import parser, print_table, write_json

CONFIG_NAME = "ablation"
ACTOR = "actor_rollout_ref.actor"
# The paper's Table 1 (AIME 2024 avg@32, Qwen2.5-32B), for the comparison column.
PAPER_AIME = (30, 36, 38, 41, 42, 50)
NAIVE_GRPO = {
    "dapo.overlong_filter": False,
    f"{ACTOR}.clip_ratio_high": 0.2,
    "reward.reward_kwargs.overlong_buffer_cfg.enable": False,
    f"{ACTOR}.loss_agg_mode": "seq-mean-token-mean",
    "algorithm.filter_groups.enable": False,
}
TECHNIQUES = (  # (row name, the override that switches the technique on), in the paper's order
    ("+ overlong filtering", {"dapo.overlong_filter": True}),
    ("+ clip-higher", {f"{ACTOR}.clip_ratio_high": 0.28}),
    ("+ soft overlong punishment", {"reward.reward_kwargs.overlong_buffer_cfg.enable": True}),
    ("+ token-level loss", {f"{ACTOR}.loss_agg_mode": "token-mean"}),
    ("+ dynamic sampling (DAPO)", {"algorithm.filter_groups.enable": True}),
)
PRESETS = {
    "default": {"seeds": 3, "overrides": []},
    "quick": {"seeds": 2, "overrides": ["trainer.total_training_steps=8", "trainer.test_freq=4",
                                        "trainer.save_freq=4", "data.val_max_samples=64"]},
}
TARGET_FRACTION = 0.8  # default target: start + 0.8 x the best row's mean gain
TAIL_STEPS = 5  # final entropy / length: mean over this many last steps
VAL_PREFIX = "val-core/"


def rows() -> list[tuple[str, dict]]:
    """The six rows of Table 1: (name, overrides), each the previous one plus one technique."""
    out = [("naive GRPO", dict(NAIVE_GRPO))]
    for name, switch in TECHNIQUES:
        out.append((name, {**out[-1][1], **switch}))
    return out


def slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name.lower().removeprefix("+ ")).strip("_").replace("__", "_")


def _value(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def run_overrides(row: dict, seed: int, run_dir: Path, extra: list[str]) -> list[str]:
    """The ``dapo-train --config-name ablation`` overrides of one (row, seed) run."""
    return [
        *(f"{k}={_value(v)}" for k, v in row.items()),
        f"embedded.seed={seed}",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.experiment_name={run_dir.parent.name}-{run_dir.name}",
        "embedded.progress_bar=false",
        *extra,
    ]


# ---------------------------------------------------------------------------------------------------- running


def _compose(overrides: list[str]):
    from recipe.cli import compose

    return compose(overrides, CONFIG_NAME)


def prepare_start_model(extra: list[str]) -> None:
    """Build the task files and the warmed-up start model once, before the parallel runs (they all reuse it)."""
    import torch

    from recipe.embedded.config import read_config
    from recipe.embedded.warmup import task_files, warm_model

    c = read_config(_compose(extra))
    if c.model_path is None:
        torch.set_num_threads(c.num_threads or torch.get_num_threads())
        warm_model(c.cache_dir, c.task, c.tiny_model, c.warmup, device=torch.device("cpu"))
    elif c.train_files is None or c.val_files is None:
        task_files(c.cache_dir, c.task)


def _finished(run_dir: Path) -> bool:
    return (run_dir / "ablation_done.json").is_file()


def run_one(name: str, overrides: list[str], run_dir: Path) -> tuple[str, Path, int, float]:
    """One ``dapo-train`` run in its own process, its output in ``run_dir/log.txt``; (name, dir, rc, seconds)."""
    start = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_SILENT": "true"}
    with open(run_dir / "log.txt", "a") as log:
        rc = subprocess.run(
            [sys.executable, "-m", "recipe.cli", "--config-name", CONFIG_NAME, *overrides],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        ).returncode
    seconds = time.perf_counter() - start
    if rc == 0:
        (run_dir / "ablation_done.json").write_text(json.dumps({"overrides": overrides, "seconds": seconds}) + "\n")
    return name, run_dir, rc, seconds


def run_all(plan: list[tuple[str, int, list[str], Path]], jobs: int) -> list[str]:
    """Run every unfinished (row, seed) of ``plan``, ``jobs`` at a time; return the failures' descriptions."""
    todo = [p for p in plan if not _finished(p[3])]
    if len(todo) < len(plan):
        print(f"reusing {len(plan) - len(todo)} finished run(s) under {plan[0][3].parents[1]}")
    failures, start = [], time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_one, f"{name} / seed {seed}", overrides, run_dir)
                   for name, seed, overrides, run_dir in todo]
        for done, future in enumerate(as_completed(futures), 1):
            name, run_dir, rc, seconds = future.result()
            status = "ok" if rc == 0 else f"FAILED (exit {rc}; see {run_dir / 'log.txt'})"
            final = _final_val(run_dir)
            acc = f", val acc {final:.3f}" if final is not None else ""
            print(f"[{done}/{len(todo)}] {name}: {status} in {seconds:.0f} s{acc}  "
                  f"(elapsed {time.perf_counter() - start:.0f} s)", flush=True)
            if rc != 0:
                tail = (run_dir / "log.txt").read_text().strip().splitlines()[-5:]
                failures.append(f"{name}: exit {rc}\n    " + "\n    ".join(tail))
    return failures


# ---------------------------------------------------------------------------------------------------- figures


def _records(run_dir: Path) -> list[dict]:
    from recipe.embedded.monitor import read_metrics

    return read_metrics(run_dir)


def _val_key(records: list[dict]) -> str | None:
    keys = sorted({k for r in records for k in r if k.startswith(VAL_PREFIX) and "/acc/" in k})
    return keys[0] if keys else None


def _val_curve(records: list[dict]) -> list[tuple[int, float]]:
    key = _val_key(records)
    return [(r["step"], r[key]) for r in records if key and r.get(key) is not None]


def _final_val(run_dir: Path) -> float | None:
    curve = _val_curve(_records(run_dir))
    return curve[-1][1] if curve else None


def _series(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in records if r.get("step", 0) > 0 and r.get(key) is not None]


def _generated(record: dict, train_batch_size: int, n: int) -> float:
    """Responses generated in a training step (rounds x prompts x n)."""
    return record.get("dapo/generated_prompts", train_batch_size) * n


def _median_or_none(values: list[float]) -> float | None:
    """Median where ``inf`` means never; None when the median itself is never."""
    if not values:
        return None
    m = statistics.median(sorted(values))
    return None if math.isinf(m) else m


def summarise(results: dict[str, list[list[dict]]], target: float | None, train_batch_size: int, n: int) -> dict:
    """The figures of every row from its seeds' metric records (``results[row] = [records of seed 0, ...]``)."""
    finals = {name: [(_val_curve(r) or [(0, math.nan)])[-1][1] for r in seeds] for name, seeds in results.items()}
    start_accs = [c[0][1] for seeds in results.values() for r in seeds if (c := _val_curve(r)) and c[0][0] == 0]
    start_acc = statistics.fmean(start_accs) if start_accs else math.nan
    if target is None:
        best = max(statistics.fmean(v) for v in finals.values())
        target = start_acc + TARGET_FRACTION * (best - start_acc)
    out_rows = []
    for (name, seeds), paper in zip(results.items(), PAPER_AIME):
        steps_to, responses_to, entropy, length, truncated = [], [], [], [], []
        for records in seeds:
            train = [r for r in records if r.get("step", 0) > 0 and "actor/entropy" in r]
            hit = next((s for s, v in _val_curve(records) if v >= target), None)
            steps_to.append(math.inf if hit is None else hit)
            responses_to.append(math.inf if hit is None else
                                sum(_generated(r, train_batch_size, n) for r in train if r["step"] <= hit))
            tail = train[-TAIL_STEPS:]
            entropy.append(statistics.fmean(r["actor/entropy"] for r in tail) if tail else math.nan)
            length.append(statistics.fmean(r["response_length/mean"] for r in tail) if tail else math.nan)
            truncated.append(statistics.fmean(r.get("dapo/overlong_frac", 0.0) for r in train) if train else math.nan)
        accs = finals[name]
        out_rows.append({
            "name": name,
            "val_acc_mean": statistics.fmean(accs),
            "val_acc_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
            "val_acc_per_seed": accs,
            "final_entropy": statistics.fmean(entropy),
            "steps_to_target": _median_or_none(steps_to),
            "seeds_reaching_target": sum(not math.isinf(s) for s in steps_to),
            "responses_to_target": _median_or_none(responses_to),
            "final_response_length": statistics.fmean(length),
            "truncated_frac": statistics.fmean(truncated),
            "generated_responses": statistics.fmean(
                sum(_generated(r, train_batch_size, n) for r in recs if r.get("step", 0) > 0 and "actor/entropy" in r)
                for recs in seeds),
            "paper_aime_avg32": paper,
        })
    return {"target": target, "start_acc": start_acc, "rows": out_rows}


def table(figures: dict, seeds: int, steps: int) -> tuple[list[str], list[list[object]]]:
    headers = ["row", f"val acc @ step {steps} (mean ± std, {seeds} seed{'s' if seeds > 1 else ''})", "steps to target",
               "responses to target", "final entropy", "final length", "truncated", "paper (AIME avg@32)"]
    body = []
    for r in figures["rows"]:
        reach = "-" if r["steps_to_target"] is None else f"{r['steps_to_target']:.0f}"
        responses = "-" if r["responses_to_target"] is None else f"{r['responses_to_target']:.0f}"
        if seeds > 1:
            reach += f" ({r['seeds_reaching_target']}/{seeds})"
        body.append([r["name"], f"{r['val_acc_mean']:.3f} ± {r['val_acc_std']:.3f}", reach, responses,
                     f"{r['final_entropy']:.3f}", f"{r['final_response_length']:.1f}",
                     f"{100 * r['truncated_frac']:.1f}%", r["paper_aime_avg32"]])
    return headers, body


def markdown_table(headers: list[str], body: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def write_plots(results: dict[str, list[list[dict]]], out_dir: Path) -> list[Path]:
    """accuracy / entropy / response length against steps, one line per row (mean over seeds, min-max band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out_dir.mkdir(parents=True, exist_ok=True)
    panels = {
        "accuracy.png": ("held-out validation accuracy", _val_curve),
        "entropy.png": ("actor/entropy (trained responses)", lambda r: _series(r, "actor/entropy")),
        "response_length.png": ("response_length/mean (tokens)", lambda r: _series(r, "response_length/mean")),
    }
    written = []
    for file_name, (title, curve) in panels.items():
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, seeds in results.items():
            curves = [dict(curve(r)) for r in seeds]
            steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
            if not steps:
                continue
            values = np.array([[c[s] for s in steps] for c in curves])  # [seeds, steps]
            line, = ax.plot(steps, values.mean(0), label=name, marker="o" if file_name == "accuracy.png" else None,
                            markersize=3)
            if len(curves) > 1:
                ax.fill_between(steps, values.min(0), values.max(0), color=line.get_color(), alpha=0.12)
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / file_name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write_report(out: Path, figures: dict, headers, body, command: str, plots: list[Path]) -> Path:
    text = [
        "# DAPO ablation on the embedded engine",
        "",
        f"Command: `{command}`",
        "",
        f"Start accuracy (step 0, held-out): {figures['start_acc']:.3f}. Target accuracy: {figures['target']:.3f}.",
        "",
        markdown_table(headers, body),
        "",
        *(f"![{p.stem}]({p.relative_to(out)})" for p in plots),
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(text))
    return path


# ---------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.split("\n\n")[0], repeats=False)
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run (verl's names)")
    p.add_argument("--quick", action="store_true", help="2 seeds, 8 steps, 64 validation problems: about 3 minutes")
    p.add_argument("--seeds", type=int, default=None, help="seeds per row (default 3; --quick 2)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs at a time (one torch thread each)")
    p.add_argument("--out", type=Path, default=Path("bench/results/ablation"), help="run directories and report")
    p.add_argument("--target", type=float, default=None,
                   help="target validation accuracy (default: start + 0.8 x the best row's gain)")
    p.add_argument("--fresh", action="store_true", help="delete earlier runs under --out instead of reusing them")
    p.add_argument("--print-commands", action="store_true", help="print each run's dapo-train command and exit")
    args = p.parse_args(argv)

    preset = PRESETS["quick" if args.quick else "default"]
    seeds = args.seeds or preset["seeds"]
    if seeds < 1:
        p.error("--seeds must be >= 1")
    extra = [*preset["overrides"], *args.overrides]
    out = args.out.resolve()
    try:
        cfg = _compose(extra)  # fails early on a misspelt key, before anything runs
    except Exception as err:  # noqa: BLE001 - Hydra's and OmegaConf's errors name the key
        print(f"bench.ablation: error: {str(err).strip()}", file=sys.stderr)
        return 2
    from omegaconf import OmegaConf

    steps = int(OmegaConf.select(cfg, "trainer.total_training_steps"))
    train_batch_size = int(cfg.data.train_batch_size)
    n = int(cfg.actor_rollout_ref.rollout.n)

    plan = []
    for name, row in rows():
        for seed in range(seeds):
            run_dir = out / slug(name) / f"seed{seed}"
            plan.append((name, seed, run_overrides(row, seed, run_dir, extra), run_dir))
    if args.print_commands:
        for name, seed, overrides, _ in plan:
            print(f"# {name}, seed {seed}\ndapo-train --config-name {CONFIG_NAME} {' '.join(overrides)}")
        return 0
    if args.fresh and out.exists():
        shutil.rmtree(out)

    print(f"ablation: {len(rows())} rows x {seeds} seeds x {steps} steps, {args.jobs} at a time, under {out}")
    prepare_start_model(extra)
    failures = run_all(plan, args.jobs)
    if failures:
        print("runs failed:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1

    results = {name: [] for name, _ in rows()}
    for name, _, _, run_dir in plan:
        results[name].append(_records(run_dir))
    figures = summarise(results, args.target, train_batch_size, n)
    headers, body = table(figures, seeds, steps)
    print(f"\nstart accuracy {figures['start_acc']:.3f}, target {figures['target']:.3f}")
    print_table(headers, body)
    plots = write_plots(results, out / "plots")
    command = "python -m bench.ablation " + " ".join(
        [*(["--quick"] if args.quick else []), *([f"--seeds {seeds}"] if args.seeds else []), *args.overrides])
    report = write_report(out, figures, headers, body, command.strip(), plots)
    print(f"report: {report}")
    write_json(args.json, {**figures, "seeds": seeds, "steps": steps, "command": command.strip()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
