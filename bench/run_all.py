"""Run every benchmark in one go and collect their JSON figures under bench/results/.

Run: python -m bench.run_all [--only NAME ...]   (make bench does this)
Each benchmark runs its competitor side by side in the same process; see each module's docstring.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

BENCHES = {
    "loss": "bench.bench_loss",
    "scorer": "bench.bench_scorer",
    "sampling": "bench.bench_sampling",
    "step": "bench.bench_step",
    "trl": "bench.bench_trl",
    "ablation": "bench.ablation",  # the longest: about 50 minutes (python -m bench.ablation --quick: a few)
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--only", nargs="*", choices=sorted(BENCHES), help="run just these")
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    args = p.parse_args()
    failed = []
    for name in args.only or BENCHES:
        print(f"\n=== {name} ({BENCHES[name]}) ===", flush=True)
        cmd = [sys.executable, "-m", BENCHES[name], "--json", str(args.out / f"{name}.json")]
        if subprocess.run(cmd).returncode != 0:
            failed.append(name)
    if failed:
        sys.exit(f"benchmarks failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
