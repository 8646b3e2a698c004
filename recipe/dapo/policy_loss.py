"""DAPO's policy losses behind verl's policy-loss registry: ``actor_rollout_ref.actor.policy_loss.loss_mode``.

verl's FSDP engine calls the registered function once per micro-batch (``verl/workers/utils/losses.py``,
``ppo_loss``) with padded ``[N, T]`` tensors and writes the totals of the whole mini-batch into
``config.global_batch_info`` first: ``dp_size``, ``batch_num_tokens`` (the loss-mask token count of the mini-batch,
all-reduced over data-parallel ranks before micro-batching), ``global_batch_size`` and ``loss_scale_factor``.

The losses are the table :data:`dapo.loss.LOSS_MODES` (``dapo``, ``vanilla``, ``gspo``), the one the embedded engine
dispatches on. How the table maps onto verl's registry: a name verl does not register (``dapo``) is registered here,
as an adapter that reads the actor config into :class:`dapo.settings.LossSettings` (the same reader the embedded
engine uses) and calls the table's function. A name verl registers itself (``vanilla``, ``gspo``) keeps verl's
function: replacing an upstream entry would change verl for every recipe in the process, and
``tests/dapo/test_loss_modes.py`` checks that verl's ``vanilla`` and ``gspo`` equal the table's on random inputs, so
``loss_mode=vanilla`` or ``gspo`` trains the same loss on both engines either way.

Overlong filtering is not applied here: the loss sees only the mask, and the mini-batch token count is fixed
before micro-batching. The DAPO trainer zeroes the masks of truncated responses in the batch before the actor
update (``recipe/dapo/trainer.py``), so both this loss and ``batch_num_tokens`` exclude them.

Metrics: verl's ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``, ``actor/ppo_kl``, and for ``dapo`` also
``dapo/clipfrac_high``, ``dapo/clipfrac_low`` (logged as ``actor/dapo/...``: verl's trainer prefixes every actor
metric with ``actor/``).
"""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss

from dapo.loss import LOSS_MODES, PolicyLossFn
from dapo.settings import LossSettings

LOSS_MODE = "dapo"


def loss_settings(config: Any) -> LossSettings:
    """The loss settings of verl's actor config (``ActorConfig`` or the ``actor_rollout_ref.actor`` DictConfig)."""
    if config is None:
        raise ValueError(
            "the dapo policy loss needs the actor config (clip ratios, global batch info); verl passes it as "
            "config=actor_rollout_ref.actor, call it through verl.workers.utils.losses.ppo_loss"
        )
    return LossSettings.from_actor(config)


def verl_adapter(loss_fn: PolicyLossFn, name: str) -> PolicyLossFn:
    """verl's policy-loss signature around one function of the table."""

    def compute_policy_loss(
        old_log_prob: torch.Tensor,  # [N, T]
        log_prob: torch.Tensor,  # [N, T]
        advantages: torch.Tensor,  # [N, T]
        response_mask: torch.Tensor,  # [N, T] loss mask (truncated responses already zeroed by the trainer)
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,  # [N, T] or None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        settings = loss_settings(config)
        batch_info = config.global_batch_info or {}
        kwargs = settings.loss_kwargs() | {"loss_agg_mode": loss_agg_mode}  # verl passes the mode it aggregates by
        kwargs["loss_scale_factor"] = batch_info.get("loss_scale_factor")
        return loss_fn(
            log_prob,
            old_log_prob,
            advantages,
            response_mask,
            batch_num_tokens=batch_info.get("batch_num_tokens"),
            global_batch_size=batch_info.get("global_batch_size"),
            dp_size=batch_info.get("dp_size") or 1,
            rollout_is_weights=rollout_is_weights,
            **kwargs,
        )

    compute_policy_loss.__name__ = compute_policy_loss.__qualname__ = f"compute_policy_loss_{name}"
    return compute_policy_loss


# verl's own entries (vanilla, gspo) are left as they are; see the module docstring
REGISTERED_HERE = tuple(name for name in LOSS_MODES if name not in POLICY_LOSS_REGISTRY or name == LOSS_MODE)
for _name in REGISTERED_HERE:
    register_policy_loss(_name)(verl_adapter(LOSS_MODES[_name], _name))
compute_policy_loss_dapo = POLICY_LOSS_REGISTRY[LOSS_MODE]


class LossWithClipEntropy:
    """verl 0.9.1's actor loss (``verl/workers/utils/losses.py``, ``ppo_loss``), unchanged, plus what the embedded
    engine logs of the tokens the clip bounds act on (``dapo.metrics.clipped_token_entropy``): verl's policy-loss
    signature carries no entropy, but its actor loss gets the update forward's per-token entropy
    (``actor_rollout_ref.actor.calculate_entropy=true``, configs/dapo_trainer.yaml). Set on the actor's workers through
    their ``set_loss_fn``, the method verl registers for replacing the loss (``verl/workers/engine_workers.py``);
    the DAPO trainer does it before training (``recipe/dapo/trainer.py``). Logs sums and counts (summed over
    micro-batches and ranks); the trainer turns them into ``dapo/entropy/clipped_{high,low}``."""

    SUM, COUNT = "dapo/entropy_sum/clipped_", "dapo/entropy_count/clipped_"

    def __init__(self, actor_config) -> None:
        self.actor_config = (
            actor_config  # actor_rollout_ref.actor (a DictConfig), made verl's ActorConfig in the worker
        )
        self._config = None

    def __call__(self, model_output, data, dp_group=None):
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.metric import AggregationType, Metric
        from verl.workers.utils.losses import ppo_loss
        from verl.workers.utils.padding import no_padding_2_padding

        from dapo.metrics import clipped_token_entropy

        if self._config is None:
            self._config = omega_conf_to_dataclass(self.actor_config)
        loss, metrics = ppo_loss(self._config, model_output, data, dp_group)
        entropy = model_output.get("entropy", None)
        if entropy is None or "old_log_probs" not in data.keys():
            return loss, metrics
        settings = loss_settings(self._config)
        padded = data.select("old_log_probs", "advantages", "response_mask").to_padded_tensor()
        sums = clipped_token_entropy(
            no_padding_2_padding(entropy, data).detach(),
            no_padding_2_padding(model_output["log_probs"], data).detach(),
            padded["old_log_probs"],
            padded["advantages"],
            padded["response_mask"].bool(),
            clip_ratio_low=settings.clip_ratio_low,
            clip_ratio_high=settings.clip_ratio_high,
        )
        for name in ("high", "low"):
            total, count = sums[name]
            metrics[self.SUM + name] = Metric(value=total, aggregation=AggregationType.SUM)
            metrics[self.COUNT + name] = Metric(value=count, aggregation=AggregationType.SUM)
        return loss, metrics


def clip_entropy_metrics(metrics: dict) -> dict[str, float]:
    """``dapo/entropy/clipped_{high,low}`` from :class:`LossWithClipEntropy`'s sums and counts in a step's metrics
    (verl prefixes the actor's metrics with ``actor/``); the sums and counts are removed from ``metrics``."""
    out = {}
    for name in ("high", "low"):
        total = metrics.pop(f"actor/{LossWithClipEntropy.SUM}{name}", None)
        count = metrics.pop(f"actor/{LossWithClipEntropy.COUNT}{name}", None)
        if total is not None and count is not None:
            out[f"dapo/entropy/clipped_{name}"] = float(total) / float(count) if count else float("nan")
    return out
