"""The verl engine on a CPU against the embedded engine: same tiny task, same settings, one run.

What a user pays for the laptop verl path. Both train the embedded engine's warmed-up tiny Qwen2 (the cached
``tiny.warmup``, shared) on 2-digit addition with the settings of ``configs/experiment/cpu_tiny.yaml``: 4 prompts
per step, rounds of 8, 4 responses each, 2 updates per step, lr 4e-5, 8-token responses, validation mean@2 on 32
held-out problems before training and after the last step, no checkpoints.

  verl      ``.venv-verl-cpu/bin/python -m recipe.dapo.cpu.run`` (verl's V1 trainer, Ray, FSDP2 actor, vLLM-CPU)
  embedded  ``.venv/bin/dapo-train`` (one process, ``embedded.num_threads=1``)

They run one after the other (each has the machine to itself, apart from other users of it). Figures:
  startup_s     process start to the first training step's metrics line (validation before training included)
  step_s        median ``timing_s/step`` over the training steps after the first
  val_acc       validation accuracy (mean@2 over 32 problems) after the last step; before: at step 0
  wall_s        the whole process

--real-model: the same two on SmolLM2-135M-Instruct learning word problems (``make model`` first), each with its
own real-model config, the same settings in both (``configs/experiment/cpu_smollm2.yaml``,
``configs/embedded_smollm2.yaml``: 8 prompts x 4 responses of up to 104 tokens a step, bf16 compute where the CPU
has it), validation mean@1 on 64 held-out problems, every core for both.

Run: python -m bench.compare.engines [--real-model] [--steps N] [--json PATH]
(default 8 steps, about 6 minutes on 2 cores; --real-model: 4 steps, about 15 minutes)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common import REPO, print_table, read_steps, run_timed, write_json

VERL_PY = REPO / ".venv-verl-cpu" / "bin" / "python"
DAPO_TRAIN = REPO / ".venv" / "bin" / "dapo-train"
VAL_KEY_VERL = "val-core/synthetic_addition/acc/mean@2"  # the tiny task's validation metric (bench_sampling_verl)


def shared_overrides(steps: int, real_model: bool = False) -> list[str]:
    if real_model:  # everything else is the two real-model configs' (tests/project/test_contract.py: the same settings)
        return [
            f"trainer.total_training_steps={steps}",
            f"trainer.test_freq={steps}",
            "trainer.val_before_train=true",
            "trainer.save_freq=-1",
            "trainer.resume_mode=disable",
            "data.val_max_samples=64",
        ]
    return [
        "data.train_batch_size=4",
        "data.gen_batch_size=8",
        "data.max_response_length=8",
        "data.val_max_samples=32",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.val_kwargs.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=4e-05",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
        "trainer.val_before_train=true",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
    ]


def verl_run(
    steps: int, out: Path, real_model: bool = False, name: str = "verl", extra: tuple[str, ...] = ()
) -> tuple[dict[int, dict], float, float | None]:
    """One verl CPU run of the shared settings (plus ``extra`` overrides) in ``out/<name>``, its log in
    ``out/<name>.log``: its per-step metrics (verl's ``file`` logger, a step logged twice merged), wall seconds and
    seconds to the first training step."""
    run_dir = out / name
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true", VERL_FILE_LOGGER_PATH=str(run_dir / "m.jsonl"))
    if real_model:
        env["DAPO_VERL_CPU_EXPERIMENT"] = "cpu_smollm2"  # what make verl-cpu-smollm2 sets
    run_dir.mkdir(parents=True)
    cmd = [
        str(VERL_PY),
        "-m",
        "recipe.dapo.cpu.run",
        *shared_overrides(steps, real_model),
        *extra,
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[console,file]",
    ]
    wall, startup = run_timed(cmd, env, run_dir / "m.jsonl", out / f"{name}.log", cwd=REPO)
    return read_steps(run_dir / "m.jsonl"), wall, startup


def run_verl(steps: int, out: Path, real_model: bool = False) -> dict:
    records, wall, startup = verl_run(steps, out, real_model)
    return _figures(records, steps, wall, startup)


def run_embedded(steps: int, out: Path, real_model: bool = False) -> dict:
    run_dir = out / "embedded"
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
    config = ["--config-name", "embedded_smollm2"] if real_model else []
    cmd = [
        str(DAPO_TRAIN),
        *config,
        *shared_overrides(steps, real_model),
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[console]",
        "embedded.progress_bar=false",
    ]
    wall, startup = run_timed(cmd, env, run_dir / "metrics.jsonl", out / "embedded.log", cwd=REPO)
    return _figures(read_steps(run_dir), steps, wall, startup)


def _figures(records: dict[int, dict], steps: int, wall: float, startup: float | None) -> dict:
    val_key = next(k for k in records[0] if k.startswith("val-core/") and "/acc/mean@" in k)  # both engines' name
    step_times = [records[s]["timing_s/step"] for s in range(2, steps + 1) if "timing_s/step" in records.get(s, {})]
    return {
        "startup_s": startup,
        "step_s": statistics.median(step_times) if step_times else None,
        "val_acc_before": records[0].get(val_key),
        "val_acc": records[steps].get(val_key),
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--real-model",
        action="store_true",
        help="SmolLM2-135M-Instruct on word problems (the real-model configs; make model first)",
    )
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 8; --real-model: 4)")
    parser.add_argument("--keep", type=Path, default=None, help="keep both run directories and logs here")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    steps = args.steps or (4 if args.real_model else 8)
    for path, fix in ((VERL_PY, "make verl-cpu-setup"), (DAPO_TRAIN, "make setup")):
        if not path.exists():
            raise SystemExit(f"{path} is missing: run `{fix}`")
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        results = {"verl": run_verl(steps, out, args.real_model), "embedded": run_embedded(steps, out, args.real_model)}
    ratio = {
        k: results["verl"][k] / results["embedded"][k]
        for k in ("startup_s", "step_s", "wall_s")
        if results["verl"][k] and results["embedded"][k]
    }
    rows = [[name, *(f"{r[k]:.3g}" if r[k] is not None else "-" for k in r)] for name, r in results.items()]
    rows.append(["verl / embedded", *(f"{ratio[k]:.3g}" if k in ratio else "" for k in results["verl"])])
    print_table(["engine", *results["verl"]], rows)
    if args.json:
        write_json(args.json, {"steps": steps, "real_model": args.real_model, "results": results, "ratio": ratio})
    return 0


if __name__ == "__main__":
    sys.exit(main())
