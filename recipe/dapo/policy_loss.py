"""DAPO's policy loss behind verl's policy-loss registry: ``actor_rollout_ref.actor.policy_loss.loss_mode=dapo``.

verl's FSDP engine calls the registered function once per micro-batch (``verl/workers/utils/losses.py``,
``ppo_loss``) with padded ``[N, T]`` tensors and writes the totals of the whole mini-batch into
``config.global_batch_info`` first: ``dp_size``, ``batch_num_tokens`` (the loss-mask token count of the mini-batch,
all-reduced over data-parallel ranks before micro-batching), ``global_batch_size`` and ``loss_scale_factor``.
The math is :func:`dapo.loss.policy_loss` (decoupled clip, dual clip, token-mean over the mini-batch); this
module only reads verl's config object (``ActorConfig``: ``clip_ratio_low``, ``clip_ratio_high``, ``clip_ratio_c``)
and forwards.

Overlong filtering is not applied here: the loss sees only the mask, and the mini-batch token count is fixed
before micro-batching. The DAPO trainer zeroes the masks of truncated responses in the batch before the actor
update (``recipe/dapo/trainer.py``), so both this loss and ``batch_num_tokens`` exclude them.

Metrics: verl's ``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``, ``actor/ppo_kl``, and ``dapo/clipfrac_high``,
``dapo/clipfrac_low`` (logged as ``actor/dapo/...``: verl's trainer prefixes every actor metric with ``actor/``).
"""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo.core_algos import register_policy_loss

from dapo.loss import policy_loss

LOSS_MODE = "dapo"


@register_policy_loss(LOSS_MODE)
def compute_policy_loss_dapo(
    old_log_prob: torch.Tensor,  # [N, T]
    log_prob: torch.Tensor,  # [N, T]
    advantages: torch.Tensor,  # [N, T]
    response_mask: torch.Tensor,  # [N, T] loss mask (truncated responses already zeroed by the trainer)
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,  # [N, T] or None
) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's policy-loss signature around :func:`dapo.loss.policy_loss`."""
    if config is None:
        raise ValueError(
            "the dapo policy loss needs the actor config (clip ratios, global batch info); verl passes it as "
            "config=actor_rollout_ref.actor, call it through verl.workers.utils.losses.ppo_loss"
        )
    clip_ratio = config.clip_ratio
    clip_ratio_low = config.clip_ratio_low if config.clip_ratio_low is not None else clip_ratio
    clip_ratio_high = config.clip_ratio_high if config.clip_ratio_high is not None else clip_ratio
    batch_info = config.global_batch_info or {}
    return policy_loss(
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=config.get("clip_ratio_c", 3.0),
        loss_agg_mode=loss_agg_mode,
        batch_num_tokens=batch_info.get("batch_num_tokens"),
        global_batch_size=batch_info.get("global_batch_size"),
        dp_size=batch_info.get("dp_size") or 1,
        loss_scale_factor=batch_info.get("loss_scale_factor"),
        rollout_is_weights=rollout_is_weights,
    )
