"""The launchers' dry runs: the exact command they would run, parsed and composed against verl 0.9.1's schema.

``scripts/train_dapo_qwen32b.sh`` (``ray job submit`` to a cluster) and ``scripts/smoke_gpu.sh`` (one local GPU)
run here with ``DRY_RUN=1`` and ``ray`` off the PATH: they must print the command and exit 0 without it.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.conftest import run_process

pytest.importorskip("verl")
from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import validate_config  # noqa: E402

from recipe.dapo.main_dapo import check_dapo_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MODULE = "recipe.dapo.main_dapo"


def dry_run(script: str, *args: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NNODES", "GPUS_PER_NODE", "MODEL_PATH"))}
    clean |= {"DRY_RUN": "1", "PATH": "/usr/bin:/bin", "HOME": "/home/user", **env}  # no ray on this PATH
    result = run_process(["bash", str(REPO / "scripts" / script), *args], env=clean, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def parse(stdout: str) -> tuple[list[str], list[str]]:
    """(the words before the module, the Hydra overrides after it); checks one override per line."""
    lines = stdout.rstrip("\n").split("\n")
    assert all(line.endswith(" \\") for line in lines[:-1]) and not lines[-1].endswith("\\")
    head = shlex.split(lines[0][: -len(" \\")])
    assert head[-2:] == ["-m", MODULE], head
    overrides = []
    for line in lines[1:]:
        words = shlex.split(line.removesuffix(" \\"))
        assert len(words) == 1, f"one override per line, got {line!r}"
        overrides += words
    return head[:-3], overrides


def compose_overrides(overrides: list[str]):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        return compose("dapo_trainer", overrides=overrides)


def validate(cfg) -> None:
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    check_dapo_config(cfg)


@pytest.fixture(scope="module")
def default_run():
    return parse(dry_run("train_dapo_qwen32b.sh"))


def test_submits_with_ray_job_submit_and_the_plugin_in_the_runtime_env(default_run):
    submit, _ = default_run
    assert submit[:3] == ["ray", "job", "submit"] and submit[-1] == "--"
    options = dict(word.split("=", 1) for word in submit[3:-1])
    assert options["--address"] == "http://localhost:8265"
    assert options["--working-dir"] == str(REPO)
    runtime_env = json.loads(options["--runtime-env-json"])
    assert runtime_env["env_vars"]["VERL_USE_EXTERNAL_MODULES"] == "recipe.dapo.plugin"
    assert ".venv" in runtime_env["excludes"]


def test_default_command_composes_to_the_papers_run(default_run):
    _, overrides = default_run
    assert overrides[0] == "+experiment=qwen2_5_32b"
    cfg = compose_overrides(overrides)
    validate(cfg)
    OmegaConf.resolve(cfg)
    actor, rollout, data = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.data
    # the paper's numbers survive the launcher's overrides
    assert (data.train_batch_size, data.gen_batch_size, rollout.n, actor.ppo_mini_batch_size) == (512, 1536, 16, 32)
    assert (data.max_response_length, cfg.reward.reward_kwargs.overlong_buffer_cfg.len) == (20480, 4096)
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.optim.lr, actor.optim.lr_warmup_steps) == (
        0.2,
        0.28,
        1e-6,
        20,
    )
    assert (rollout.val_kwargs.temperature, rollout.val_kwargs.top_p, rollout.val_kwargs.n) == (1.0, 0.7, 32)
    assert cfg.algorithm.filter_groups.max_num_gen_batches == 10 and cfg.algorithm.filter_groups.metric == "acc"
    # what the launcher sets for the 32B run
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (16, 8)
    assert list(cfg.trainer.logger) == ["console", "wandb"]
    assert actor.fsdp_config.ulysses_sequence_parallel_size == 8 and actor.use_dynamic_bsz
    assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
    assert actor.ppo_max_token_len_per_gpu == rollout.log_prob_max_token_len_per_gpu == 2048 + 20480
    assert (rollout.tensor_model_parallel_size, rollout.gpu_memory_utilization) == (4, 0.8)
    assert (cfg.trainer.save_freq, cfg.trainer.test_freq, cfg.trainer.resume_mode) == (5, 5, "auto")
    assert cfg.trainer.default_local_dir == "/home/user/ckpts/DAPO/DAPO-Qwen2.5-32B"
    assert data.train_files == "/home/user/data/dapo/dapo-math-17k.parquet"
    assert data.val_files == "/home/user/data/dapo/aime-2024.parquet"


def test_environment_and_extra_arguments(tmp_path):
    stdout = dry_run(
        "train_dapo_qwen32b.sh",
        "trainer.total_training_steps=7",
        "data.gen_batch_size=1024",
        NNODES="2",
        GPUS_PER_NODE="4",
        MODEL_PATH="/models/q 32b",
        RAY_ADDRESS="http://head:8265",
        EXPERIMENT_NAME="run-a",
        SP_SIZE="4",
        GEN_TP="2",
        OFFLOAD="false",
        RUNTIME_ENV=str(tmp_path / "env.yaml"),
    )
    submit, overrides = parse(stdout)
    assert "--address=http://head:8265" in submit and f"--runtime-env={tmp_path / 'env.yaml'}" in submit
    assert overrides[-2:] == ["trainer.total_training_steps=7", "data.gen_batch_size=1024"]  # passed through, last
    cfg = compose_overrides(overrides)
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (2, 4)
    assert cfg.actor_rollout_ref.model.path == "/models/q 32b"  # a path with a space survives the quoting
    assert cfg.trainer.experiment_name == "run-a" and cfg.trainer.total_training_steps == 7
    assert cfg.data.gen_batch_size == 1024  # the caller's override wins over the experiment's 1536
    assert cfg.actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size == 4
    assert cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    assert not cfg.actor_rollout_ref.actor.fsdp_config.param_offload


def test_aime_avg32_evaluation_command_composes(default_run):
    # docs/verl.md (Launching): evaluate a checkpoint (or a model with resume_mode=disable) on AIME 2024, avg@32
    _, overrides = default_run
    cfg = compose_overrides(
        overrides
        + [
            "trainer.val_only=true",
            "trainer.val_before_train=true",
            "trainer.resume_mode=resume_path",
            "trainer.resume_from_path=/ckpts/global_step_100",
        ]
    )
    validate(cfg)
    assert cfg.trainer.val_only and cfg.actor_rollout_ref.rollout.val_kwargs.n == 32


def test_smoke_command_composes_for_one_gpu():
    stdout = dry_run("smoke_gpu.sh", "trainer.total_training_steps=1")
    lines = stdout.splitlines()
    assert shlex.split(lines[0].removesuffix(" \\")) == ["python3", "-m", MODULE]
    overrides = [shlex.split(line.removesuffix(" \\"))[0] for line in lines[1:]]
    cfg = compose_overrides(overrides)
    validate(cfg)
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (1, 1)
    assert cfg.trainer.total_training_steps == 1 and cfg.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    assert cfg.data.train_files == "/home/user/data/dapo/dapo-math-17k.parquet"
    assert cfg.algorithm.filter_groups.enable and cfg.dapo.overlong_filter


def test_without_dry_run_it_needs_ray():
    env = {k: v for k, v in os.environ.items()} | {"PATH": "/usr/bin:/bin", "DRY_RUN": "0", "CHECK_PATHS": "0"}
    result = run_process(["bash", str(REPO / "scripts" / "train_dapo_qwen32b.sh")], env=env, timeout=60)
    assert result.returncode == 1 and "'ray' command is not on PATH" in result.stderr
