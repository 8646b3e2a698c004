"""DAPO policy loss: decoupled clip (Clip-Higher), token-level aggregation, overlong filtering.

Paper (arXiv 2503.14476, Eq. 8), per token t of response i in a group of G:

    r_{i,t} = pi_theta(o_{i,t} | q, o_{i,<t}) / pi_old(o_{i,t} | q, o_{i,<t})
    J = E[ 1 / sum_i |o_i| * sum_i sum_t min( r_{i,t} A_{i,t}, clip(r_{i,t}, 1 - eps_low, 1 + eps_high) A_{i,t} ) ]

with eps_low = 0.2 and eps_high = 0.28 (verl: ``clip_ratio_low`` / ``clip_ratio_high``; TRL: ``epsilon`` /
``epsilon_high``). The loss is the negated objective, so per token

    l = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))

and the normaliser ``1 / sum_i |o_i|`` is the number of response tokens of the whole mini-batch
(``loss_agg_mode="token-mean"``): long chains weigh in proportion to their length (the paper's technique 3).

Deliberate deviations from the paper, all shared with verl 0.9.1 so both engines train the same model:

1. ``log_prob - old_log_prob`` is clamped to [-20, 20] before ``exp`` (numerical safety, as verl does).
2. Dual clip (Ye et al. 2020, verl's ``clip_ratio_c``): for A < 0 the per-token loss is additionally bounded
   by ``-A * clip_ratio_c``, so a token whose ratio exploded cannot dominate the batch. The paper's 32B run
   sets ``clip_ratio_c=10``; verl's default is 3.0. It must be > 1.
3. ``token-mean`` takes its denominator as an argument (``batch_num_tokens``): the token count of the whole
   mini-batch across micro-batches and data-parallel ranks. Summing the losses of micro-batches then yields
   exactly the gradient of the whole mini-batch. Left as None it is the local mask sum (one micro-batch =
   the whole mini-batch).
4. Overlong filtering (the paper's "overlong filtering", Table 1 row 2) is a mask transform applied before the
   loss (``overlong_filter_mask``): truncated responses, i.e. without an end-of-sequence token, carry no
   loss and no token count. verl has no such option.

Every other ``loss_agg_mode`` of verl is offered with verl's formulas, for ablations (``seq-mean-token-mean``
is GRPO's per-sequence average, Table 1's "naive GRPO").

Loss modes (``actor_rollout_ref.actor.policy_loss.loss_mode``, the table :data:`LOSS_MODES`; both engines dispatch
on it, the verl plugin registers from it):

* ``dapo``: :func:`policy_loss`, the above.
* ``vanilla``: :func:`vanilla_policy_loss`, verl's PPO clipped surrogate (``compute_policy_loss_vanilla``): the same
  per-token formula as ``dapo``, with verl's three metrics only. Symmetric (GRPO's clip) when
  ``clip_ratio_low == clip_ratio_high``, as in verl's defaults (0.2 / 0.2) and the ablation's naive row; DAPO's
  Clip-Higher is a config value, not another formula, so ``dapo`` and ``vanilla`` give the same loss on any batch
  with a valid token (upstream's DAPO recipe trains with verl's ``vanilla``).
* ``gspo``: :func:`gspo_policy_loss`, GSPO (Zheng et al. 2025, arXiv 2507.18071, Eq. 5-7): the importance ratio
  of a response is the geometric mean of its token ratios, ``s_i = exp(mean_t log r_{i,t})``, clipped as a whole,
  so every token of a response shares one ratio and one clip decision. As in verl 0.9.1 (``compute_policy_loss_gspo``):
  the gradient flows per token through ``s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]``, ``log s`` is clamped at 10,
  there is no dual clip (``clip_ratio_c`` is unused), and the aggregation is ``loss_agg_mode`` (the GSPO paper's is
  ``seq-mean-token-mean``; with token-mean a long response weighs more). GSPO's clip range is about 1e-3, not 0.2:
  set ``clip_ratio_low`` / ``clip_ratio_high`` for it (the paper: 3e-4 / 4e-4).

On verl, ``vanilla`` and ``gspo`` are verl's own registry entries: the plugin registers only the names verl lacks
(``dapo``), and tests check that verl's ``vanilla`` and ``gspo`` equal these functions on random inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

_LOG_RATIO_CLAMP = 20.0
CLIP_RATIO_C = 3.0  # the dual-clip bound's default (verl's; the paper's 32B run sets 10), used by every default below


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is set; 0 when the mask is empty."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def clipped_surrogate(
    log_prob: torch.Tensor,  # [N, T] log pi_theta of the sampled tokens
    old_log_prob: torch.Tensor,  # [N, T] log pi_old (the rollout policy)
    advantages: torch.Tensor,  # [N, T]
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = CLIP_RATIO_C,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped surrogate loss with decoupled clip and dual clip.

    Returns the loss matrix ``[N, T]`` and boolean/float per-token statistics ``[N, T]``:
    ``clipped`` (the clip bound is active: verl's ``pg_clipfrac``), ``clipped_high`` (A > 0 and
    r > 1 + clip_ratio_high), ``clipped_low`` (A < 0 and r < 1 - clip_ratio_low), ``dual_clipped`` (the dual-clip
    bound is active: verl's ``pg_clipfrac_lower``), ``neg_approx_kl`` (log r) and ``ratio``.
    """
    if clip_ratio_low < 0 or clip_ratio_high < 0:
        raise ValueError(
            f"clip ratios must be >= 0, got clip_ratio_low={clip_ratio_low}, clip_ratio_high={clip_ratio_high}; "
            "DAPO uses actor_rollout_ref.actor.clip_ratio_low=0.2 clip_ratio_high=0.28"
        )
    if clip_ratio_c <= 1.0:
        raise ValueError(
            f"clip_ratio_c must be > 1 (dual clip lower bound), got {clip_ratio_c}; "
            f"set actor_rollout_ref.actor.clip_ratio_c={CLIP_RATIO_C} (verl's default) or 10.0 (the paper's 32B run)"
        )
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)  # [N, T]
    ratio = torch.exp(log_ratio)  # [N, T]

    unclipped = -advantages * ratio  # [N, T]
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)  # [N, T]
    clip_loss = torch.maximum(unclipped, clipped)  # [N, T]  pessimistic bound

    dual_bound = -advantages * clip_ratio_c  # [N, T]
    dual_loss = torch.minimum(dual_bound, clip_loss)  # [N, T]
    negative = advantages < 0  # [N, T]
    loss_mat = torch.where(negative, dual_loss, clip_loss)  # [N, T]

    stats = {
        "clipped": (clipped > unclipped),
        "clipped_high": (advantages > 0) & (ratio > 1.0 + clip_ratio_high),
        "clipped_low": negative & (ratio < 1.0 - clip_ratio_low),
        "dual_clipped": negative & (clip_loss > dual_bound),
        "neg_approx_kl": log_ratio,
        "ratio": ratio,
    }
    return loss_mat, stats


def aggregate_loss(
    loss_mat: torch.Tensor,  # [N, T]
    loss_mask: torch.Tensor,  # [N, T]
    loss_agg_mode: str = "token-mean",
    *,
    batch_num_tokens: float | torch.Tensor | None = None,
    global_batch_size: int | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar with verl's ``agg_loss`` formulas (mask m, D = dp_size).

    ``token-mean``               sum(l m) / batch_num_tokens * D   (batch_num_tokens: whole mini-batch, all ranks)
    ``token-sum``                sum(l m) * D
    ``seq-mean-token-sum``       sum_seq(sum_t l m) / global_batch_size * D
    ``seq-mean-token-mean``      sum_seq(sum_t l m / (sum_t m + 1e-8)) / global_batch_size * D
    ``seq-mean-token-sum-norm``  seq-mean-token-sum / loss_scale_factor (default: the padded length T)

    global_batch_size defaults to the number of sequences with at least one valid token, as in verl.
    One deviation: a batch with no valid token at all gives a zero loss where verl divides 0 by 0.

    ``batch_num_tokens`` and ``global_batch_size`` default to this call's own counts: pass the mini-batch
    totals when the mini-batch is split into micro-batches (gradient accumulation) or data-parallel ranks.
    The factor D undoes the gradient averaging of data-parallel all-reduce, as in verl.
    """
    mask = loss_mask.to(loss_mat.dtype)  # [N, T]
    if loss_agg_mode == "token-mean":
        denom = mask.sum() if batch_num_tokens is None else batch_num_tokens
        if isinstance(denom, torch.Tensor):
            denom = denom.to(loss_mat.dtype)
        # an all-masked mini-batch contributes a zero loss (with a graph), never a division by zero
        return (loss_mat * mask).sum() / torch.clamp(torch.as_tensor(denom, dtype=loss_mat.dtype), min=1.0) * dp_size
    if loss_agg_mode == "token-sum":
        return (loss_mat * mask).sum() * dp_size

    seq_sum = (loss_mat * mask).sum(dim=-1)  # [N]
    # default: the sequences with at least one valid token (a fully masked row, e.g. overlong-filtered, is no sequence)
    n_seq = (mask.sum(dim=-1) > 0).sum().clamp(min=1) if global_batch_size is None else global_batch_size
    if loss_agg_mode == "seq-mean-token-sum":
        return seq_sum.sum() / n_seq * dp_size
    if loss_agg_mode == "seq-mean-token-mean":
        seq_mean = seq_sum / (mask.sum(dim=-1) + 1e-8)  # [N]
        return seq_mean.sum() / n_seq * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = loss_mat.shape[-1] if loss_scale_factor is None else loss_scale_factor
        return seq_sum.sum() / n_seq * dp_size / scale
    raise ValueError(
        f"unknown loss_agg_mode {loss_agg_mode!r}; set actor_rollout_ref.actor.loss_agg_mode to one of "
        f"{', '.join(LOSS_AGG_MODES)} (DAPO: token-mean)"
    )


def truncated_responses(
    response_ids: torch.Tensor,  # [N, T]
    response_mask: torch.Tensor,  # [N, T]
    eos_token_id: int | Sequence[int],
) -> torch.Tensor:
    """``[N]`` bool: True for a response with no end-of-sequence token among its valid tokens (cut at max length)."""
    eos = torch.as_tensor([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
    if eos.numel() == 0:
        raise ValueError("eos_token_id is empty: the tokenizer must define an end-of-sequence token")
    is_eos = torch.isin(response_ids, eos.to(response_ids.device)) & response_mask.bool()  # [N, T]
    return ~is_eos.any(dim=-1)


def overlong_filter_mask(response_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Overlong filtering: the loss mask ``[N, T]`` with every truncated response (``truncated[N]``) zeroed."""
    return response_mask * (~truncated.bool()).unsqueeze(-1).to(response_mask.dtype)


def policy_loss(
    log_prob: torch.Tensor,  # [N, T]
    old_log_prob: torch.Tensor,  # [N, T]
    advantages: torch.Tensor,  # [N, T]
    response_mask: torch.Tensor,  # [N, T] loss mask (after overlong filtering, if on)
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = CLIP_RATIO_C,
    loss_agg_mode: str = "token-mean",
    batch_num_tokens: float | torch.Tensor | None = None,
    global_batch_size: int | None = None,
    dp_size: int = 1,
    loss_scale_factor: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,  # [N, T] importance weights for off-policy tokens, or None
) -> tuple[torch.Tensor, dict[str, float]]:
    """The DAPO policy-gradient loss of one (micro-)batch and its metrics (verl's names).

    ``rollout_is_weights`` multiplies the per-token loss (verl's rollout correction), e.g. truncated importance
    weights for groups generated by an older policy and carried over by dynamic sampling.
    """
    loss_mat, stats = clipped_surrogate(
        log_prob,
        old_log_prob,
        advantages,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
    )
    if rollout_is_weights is not None:
        loss_mat = loss_mat * rollout_is_weights
    loss = aggregate_loss(
        loss_mat,
        response_mask,
        loss_agg_mode,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        dp_size=dp_size,
        loss_scale_factor=loss_scale_factor,
    )
    with torch.no_grad():
        # one pass for all five masked means: [5, N*T] @ [N*T]
        names = (
            "actor/pg_clipfrac",
            "actor/pg_clipfrac_lower",
            "actor/ppo_kl",
            "dapo/clipfrac_high",
            "dapo/clipfrac_low",
        )
        per_token = (
            torch.stack(
                [
                    stats["clipped"],
                    stats["dual_clipped"],
                    -stats["neg_approx_kl"],
                    stats["clipped_high"],
                    stats["clipped_low"],
                ]
            )
            .reshape(len(names), -1)
            .to(torch.float32)
        )  # [5, N*T]
        flat_mask = response_mask.reshape(-1).to(torch.float32)  # [N*T]
        means = (per_token @ flat_mask) / flat_mask.sum().clamp(min=1.0)  # [5]
        metrics = dict(zip(names, means.tolist()))
    return loss, metrics


VERL_LOSS_METRICS = ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")  # what verl's losses log


def vanilla_policy_loss(*args, **kwargs) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's ``vanilla`` loss: :func:`policy_loss` (PPO's clipped surrogate with dual clip, the same arguments)
    with verl's three metrics only (see the module docstring)."""
    loss, metrics = policy_loss(*args, **kwargs)
    return loss, {name: metrics[name] for name in VERL_LOSS_METRICS}


_GSPO_LOG_RATIO_MAX = 10.0  # verl's clamp of log s_{i,t}


def gspo_policy_loss(
    log_prob: torch.Tensor,  # [N, T]
    old_log_prob: torch.Tensor,  # [N, T]
    advantages: torch.Tensor,  # [N, T]
    response_mask: torch.Tensor,  # [N, T]
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.28,
    clip_ratio_c: float = CLIP_RATIO_C,  # unused: GSPO has no dual clip (kept for the common signature)
    rollout_is_weights: torch.Tensor | None = None,  # [N, T] or None
    **aggregation,  # loss_agg_mode, batch_num_tokens, global_batch_size, dp_size, loss_scale_factor: aggregate_loss's
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO's sequence-level clipped surrogate (arXiv 2507.18071; see the module docstring for the formula)."""
    mask = response_mask.to(log_prob.dtype)  # [N, T]
    log_ratio = log_prob - old_log_prob  # [N, T]
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # [N]  log s_i
    # log s_{i,t} = sg[log s_i] + log pi(y_t) - sg[log pi(y_t)]: value log s_i, gradient that of log pi(y_t)
    log_seq_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)  # [N, T]
    ratio = torch.exp(torch.clamp(log_seq_ratio, max=_GSPO_LOG_RATIO_MAX))  # [N, T]
    unclipped = -advantages * ratio  # [N, T]
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)  # [N, T]
    loss_mat = torch.maximum(unclipped, clipped)  # [N, T]
    if rollout_is_weights is not None:
        loss_mat = loss_mat * rollout_is_weights
    loss = aggregate_loss(loss_mat, response_mask, **aggregation)
    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": masked_mean((clipped > unclipped).float(), response_mask).item(),
            "actor/ppo_kl": masked_mean(-log_ratio.detach(), response_mask).item(),
            "actor/pg_clipfrac_lower": 0.0,  # no dual clip
        }
    return loss, metrics


PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
# actor_rollout_ref.actor.policy_loss.loss_mode -> the loss; every entry takes policy_loss's arguments
LOSS_MODES: dict[str, PolicyLossFn] = {
    "dapo": policy_loss,
    "vanilla": vanilla_policy_loss,
    "gspo": gspo_policy_loss,
}
