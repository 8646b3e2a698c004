"""Shared bench plumbing: interleaved timing, a readable table, the --json writer, and the one interval function
(:func:`interval`, the quantile a parameter) every 95% interval in the benches is computed with."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from recipe.common.metrics_file import METRICS_FILE, read_records

REPO = Path(__file__).resolve().parents[1]  # the repository root (bench/ is run from a clone)


def parser(description: str, *, repeats: bool = True) -> argparse.ArgumentParser:
    """Every bench's command line: its docstring as the help (kept as written), ``--json``, and ``--repeats`` for the
    timing benches (``repeats=False`` for those that run training instead of timing calls)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    if repeats:
        p.add_argument("--repeats", type=int, default=15, help="timed repetitions per contender (interleaved)")
    return p


def time_interleaved(contenders: dict[str, Callable[[], object]], repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each contender, run in alternation so machine noise hits all alike."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


# the ops that compute matrix products on a CPU (oneDNN's packed linear included)
PRODUCT_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "mkldnn::_linear_pointwise")


def op_profile(fn: Callable[[], object], top: int = 8) -> dict:
    """Run ``fn`` once under torch's profiler: the seconds its ops took in all (self time, summed), the part in matrix
    products (``PRODUCT_OPS``), and the ``top`` ops by self time (op, seconds, calls). Self time is the calling
    thread's wall time in the op, its intra-op threads included, so the total is close to ``fn``'s wall time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return {
        "ops_s": sum(e.self_cpu_time_total for e in events) / 1e6,
        "products_s": sum(e.self_cpu_time_total for e in events if e.key in PRODUCT_OPS) / 1e6,
        "top": [{"op": e.key, "self_s": e.self_cpu_time_total / 1e6, "calls": e.count} for e in events[:top]],
    }


def print_table(headers: list[str], rows: list[list[object]]) -> None:
    cells = [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))


def write_json(path: Path | None, figures: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
        print(f"figures written to {path}")


# ---------------------------------------------------------------------------------------------------- a run's metrics


def read_steps(path: Path) -> dict[int, dict]:
    """``{step: metrics}`` from a ``metrics.jsonl`` (a run directory or the file itself), either engine's: the
    records of one step merged, later ones winning (:func:`recipe.common.metrics_file.read_records`)."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        raise SystemExit(f"{path} is missing: run the engine first (make train-smollm2 / make verl-cpu-smollm2)")
    steps: dict[int, dict] = {}
    for record in read_records(path):
        steps.setdefault(int(record["step"]), {}).update({k: v for k, v in record.items() if k != "step"})
    return steps


def run_timed(
    command: list[str], env: dict, metrics_path: Path, log_path: Path, *, cwd: Path
) -> tuple[float, float | None]:
    """Run an engine's command to its end, its output in ``log_path``; returns (wall seconds, seconds until the
    first training step's metrics appeared in ``metrics_path``)."""
    start = time.monotonic()
    first_step = None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            if first_step is None and metrics_path.is_file():
                steps = [json.loads(line)["step"] for line in metrics_path.read_text().splitlines() if line.strip()]
                if any(s >= 1 for s in steps):
                    first_step = time.monotonic() - start
            time.sleep(0.5)
    if proc.returncode != 0:
        raise RuntimeError(f"{command[:3]} exited {proc.returncode}; see {log_path}")
    return time.monotonic() - start, first_step


# ---------------------------------------------------------------------------------------------------- intervals

Z_975 = statistics.NormalDist().inv_cdf(0.975)  # 1.95996: the normal's two-sided 95% quantile

# Student's t quantile t_{0.975, df}, for when scipy is not installed (df beyond the table: the next lower entry, a
# slightly wider interval). Values from any t table; tests check them against scipy where it is installed.
T_975 = {
    1: 12.7062,
    2: 4.3027,
    3: 3.1824,
    4: 2.7764,
    5: 2.5706,
    6: 2.4469,
    7: 2.3646,
    8: 2.3060,
    9: 2.2622,
    10: 2.2281,
    11: 2.2010,
    12: 2.1788,
    13: 2.1604,
    14: 2.1448,
    15: 2.1314,
    16: 2.1199,
    17: 2.1098,
    18: 2.1009,
    19: 2.0930,
    20: 2.0860,
    25: 2.0595,
    30: 2.0423,
    40: 2.0211,
    60: 2.0003,
    120: 1.9799,
}


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (two-sided 95%)."""
    try:
        from scipy.stats import t
    except ImportError:
        return T_975[max(k for k in T_975 if k <= df)]
    return float(t.ppf(0.975, df))


def z_quantile_975(df: int | None = None) -> float:
    """The normal's 0.975 quantile, whatever ``df`` (the large-sample choice where many values are averaged)."""
    return Z_975


def interval(estimate: float, se: float, quantile: float) -> tuple[float, float, float]:
    """``estimate`` and its two-sided interval ``estimate ± quantile x se``: the one interval of the benches (a
    95% interval: ``quantile`` :data:`Z_975` or :func:`t_quantile_975` of the degrees of freedom)."""
    return estimate, estimate - quantile * se, estimate + quantile * se


def mean_interval(
    values: list[float], quantile: Callable[[int], float] = t_quantile_975
) -> tuple[float, float | None, float | None]:
    """The mean of ``values`` and its interval, ``quantile(n - 1) x sd / sqrt(n)`` either side (sd with n - 1);
    with fewer than two values the bounds are undefined (None)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return mean, None, None
    return interval(mean, statistics.stdev(values) / math.sqrt(n), quantile(n - 1))
