"""``python -m recipe.dapo.cpu.run [key=value ...]``: the verl engine on a CPU, what ``make verl-cpu`` runs.

1. prepares the model and data: for ``cpu_tiny`` (the default) through :mod:`recipe.dapo.cpu.prepare`; for
   another experiment (``DAPO_VERL_CPU_EXPERIMENT=cpu_smollm2``, what ``make verl-cpu-smollm2`` sets) it checks
   that the experiment's model and data exist (``make model`` prepares them, in the project's main venv);
2. runs ``python -m recipe.dapo.main_dapo +experiment=<experiment> [key=value ...]`` with the environment below;
3. prints where the metrics (verl's ``file`` logger, one JSON line per step), the W&B offline run and the
   checkpoints went (all under ``trainer.default_local_dir``).

Run it with the ``.venv-verl-cpu`` interpreter (``make verl-cpu-setup``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: what verl and vLLM need on a CPU (recipe/dapo/cpu/platform.py explains each)
CPU_ENV = {
    "VERL_PLATFORM": "cpu",  # selects recipe.dapo.cpu.platform.PlatformCPU
    "VERL_ENGINE_DEVICE": "cuda",  # verl's FSDP engine is registered for cuda/npu only; tensors stay on the CPU
    # the platform must be registered before anything asks verl for its platform, so it loads first
    "VERL_USE_EXTERNAL_MODULES": "recipe.dapo.cpu.platform,recipe.dapo.plugin",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per vLLM server
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # vLLM-CPU rejects "all"; nobind leaves placement to the OS
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_DEDUP_LOGS": "0",
}
EXPERIMENT = os.environ.get("DAPO_VERL_CPU_EXPERIMENT", "cpu_tiny")
SEPARATE_ASYNC = "trainer.v1.trainer_mode=dapo_separate_async"


def separate_async_overrides(overrides: list[str]) -> list[str]:
    """What ``dapo_separate_async`` needs on one CPU machine, given before the command line's overrides (which win):
    the rollout as one standalone vLLM server on a logical GPU of its own beside the actor's, the weights sent
    through host memory (:mod:`recipe.dapo.cpu.checkpoint_engine`), and one update of
    ``actor.ppo_mini_batch_size`` prompts per ``parameter_sync_step``, as verl asks."""
    cfg = _composed(overrides)
    train, mini = int(cfg.data.train_batch_size), int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
    actor_gpus = int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)
    return [
        "actor_rollout_ref.hybrid_engine=false",  # no second vLLM server on the actor's logical GPU
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=shm",
        "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.dapo.cpu.checkpoint_engine",
        f"ray_kwargs.ray_init.num_gpus={actor_gpus + 1}",  # logical: the actor's and the rollout server's
        f"trainer.v1.separate_async.parameter_sync_step={max(1, train // mini)}",
    ]


def cpu_env(base: dict | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(CPU_ENV)
    env.setdefault("WANDB_MODE", "offline")
    return env


def _composed(overrides: list[str]):
    from recipe.config import compose

    return compose([f"+experiment={EXPERIMENT}", *overrides], "dapo_trainer")


def run_dir(overrides: list[str]) -> Path:
    """``trainer.default_local_dir`` of the composed run, absolute."""
    return Path(str(_composed(overrides).trainer.default_local_dir)).expanduser().resolve()


def _assets(overrides: list[str]) -> str:
    if EXPERIMENT == "cpu_tiny":
        from recipe.dapo.cpu.prepare import prepare

        return str(prepare(overrides))
    cfg = _composed(overrides)
    wanted = {
        "actor_rollout_ref.model.path": Path(str(cfg.actor_rollout_ref.model.path)) / "config.json",
        "data.train_files": Path(str(cfg.data.train_files)),
        "data.val_files": Path(str(cfg.data.val_files)),
    }
    missing = [f"{key}: {path}" for key, path in wanted.items() if not path.exists()]
    if missing:
        raise SystemExit(
            f"verl-cpu: the {EXPERIMENT} experiment's model or data is missing ({'; '.join(missing)}); "
            "run `make model` first (python -m recipe.smollm2 in the main venv)"
        )
    return str(Path(str(cfg.actor_rollout_ref.model.path)).resolve())


def main(overrides: list[str]) -> int:
    assets = _assets(overrides)
    out = run_dir(overrides)
    out.mkdir(parents=True, exist_ok=True)
    env = cpu_env()
    env.setdefault("VERL_FILE_LOGGER_PATH", str(out / "metrics.jsonl"))
    env.setdefault("WANDB_DIR", str(out))
    print(f"verl-cpu: model and data from {assets}; run directory {out}", flush=True)
    if SEPARATE_ASYNC in overrides:
        added = separate_async_overrides(overrides)
        print(f"verl-cpu: dapo_separate_async on one CPU machine adds {' '.join(added)}", flush=True)
        overrides = [*added, *overrides]
    command = [sys.executable, "-m", "recipe.dapo.main_dapo", f"+experiment={EXPERIMENT}", *overrides]
    child = subprocess.Popen(command, env=env)
    try:
        code = child.wait()
    except KeyboardInterrupt:  # Ctrl-C reaches both processes: main_dapo says it in one line, then exits 130
        code = child.wait()
    if code != 0:
        return code  # main_dapo's own line (stopped, refused, interrupted) stays the last one printed
    print(
        f"verl-cpu: done\n"
        f"  metrics (one JSON line per step): {env['VERL_FILE_LOGGER_PATH']}\n"
        f"  W&B offline run: {env['WANDB_DIR']}/wandb (wandb sync <run dir> to upload)\n"
        f"  checkpoints: {out}/global_step_*",
        flush=True,
    )
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
