"""The DAPO contract (``dapo.settings``): checked at start with the key and the fix named, the same on both engines.

1. Bad values of the keys the engines read are refused before any expensive work (no warm-up, no Ray, nothing
   written to the run directory), as :class:`dapo.settings.ConfigError` naming the key, without a traceback.
2. The four places the engines used to disagree, each checked through both engines' own code paths: the
   filter metric, the sampling defaults, the end-of-sequence set, the loss mode.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from dapo.loss import LOSS_MODES
from dapo.sampling import BatchFiller
from dapo.settings import (
    FILTER_METRICS,
    SHAPED_REWARD_METRICS,
    ConfigError,
    DapoSettings,
    SamplingSettings,
    eos_token_ids,
)
from recipe import cli
from recipe.config import compose
from recipe.embedded.config import read_config

pytest.importorskip("verl")
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402

from recipe.dapo.main_dapo import check_dapo_config  # noqa: E402
from recipe.dapo.sampler import DynamicSamplingSettings  # noqa: E402

ACTOR = "actor_rollout_ref.actor"
VERL = ["--config-name", "dapo_trainer", "+experiment=smoke_1gpu"]  # dapo.engine absent: verl


def verl_config(*overrides: str):
    return compose(["+experiment=smoke_1gpu", *overrides], "dapo_trainer")


def cli_error(capsys, args: list[str]) -> str:
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("dapo-train: error: ") and "Traceback" not in err
    return err.removeprefix("dapo-train: error: ").strip()


# ---------------------------------------------------------------------------------------------------- 1. at start

# (override, the key the message names, a fragment of the fix)
BAD_VALUES = [
    ("data.train_batch_size=abc", "data.train_batch_size", "must be a positive integer, got 'abc'"),
    ("algorithm.filter_groups.max_num_gen_batches=-2", "algorithm.filter_groups.max_num_gen_batches", "(0 = unbounded"),
    (f"{ACTOR}.clip_ratio_high=-1", f"{ACTOR}.clip_ratio_high", "DAPO uses 0.28"),
    (f"{ACTOR}.clip_ratio_low=1.5", f"{ACTOR}.clip_ratio_low", "must be in [0, 1)"),
    (f"{ACTOR}.clip_ratio_c=1", f"{ACTOR}.clip_ratio_c", "must be > 1"),
    (f"{ACTOR}.policy_loss.loss_mode=dapoo", f"{ACTOR}.policy_loss.loss_mode", "dapo, vanilla, gspo"),
    ("dapo.sampling.safety_margin=-0.5", "dapo.sampling.safety_margin", ">= 0"),
    ("algorithm.filter_groups.metric=seq_reward", "algorithm.filter_groups.metric", "metric=acc"),
]
ENGINE_ONLY = [  # keys outside the DAPO contract, read by the embedded engine's config reader
    (f"{ACTOR}.optim.lr=-1", f"{ACTOR}.optim.lr", "must be > 0"),
    ("trainer.total_training_steps=-1", "trainer.total_training_steps", "must be a positive integer"),
]


@pytest.mark.parametrize("override, key, fix", BAD_VALUES + ENGINE_ONLY, ids=lambda v: str(v)[:40])
def test_bad_value_is_refused_at_start_naming_the_key(tiny_run, tmp_path, capsys, override, key, fix):
    run_dir = tmp_path / "refused"
    args = [*tiny_run(run_dir), override]
    with pytest.raises(ConfigError) as err:  # the exact class, from the config reader the engine runs first
        read_config(compose(args))
    assert key in str(err.value) and fix in str(err.value)
    message = cli_error(capsys, args)  # the real entry point: one line, no traceback, nothing written
    assert message == str(err.value)
    assert not run_dir.exists()


@pytest.mark.parametrize("override, key, fix", BAD_VALUES, ids=lambda v: str(v)[:40])
def test_verl_engine_refuses_the_same_values_with_the_same_message(tiny_run, capsys, override, key, fix):
    embedded = cli_error(capsys, [*tiny_run(), override])
    verl = cli_error(capsys, [*VERL, override])  # before Ray starts: run_dapo checks the contract first
    assert verl == embedded and key in verl


def test_clip_ratio_high_refused_before_validation_runs(tiny_run, tmp_path, capsys):
    # it used to fail inside the loss, after the step-0 validation, with its traceback printed twice
    run_dir = tmp_path / "run"
    err = cli_error(capsys, [*tiny_run(run_dir), f"{ACTOR}.clip_ratio_high=-1", "trainer.val_before_train=true"])
    assert err.count(f"{ACTOR}.clip_ratio_high") == 1 and not run_dir.exists()


# ---------------------------------------------------------------------------------------------------- 2. agreement


@pytest.mark.parametrize("metric", SHAPED_REWARD_METRICS)
def test_shaped_reward_metric_refused_by_both_engines_with_the_reason(tiny_run, metric):
    override = f"algorithm.filter_groups.metric={metric}"
    with pytest.raises(ConfigError, match="length-shaped reward") as embedded:
        read_config(compose([*tiny_run(), override]))
    cfg = verl_config(override)
    with pytest.raises(ConfigError, match="length-shaped reward") as verl_start:
        check_dapo_config(cfg)
    kwargs = OmegaConf.to_container(cfg.trainer.v1.sampler.sampler_kwargs, resolve=True)
    with pytest.raises(ConfigError, match="length-shaped reward") as verl_sampler:  # what verl hands the sampler
        DynamicSamplingSettings.from_kwargs(kwargs)
    assert str(embedded.value) == str(verl_start.value) == str(verl_sampler.value)


@pytest.mark.parametrize("metric", FILTER_METRICS)
def test_filter_metrics_of_the_table_accepted_by_both_engines(tiny_run, metric):
    override = f"algorithm.filter_groups.metric={metric}"
    assert read_config(compose([*tiny_run(), override])).dapo.filter.metric == metric
    cfg = verl_config(override)
    assert check_dapo_config(cfg).filter.metric == metric
    kwargs = OmegaConf.to_container(cfg.trainer.v1.sampler.sampler_kwargs, resolve=True)
    assert DynamicSamplingSettings.from_kwargs(kwargs).filter.metric == metric


def test_sampling_defaults_are_one_set(tiny_run):
    # with the yaml's values removed, each engine's filler takes the defaults: one set, safety_margin 0.25
    delete = [f"~dapo.sampling.{name}" for name in ("safety_margin", "max_carry_age", "saturation_window")]
    settings = read_config(compose([*tiny_run(), *delete])).dapo
    embedded = BatchFiller.from_settings(settings.sampling, settings.filter)
    cfg = verl_config(*delete)
    verl = DynamicSamplingSettings.from_kwargs(
        OmegaConf.to_container(cfg.trainer.v1.sampler.sampler_kwargs, resolve=True)
    ).make_filler()
    for filler in (embedded, verl):
        assert filler.safety_margin == SamplingSettings.safety_margin == 0.25
        assert (filler.max_carry_age, filler.saturation_window) == (1, 2)
    assert BatchFiller(4, 8).safety_margin == 0.25  # the filler's own defaults are the same set


@pytest.fixture(scope="module")
def two_stop_model(tmp_path_factory) -> tuple[Path, int, int]:
    """A tiny Qwen2 saved as a Hugging Face model whose generation config stops on two tokens, only one of which
    is the tokenizer's EOS (as instruct models do: ``<|im_end|>`` and ``<|endoftext|>``)."""
    from recipe.common.task import AdditionTask
    from tests.conftest import tiny_qwen2

    path = tmp_path_factory.mktemp("two-stop-model")
    task = AdditionTask(digits=1, val_size=16)
    model, tokenizer = tiny_qwen2(
        task, hidden_size=16, num_hidden_layers=1, max_position_embeddings=64, corpus_size=200
    )
    second = tokenizer.bos_token_id  # any other token id: the second stop token
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, second]
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, tokenizer.eos_token_id, second


def test_end_of_sequence_set_is_the_same_in_both_engines(tiny_run, two_stop_model):
    from recipe.dapo.trainer import response_eos_ids
    from recipe.embedded.policy import load_policy, policy_tokenizer

    path, eos, second = two_stop_model
    expected = tuple(sorted({eos, second}))
    assert eos_token_ids(eos, [eos, second]) == expected
    c = read_config(compose([*tiny_run(), f"actor_rollout_ref.model.path={path}"]))
    embedded = tuple(load_policy(c, None, policy_tokenizer(c, None)).eos_ids.tolist())
    model_cfg = verl_config(f"actor_rollout_ref.model.path={path}").actor_rollout_ref.model
    verl = response_eos_ids(omega_conf_to_dataclass(model_cfg))  # what DAPOTrainer._init_tokenizer computes
    assert embedded == verl == expected
    # the verl engine used to take tokenizer.eos_token_id alone: a response ending on the second token counted
    # as truncated there and as complete here
    assert verl != (eos,)


def test_loss_mode_changes_the_loss_in_both_engines_alike(tiny_run):
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    import recipe.dapo.policy_loss  # noqa: F401  registers "dapo"

    gen = torch.Generator().manual_seed(0)
    log_prob = torch.randn(6, 5, generator=gen) * 0.3  # [N, T]
    old = log_prob + torch.randn(6, 5, generator=gen) * 0.3
    adv = torch.randn(6, 5, generator=gen)
    mask = torch.ones(6, 5)
    losses = {}
    for mode in LOSS_MODES:
        override = f"{ACTOR}.policy_loss.loss_mode={mode}"
        settings = read_config(compose([*tiny_run(), override])).dapo.loss
        assert settings.loss_mode == mode
        embedded, _ = LOSS_MODES[settings.loss_mode](log_prob, old, adv, mask, **settings.loss_kwargs())
        actor = omega_conf_to_dataclass(verl_config(override).actor_rollout_ref.actor)
        verl, _ = get_policy_loss_fn(actor.policy_loss.loss_mode)(old, log_prob, adv, mask, "token-mean", actor)
        # one float32 formula reached through two configs: assert_close's float32 default (rtol 1.3e-6 = 11 eps32)
        # covers the few roundings a different order of its operations could add
        torch.testing.assert_close(embedded, verl)
        losses[mode] = embedded.item()
    assert losses["gspo"] != pytest.approx(losses["dapo"])  # gspo is another loss on both engines
    assert losses["vanilla"] == pytest.approx(losses["dapo"])  # same surrogate, see dapo.loss's docstring


def test_contract_is_built_from_a_plain_mapping():
    settings = DapoSettings.from_config({"data": {"train_batch_size": 4}})
    assert settings.sampling.gen_batch_size == 4 and settings.loss.loss_mode == "dapo"
    assert settings.loss.clip_ratio_c == 3.0 and not settings.filter.enable and not settings.overlong.filter
