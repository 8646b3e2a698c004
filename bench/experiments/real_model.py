"""The real-model run on both engines, side by side: one figure and one table from the two run directories.

Reads the ``metrics.jsonl`` each engine writes (the embedded engine's flat records, verl's ``file`` logger lines
``{"step", "data"}``; a step logged twice, as verl logs validation after the last step, is merged) and draws, per engine
and against the training step: held-out validation accuracy, entropy, response length, the truncated fraction, the clip
fractions and the kept-group fraction. The table gives validation accuracy at every validated step and the rise from the
first to the last with a 95% interval over the problems (normal approximation of the difference of two proportions over
``n`` problems, one sample each; unpaired, so wider than the paired interval ``bench.experiments.paired_eval`` gives
from the same checkpoints), plus each engine's training time, and checks that each run's offline W&B run holds every
metric name.

Run: python -m bench.experiments.real_model [--run LABEL=DIR ...] [--figure PNG] [--json PATH]
Default: ``embedded=`` and ``verl=`` the run directories of ``make train-smollm2`` and ``make verl-cpu-smollm2``
(``runs/dapo-embedded/smollm2-word-problems``, ``runs/dapo-verl-cpu/smollm2-word-problems``); a default one that
does not exist is left out. ``--run`` names any runs instead (for example one engine at several learning rates).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from bench.common import Z_975, interval, print_table, read_steps, write_json

RUNS = {
    "embedded": Path("runs/dapo-embedded/smollm2-word-problems"),
    "verl": Path("runs/dapo-verl-cpu/smollm2-word-problems"),
}
VAL_PREFIX = "val-core/word_problems/acc/mean@"
PANELS = [  # (title, [(metric, label)])
    ("validation accuracy (held out)", [(VAL_PREFIX, "mean@k")]),
    ("entropy (nats / token)", [("actor/entropy", "")]),
    ("response length (tokens)", [("response_length/mean", "mean"), ("response_length/max", "max")]),
    ("truncated fraction", [("dapo/overlong_frac", "no end token (dapo.loss.truncated_responses)")]),
    ("clip fractions", [("actor/pg_clipfrac", "upper"), ("actor/pg_clipfrac_lower", "lower")]),
    ("kept-group fraction (dynamic sampling)", [("dapo/kept_group_frac", "")]),
]


def series(steps: dict[int, dict], name: str) -> list[tuple[int, float]]:
    """``(step, value)`` of a metric (a name ending in ``@`` matches any k), in step order."""
    out = []
    for step in sorted(steps):
        keys = [k for k in steps[step] if (k.startswith(name) if name.endswith("@") else k == name)]
        values = [steps[step][k] for k in keys if isinstance(steps[step][k], (int, float))]
        if values:
            out.append((step, float(values[0])))
    return out


def rise_interval(first: float, last: float, n: int) -> tuple[float, float, float]:
    """The rise ``last - first`` of two accuracies over ``n`` problems and its 95% interval (normal approximation,
    the two samples taken as independent)."""
    return interval(last - first, math.sqrt(first * (1 - first) / n + last * (1 - last) / n), Z_975)


def missing_from_wandb(run_dir: Path, steps: dict[int, dict]) -> list[str] | None:
    """The metric names of ``metrics.jsonl`` that no offline W&B run file under ``run_dir/wandb`` holds (every
    name is written into the run file's records); ``None`` when there is no W&B run."""
    files = list(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
    if not files:
        return None
    content = b"".join(f.read_bytes() for f in files)
    return sorted({name for record in steps.values() for name in record if name.encode() not in content})


def summary(runs: dict[str, dict[int, dict]], problems: int, dirs: dict[str, Path] | None = None) -> dict:
    out = {}
    for engine, steps in runs.items():
        val = series(steps, VAL_PREFIX)
        train_steps = [s for s in steps if s > 0 and "timing_s/step" in steps[s]]
        entry = {
            "val_acc": {str(s): v for s, v in val},
            "steps": max(train_steps, default=0),
            "train_s": sum(steps[s]["timing_s/step"] for s in train_steps),
            "step_s_median": sorted(steps[s]["timing_s/step"] for s in train_steps)[len(train_steps) // 2]
            if train_steps
            else None,
        }
        if len(val) >= 2:
            rise, low, high = rise_interval(val[0][1], val[-1][1], problems)
            entry.update(rise=rise, rise_low=low, rise_high=high)
        if dirs is not None:
            entry["missing_from_wandb"] = missing_from_wandb(dirs[engine], steps)
        out[engine] = entry
    return out


def figure(runs: dict[str, dict[int, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    colors = dict(zip(runs, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    styles = ["-", "--"]
    for ax, (title, metrics) in zip(axes.flat, PANELS):
        for engine, steps in runs.items():
            for (name, label), style in zip(metrics, styles):
                points = series(steps, name)
                if not points:
                    continue
                xs, ys = zip(*points)
                ax.plot(
                    xs,
                    ys,
                    style,
                    color=colors[engine],
                    marker="o" if name == VAL_PREFIX else None,
                    markersize=4,
                    label=f"{engine} {label}".strip(),
                )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("DAPO on SmolLM2-135M-Instruct, word problems, on a CPU")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"figure written to {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--run",
        action="append",
        default=None,
        metavar="LABEL=DIR",
        help="a run directory and its label (repeatable; default: the two make targets' runs)",
    )
    p.add_argument("--problems", type=int, default=256, help="held-out problems each validation scored (n)")
    p.add_argument("--figure", type=Path, default=None, help="write the six-panel figure here (PNG)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.run:
        dirs = {}
        for spec in args.run:
            label, sep, path = spec.partition("=")
            if not sep or not label or not path:
                raise SystemExit(f"--run takes LABEL=DIR, got {spec!r}")
            dirs[label] = Path(path)
    else:
        dirs = {label: path for label, path in RUNS.items() if (path / "metrics.jsonl").is_file()}
        if not dirs:
            raise SystemExit(
                f"no run found at {', '.join(map(str, RUNS.values()))}: run make train-smollm2 or "
                "make verl-cpu-smollm2 first, or name runs with --run LABEL=DIR"
            )
    runs = {label: read_steps(path) for label, path in dirs.items()}
    figures = summary(runs, args.problems, dirs)
    validated = sorted({int(s) for f in figures.values() for s in f["val_acc"]})
    rows = []
    for engine, f in figures.items():
        rise = "n/a" if "rise" not in f else f"{f['rise']:+.3f} [{f['rise_low']:+.3f}, {f['rise_high']:+.3f}]"
        rows.append(
            [
                engine,
                *(f["val_acc"].get(str(s), float("nan")) for s in validated),
                rise,
                f["steps"],
                f["train_s"] / 60,
                f["step_s_median"] or float("nan"),
            ]
        )
    print_table(
        ["run", *(f"val acc step {s}" for s in validated), "rise (95% CI)", "steps", "train min", "s / step (median)"],
        rows,
    )
    for engine, f in figures.items():
        missing = f["missing_from_wandb"]
        print(
            f"{engine}: "
            + (
                "no offline W&B run"
                if missing is None
                else f"the W&B offline run holds all {len({k for r in runs[engine].values() for k in r})} metric names"
                if not missing
                else f"missing from the W&B run: {missing}"
            )
        )
    if args.figure:
        figure(runs, args.figure)
    write_json(args.json, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
