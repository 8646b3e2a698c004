"""DAPO on verl 0.9.1: ``python -m recipe.dapo.main_dapo [+experiment=NAME] [key=value ...]``.

The run, top to bottom:

1. setup: Hydra composes ``configs/dapo_trainer.yaml`` (DAPO's deltas over verl's ``ppo_trainer``) with an
   experiment (``configs/experiment/*.yaml``) and the command line; :func:`check_dapo_config` checks what is
   DAPO's (errors name the key to set), then verl's own ``validate_config`` checks the rest;
2. training: verl's ``run_ppo`` with verl's V1 ``TaskRunnerV1``, unchanged. It starts Ray (or joins the cluster
   of a ``ray job submit``), the TransferQueue and ``get_trainer_cls(trainer.v1.trainer_mode)``, which is
   :class:`recipe.dapo.trainer.DAPOTrainer` (``trainer_mode=dapo``), and calls its ``fit()``, which is verl's;
3. cleanup: verl's (tracking finished, TransferQueue closed).

DAPO enters through verl's registries, loaded in every Ray worker by ``recipe.dapo.plugin``: the ``dapo`` policy
loss (Clip-Higher, token-level loss), the ``dapo_paper`` reward manager (the paper's scorer, soft overlong
punishment), the ``dapo`` trainer (overlong filtering) and its sampler (dynamic sampling, through
``trainer.v1.sampler.custom_sampler``).

Why the V1 trainer: it is verl 0.9.1's default (``trainer.use_v1=true``); the V0 ``RayPPOTrainer`` path
(``main_ppo_v0.py``) is deprecated and announced for removal. V1 exposes the seams DAPO needs (a trainer
registry, a sampler hook); V0 would need ``fit()`` copied, as the upstream recipe did.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

import hydra
from omegaconf import DictConfig, OmegaConf

import recipe.dapo.plugin  # noqa: F401  registers DAPO in this (driver) process; workers load it through verl

PLUGIN_MODULE = "recipe.dapo.plugin"


def plugin_delivery() -> str | None:
    """How ``recipe.dapo.plugin`` reaches verl's worker processes: an env var, the entry point, or ``None``."""
    modules = [m.strip() for m in os.getenv("VERL_USE_EXTERNAL_MODULES", "").split(",")]
    if PLUGIN_MODULE in modules:
        return "VERL_USE_EXTERNAL_MODULES"
    policy = os.getenv("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower()
    if policy == "none":
        return None
    allowed = None if policy == "auto" else {name.strip() for name in policy.split(",")}
    for ep in entry_points(group="verl.plugins"):
        if ep.value == PLUGIN_MODULE and (allowed is None or ep.name in allowed):
            return "verl.plugins entry point"
    return None


def check_dapo_config(config: DictConfig) -> None:
    """Raise ``ValueError`` naming the key to set when the config cannot train DAPO on verl's V1 trainer."""
    from recipe.dapo.sampler import DynamicSamplingSettings
    from recipe.dapo.trainer import TRAINER_MODE, require_dapo_sampler

    if not config.trainer.use_v1:
        raise ValueError(
            "trainer.use_v1=false selects verl's deprecated V0 RayPPOTrainer, which this recipe does not hook; "
            "set trainer.use_v1=true (verl 0.9.1's default)"
        )
    mode = config.trainer.v1.trainer_mode
    overlong_filter = bool(OmegaConf.select(config, "dapo.overlong_filter", default=False))
    if mode == TRAINER_MODE:
        require_dapo_sampler(config)
    elif mode == "sync":
        if overlong_filter:
            raise ValueError(
                "dapo.overlong_filter=true needs the DAPO trainer, which masks truncated responses out of the loss; "
                f"set trainer.v1.trainer_mode={TRAINER_MODE} (or dapo.overlong_filter=false for verl's sync trainer)"
            )
    else:
        raise ValueError(
            f"trainer.v1.trainer_mode={mode!r}: DAPO's dynamic sampling fills each batch from generation rounds of "
            f"the current policy, so it trains synchronously; set trainer.v1.trainer_mode={TRAINER_MODE}"
        )
    sampler_kwargs = OmegaConf.to_container(config.trainer.v1.sampler.sampler_kwargs, resolve=True)
    if OmegaConf.select(config, "trainer.v1.sampler.custom_sampler.path", default=None):
        DynamicSamplingSettings.from_kwargs(sampler_kwargs)
    if plugin_delivery() is None:
        raise RuntimeError(
            f"verl's worker processes would not load {PLUGIN_MODULE} (no 'verl.plugins' entry point in this "
            "environment, VERL_USE_EXTERNAL_MODULES unset), so they would not know the 'dapo' loss, the "
            "'dapo_paper' reward manager or the 'dapo' trainer. Install the project on every node "
            f"(pip install -e <repo>) or export VERL_USE_EXTERNAL_MODULES={PLUGIN_MODULE} for a local run; "
            "scripts/train_dapo_qwen32b.sh sets it in the Ray job's runtime environment"
        )


def run_dapo(config: DictConfig) -> None:
    """Train with a composed config (the entry point of ``dapo-train dapo.engine=verl`` too)."""
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    # ---- setup ----
    auto_set_device(config)
    check_dapo_config(config)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    # ---- training and cleanup: verl's V1 task runner; the trainer class comes from trainer.v1.trainer_mode ----
    run_ppo(config, task_runner_class=TaskRunnerV1)


@hydra.main(config_path="../../configs", config_name="dapo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run_dapo(config)


if __name__ == "__main__":
    main()
