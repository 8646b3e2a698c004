"""The embedded engine's config: typed frozen sections built from the composed config, no fallback defaults."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from dapo.settings import ConfigError, select, shared_declaration
from recipe.config import compose
from recipe.embedded.config import SECTIONS, EngineConfig, read_config

CONFIG_NAMES = ("embedded", "ablation", "ablation_long", "ablation_chain", "embedded_smollm2")


def _keys() -> list[str]:
    return [f.metadata["key"] for cls in SECTIONS for f in dataclasses.fields(cls)]


def test_every_section_field_names_its_key_and_meaning():
    # the configuration reference is generated from these; a field without them would be undocumented
    assert [f.name for f in dataclasses.fields(EngineConfig)][1:] == [
        "data",
        "rollout",
        "actor",
        "model",
        "algorithm",
        "reward",
        "trainer",
        "embedded",
        "tiny",  # tiny.* and cache_dir: the tiny model and its task, shared with the verl CPU run (configs/tiny.yaml)
        "watchdog",  # dapo.watchdog.*, shared with the verl engine: its reference section is WatchdogSettings'
    ]
    for cls in SECTIONS:
        assert dataclasses.fields(cls) and cls.__dataclass_params__.frozen, cls.__name__
        for f in dataclasses.fields(cls):
            assert f.metadata["help"].strip() and ("." in f.metadata["key"] or f.metadata["key"] == "cache_dir"), (
                f"{cls.__name__}.{f.name}"
            )
    assert len(set(_keys())) == len(_keys())  # one field per key


@pytest.mark.parametrize("config_name", CONFIG_NAMES)
def test_every_key_the_engine_reads_is_declared_by_the_shipped_configs(config_name):
    # no fallback defaults in the engine: each key is in the composed config (verl's YAML under ours), except the
    # two verl itself reads as optional (the deprecated optim.grad_clip is not a field: clip_grad is)
    plain = OmegaConf.to_container(compose([], config_name), resolve=True, throw_on_missing=False)
    optional = {"reward.custom_reward_function.reward_kwargs"}
    missing = [
        key
        for key in _keys()
        if key not in optional and select(plain, key, "MISSING") == "MISSING" and not _declared_null(plain, key)
    ]
    assert missing == []
    c = read_config(compose([], config_name))
    for section in ("data", "rollout", "actor", "model", "algorithm", "reward", "trainer", "embedded", "tiny"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(getattr(c, section), dataclasses.fields(getattr(c, section))[0].name, None)


def _declared_null(plain: dict, key: str) -> bool:
    node = plain
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return node is None


def test_a_key_missing_from_the_config_is_refused_naming_it():
    # shared keys too (rollout.n, data.max_response_length): dapo.settings alone would take its default (16, 512)
    for key in (
        "embedded.num_threads",
        "data.shuffle",
        "trainer.resume_mode",
        "actor_rollout_ref.rollout.n",
        "data.max_response_length",
    ):
        plain = OmegaConf.to_container(compose([]), resolve=True, throw_on_missing=False)
        *parents, name = key.split(".")
        node = plain
        for part in parents:
            node = node[part]
        del node[name]
        with pytest.raises(ConfigError, match=rf"^{key} is missing from the config; compose it from "):
            read_config(plain)


def test_a_shared_setting_is_declared_once():
    """The embedded sections' shared fields carry dapo.settings' own declaration (key and meaning), not a copy."""
    from dapo.settings import EntrySettings, RunSettings, SamplingSettings

    declared = {
        f.metadata["key"]: f.metadata["help"]
        for cls in (RunSettings, SamplingSettings, EntrySettings)
        for f in dataclasses.fields(cls)
        if "key" in f.metadata
    }
    shared = [f for cls in SECTIONS for f in dataclasses.fields(cls) if f.metadata["shared"]]
    assert len(shared) == 21
    for f in shared:
        assert declared[f.metadata["key"]] == f.metadata["help"], f.name
    with pytest.raises(KeyError, match="not declared in dapo.settings"):
        shared_declaration("data.shuffle")


def test_sections_hold_what_the_config_says():
    c = read_config(
        compose(
            [
                "actor_rollout_ref.rollout.n=8",
                "data.seed=null",
                "embedded.seed=3",
                "actor_rollout_ref.actor.optim.lr_warmup_steps=-1",
                "data.train_max_samples=0",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null",
            ]
        )
    )
    assert c.rollout.n == c.dapo.run.n == 8  # shared values come from dapo.settings, checked once
    assert c.data.seed == c.embedded.seed == 3  # data.seed null: the engine's seed
    assert c.actor.lr_warmup_steps == 0 and c.data.train_max_samples == -1  # verl's "none" / "all" spellings
    assert c.rollout.log_prob_micro_batch_size == c.actor.ppo_micro_batch_size  # null: the actor's micro-batch
    assert isinstance(c.trainer.logger, tuple) and isinstance(c.actor.betas, tuple)
