"""Every config composes against verl 0.9.1's real schema, instantiates into verl's dataclasses, passes verl's
validate_config and ours, and the 32B experiment holds the paper's numbers (arXiv 2503.14476 §4.1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

pytest.importorskip("verl")
from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass, validate_config  # noqa: E402

from recipe.dapo.main_dapo import check_dapo_config  # noqa: E402
from recipe.dapo.sampler import DynamicSamplingSettings  # noqa: E402

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


def compose_dapo(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("dapo_trainer", overrides=list(overrides))


def test_experiment_configs_exist():
    assert {"qwen2_5_32b", "qwen2_5_math_7b", "qwen2_5_1_5b_1gpu", "smoke_1gpu"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("experiment", [None, *EXPERIMENTS])
def test_config_composes_instantiates_and_validates(experiment):
    # the base alone sets no batch layout: verl's actor needs micro-batch sizes or dynamic batching
    cfg = compose_dapo(f"+experiment={experiment}" if experiment else "actor_rollout_ref.actor.use_dynamic_bsz=true")
    # verl instantiates these sub-trees into dataclasses (_target_): an unknown key would fail here
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
    algorithm = omega_conf_to_dataclass(cfg.algorithm)
    assert algorithm.filter_groups.metric == "acc"
    assert actor.policy_loss.loss_mode == "dapo"
    if experiment:
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        assert not need_reference_policy(cfg) and not need_critic(cfg)  # no KL: no reference model; GRPO: no critic
    check_dapo_config(cfg)
    resolved = OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    settings = DynamicSamplingSettings.from_kwargs(resolved["trainer"]["v1"]["sampler"]["sampler_kwargs"])
    assert settings.filter.enable and settings.filter.metric == "acc"
    assert resolved["reward"]["reward_kwargs"]["max_resp_len"] == resolved["data"]["max_response_length"]


@pytest.fixture(scope="module")
def cfg32():
    return compose_dapo("+experiment=qwen2_5_32b")


def variant(cfg, **updates):
    """A copy of a composed config with dotted keys set (``trainer__use_v1`` is ``trainer.use_v1``)."""
    out = cfg.copy()
    for key, value in updates.items():
        OmegaConf.update(out, key.replace("__", "."), value, merge=False)
    return out


def test_qwen32b_holds_the_papers_numbers(cfg32):
    cfg = cfg32.copy()
    OmegaConf.resolve(cfg)
    data, actor, rollout = cfg.data, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    # 512 prompts x 16 responses; mini-batch 32 prompts x 16 = 512 responses -> 512*16 / 512 = 16 updates per step
    assert (data.train_batch_size, rollout.n) == (512, 16)
    assert actor.ppo_mini_batch_size * rollout.n == 512
    assert data.train_batch_size * rollout.n // (actor.ppo_mini_batch_size * rollout.n) == 16
    assert actor.ppo_epochs == 1
    # generation batch 3x the train batch, at most 10 rounds, filtering on accuracy
    assert data.gen_batch_size == 3 * 512
    assert dict(cfg.algorithm.filter_groups) | {"_target_": None} == {
        "_target_": None,
        "enable": True,
        "metric": "acc",
        "max_num_gen_batches": 10,
        "max_inflight_gen_batches": 1,
    }
    # max response 16384 + 4096 cache = 20480; soft punishment over the last 4096 tokens, factor 1
    assert data.max_response_length == 16384 + 4096 == 20480
    assert data.max_prompt_length == 2048
    shaping = cfg.reward.reward_kwargs
    assert (shaping.max_resp_len, shaping.overlong_buffer_cfg.len) == (20480, 4096)
    assert shaping.overlong_buffer_cfg.enable and shaping.overlong_buffer_cfg.penalty_factor == 1.0
    assert cfg.dapo.overlong_filter
    # clip-higher 0.2 / 0.28, token-level loss, the dapo loss through verl's registry
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert (actor.loss_agg_mode, actor.policy_loss.loss_mode) == ("token-mean", "dapo")
    # no KL anywhere, no entropy bonus
    assert not actor.use_kl_loss and actor.kl_loss_coef == 0.0
    assert not cfg.algorithm.use_kl_in_reward and cfg.algorithm.kl_ctrl.kl_coef == 0.0
    assert actor.entropy_coeff == 0
    # AdamW lr 1e-6 constant after a 20-step linear warm-up, weight decay 0.1, grad clip 1.0
    optim = actor.optim
    assert (optim.optimizer, optim.lr, optim.lr_warmup_steps) == ("AdamW", 1e-6, 20)
    assert optim.lr_scheduler_type == "constant"
    assert (optim.weight_decay, optim.clip_grad) == (0.1, 1.0)
    # train temperature 1.0; validation avg@32 at temperature 1.0, top_p 0.7
    assert (rollout.temperature, rollout.top_p) == (1.0, 1.0)
    val = rollout.val_kwargs
    assert (val.temperature, val.top_p, val.n, val.do_sample) == (1.0, 0.7, 32, True)
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.reward.reward_manager.name == "dapo_paper"
    # the 32B run's hardware layout: 16 x 8 GPUs, Ulysses 8, vLLM TP 4, offload, dynamic batch
    assert (cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == (16, 8)
    assert actor.fsdp_config.ulysses_sequence_parallel_size == 8 and rollout.tensor_model_parallel_size == 4
    assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload and actor.use_dynamic_bsz
    assert actor.ppo_max_token_len_per_gpu == data.max_prompt_length + data.max_response_length
    assert cfg.trainer.use_v1 and cfg.trainer.v1.trainer_mode == "dapo"


def test_upstream_overlong_keys_do_not_compose():
    # the upstream 32B script's reward_model.overlong_buffer.* keys: verl 0.9.1 rejects them at composition
    with pytest.raises(ConfigCompositionException):
        compose_dapo("+experiment=qwen2_5_32b", "reward_model.overlong_buffer.enable=True")


def test_verl_default_filter_metric_is_the_shaped_reward(cfg32):
    # verl's own default, which this recipe overrides (and refuses when set back)
    with initialize_config_module("verl.trainer.config", version_base=None):
        base = compose("ppo_trainer", overrides=["actor_rollout_ref.rollout.name=vllm"])
    assert base.algorithm.filter_groups.metric == "reward"
    with pytest.raises(ValueError, match="metric=acc"):
        check_dapo_config(variant(cfg32, algorithm__filter_groups__metric="reward"))


@pytest.mark.parametrize(
    "updates, match",
    [
        ({"trainer__use_v1": False}, "trainer.use_v1=true"),
        ({"trainer__v1__trainer_mode": "colocate_async"}, "trainer_mode=dapo_colocate_async"),
        ({"trainer__v1__trainer_mode": "separate_async"}, "trainer_mode=dapo_separate_async"),
        ({"trainer__v1__trainer_mode": "typo"}, "not a DAPO trainer"),
        # the colocated asynchronous trainer has no rounds, and always carries finished groups to later steps
        ({"trainer__v1__trainer_mode": "dapo_colocate_async"}, "carry_over=true"),
        (
            {
                "trainer__v1__trainer_mode": "dapo_colocate_async",
                "dapo__sampling__carry_over": True,
                "dapo__sampling__adaptive": True,
            },
            "adaptive=true is not available with trainer.v1.trainer_mode=dapo_colocate_async",
        ),
        ({"trainer__v1__trainer_mode": "sync"}, "trainer_mode=dapo"),  # overlong filtering needs the DAPO trainer
        ({"data__gen_batch_size": 256}, r"gen_batch_size >= 512"),
        ({"dapo__sampling__skip_saturated": True}, "skip_saturated=false"),
        ({"trainer__v1__sampler__custom_sampler__path": None}, "custom_sampler.path=pkg://recipe.dapo.sampler"),
    ],
)
def test_check_dapo_config_names_the_fix(cfg32, updates, match):
    with pytest.raises(ValueError, match=match):
        check_dapo_config(variant(cfg32, **updates))


SEPARATE_32B = {  # the 32B job's 512 prompts a step in 16 updates of 32, the rollout on 8 nodes of its own
    "trainer__v1__trainer_mode": "dapo_separate_async",
    "dapo__sampling__carry_over": True,
    "trainer__v1__separate_async__parameter_sync_step": 16,
    "actor_rollout_ref__rollout__nnodes": 8,
    "actor_rollout_ref__rollout__n_gpus_per_node": 8,
    "actor_rollout_ref__rollout__checkpoint_engine__backend": "nccl",
}


@pytest.mark.parametrize(
    "updates, match",
    [
        (
            {"trainer__v1__separate_async__parameter_sync_step": 4},
            "set trainer.v1.separate_async.parameter_sync_step=16",
        ),
        ({"actor_rollout_ref__rollout__nnodes": 0}, "set actor_rollout_ref.rollout.nnodes"),
        ({"actor_rollout_ref__rollout__checkpoint_engine__backend": "naive"}, "checkpoint_engine.backend to nccl"),
        ({"dapo__sampling__carry_over": False}, "carry_over=true"),  # the same contract as dapo_colocate_async
    ],
)
def test_separate_async_names_what_it_needs(cfg32, updates, match):
    with pytest.raises(ValueError, match=match):
        check_dapo_config(variant(cfg32, **{**SEPARATE_32B, **updates}))


def test_separate_async_trainer_is_accepted(cfg32):
    check_dapo_config(variant(cfg32, **SEPARATE_32B))


def test_colocate_async_trainer_is_accepted_with_carry_over(cfg32):
    check_dapo_config(variant(cfg32, trainer__v1__trainer_mode="dapo_colocate_async", dapo__sampling__carry_over=True))


def test_verl_sync_trainer_is_accepted_without_overlong_filter(cfg32):
    check_dapo_config(variant(cfg32, trainer__v1__trainer_mode="sync", dapo__overlong_filter=False))


def test_check_dapo_config_requires_the_plugin_to_reach_workers(cfg32, monkeypatch):
    cfg = cfg32
    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")
    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES", raising=False)
    with pytest.raises(RuntimeError, match="VERL_USE_EXTERNAL_MODULES=recipe.dapo.plugin"):
        check_dapo_config(cfg)
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "other.module,recipe.dapo.plugin")
    check_dapo_config(cfg)
