"""The contract: every shipped config means the same DAPO on both engines, field by field.

For the base (``dapo_trainer``), the embedded default (``embedded``), each experiment (``configs/experiment``), the
ablation's base and each row of ``bench/experiments/ablation/``, the settings are derived through the code each
engine runs:

* embedded: ``recipe.embedded.config.read_config`` (what ``dapo-train`` runs first), its ``.dapo``; for the verl
  configs, which lack the embedded engine's own keys (``read_config`` refuses them, naming the first), the call
  ``read_config`` makes for ``.dapo``, ``DapoSettings.from_config`` on the composed config;
* verl: ``check_dapo_config`` (what ``main_dapo`` runs before Ray), and the pieces verl's processes build for
  themselves from what verl hands them: the policy loss from verl's instantiated ``ActorConfig`` (actor workers),
  dynamic sampling from the sampler kwargs the yaml interpolates (the trainer's sampler), the overlong shaping from
  the ``dapo_paper`` reward manager (reward workers).

Each must equal the embedded engine's, field by field.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bench.experiments import ablation
from dapo.settings import DapoSettings
from recipe.config import compose
from recipe.embedded.config import read_config

pytest.importorskip("verl")
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402

from recipe.dapo.main_dapo import check_dapo_config  # noqa: E402
from recipe.dapo.policy_loss import loss_settings  # noqa: E402
from recipe.dapo.reward_manager import DAPOPaperRewardManager  # noqa: E402
from recipe.dapo.sampler import DynamicSamplingSettings  # noqa: E402

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


def _configs() -> list[tuple[str, str, list[str]]]:
    out = [
        ("base", "dapo_trainer", []),
        ("embedded", "embedded", []),
        ("ablation", "ablation", []),
        ("embedded_smollm2", "embedded_smollm2", []),
    ]
    out += [(f"experiment={e}", "dapo_trainer", [f"+experiment={e}"]) for e in EXPERIMENTS]
    for name, row in ablation.rows():
        out.append((f"ablation row {name}", "ablation", [f"{k}={ablation.override_value(v)}" for k, v in row.items()]))
    return out


CONFIGS = _configs()


def embedded_settings(cfg) -> DapoSettings:
    if "embedded" in cfg:  # an embedded engine config: what dapo-train derives
        return read_config(cfg).dapo
    return DapoSettings.from_config(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False))


def test_every_shipped_config_is_covered():
    assert len(EXPERIMENTS) >= 4 and len(CONFIGS) == 4 + len(EXPERIMENTS) + len(ablation.rows())


def test_the_real_model_run_is_the_same_on_both_engines():
    """configs/embedded_smollm2.yaml and configs/experiment/cpu_smollm2.yaml: the same DAPO decisions, model, data,
    sizes, budget, sampling and optimizer (the engines' own knobs aside)."""
    embedded = compose([], "embedded_smollm2")
    verl = compose(["+experiment=cpu_smollm2"], "dapo_trainer")
    assert asdict(read_config(embedded).dapo) == asdict(check_dapo_config(verl))
    same = [
        "smollm2.assets",
        "data.train_files",
        "data.val_files",
        "data.val_max_samples",
        "data.max_prompt_length",
        "data.max_response_length",
        "data.train_batch_size",
        "data.gen_batch_size",
        "actor_rollout_ref.model.path",
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "actor_rollout_ref.actor.optim.lr",
        "actor_rollout_ref.actor.optim.lr_warmup_steps",
        "actor_rollout_ref.actor.optim.weight_decay",
        "actor_rollout_ref.rollout.n",
        "actor_rollout_ref.rollout.temperature",
        "actor_rollout_ref.rollout.top_p",
        "actor_rollout_ref.rollout.val_kwargs",
        "reward.reward_kwargs",
        "algorithm.filter_groups",
        "trainer.total_training_steps",
        "trainer.test_freq",
        "trainer.save_freq",
        "data.seed",
    ]
    for key in same:
        ours, theirs = OmegaConf.select(embedded, key), OmegaConf.select(verl, key)
        if OmegaConf.is_config(ours):
            ours, theirs = OmegaConf.to_container(ours, resolve=True), OmegaConf.to_container(theirs, resolve=True)
        assert ours == theirs, key


@pytest.mark.parametrize("name, config_name, overrides", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_both_engines_derive_the_same_settings(name, config_name, overrides):
    cfg = compose(overrides, config_name)
    embedded = embedded_settings(cfg)

    verl_start = check_dapo_config(cfg)
    assert asdict(verl_start) == asdict(embedded)

    # the actor workers: verl instantiates ActorConfig (dynamic batching only so that the base, which sets no
    # micro-batch size, instantiates; it is not a loss field)
    actor_cfg = cfg.actor_rollout_ref.actor.copy()
    if actor_cfg.get("ppo_micro_batch_size_per_gpu") is None:
        actor_cfg.use_dynamic_bsz = True
    assert asdict(loss_settings(omega_conf_to_dataclass(actor_cfg))) == asdict(embedded.loss)

    # the trainer's sampler: the kwargs verl passes it, as the yaml interpolates them
    sampler = DynamicSamplingSettings.from_kwargs(
        OmegaConf.to_container(cfg.trainer.v1.sampler.sampler_kwargs, resolve=True)
    )
    assert asdict(sampler.filter) == asdict(embedded.filter)
    if embedded.filter.enable:  # with the filter off verl samples itself and the filler options are not read
        assert asdict(sampler.sampling) == asdict(embedded.sampling)
        filler = sampler.make_filler()
        assert (filler.safety_margin, filler.max_num_gen_batches) == (
            embedded.sampling.safety_margin,
            embedded.filter.max_num_gen_batches,
        )

    # the reward workers: the dapo_paper manager's overlong shaping (dapo.overlong_filter is the trainer's, read
    # from the whole config in DAPOTrainer.__init__ as in check_dapo_config above)
    shaping = {k: v for k, v in asdict(DAPOPaperRewardManager(cfg, None, None).overlong).items() if k != "filter"}
    assert shaping == {k: v for k, v in asdict(embedded.overlong).items() if k != "filter"}


def test_the_ablation_rows_differ_in_one_setting_each():
    # the same derivation shows each row switching one technique on, on both engines alike
    settings = [read_config(compose(o, c)).dapo for n, c, o in CONFIGS if n.startswith("ablation row")]
    changed = [
        {
            f"{group}.{k}"
            for group in ("loss", "filter", "overlong")
            for k, v in asdict(getattr(b, group)).items()
            if asdict(getattr(a, group))[k] != v
        }
        for a, b in zip(settings, settings[1:])
    ]
    assert changed == [
        {"overlong.filter"},
        {"loss.clip_ratio_high"},
        {"overlong.buffer_enable"},
        {"loss.loss_agg_mode"},
        {"filter.enable"},
    ]
