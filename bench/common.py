"""Shared bench plumbing: interleaved timing, a readable table, the --json writer."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path


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
