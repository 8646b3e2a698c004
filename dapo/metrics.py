"""Metric names and reductions shared by both engines.

Names follow verl's where verl logs the same quantity (``actor/entropy``, ``response_length/mean``,
``critic/score/mean``, ...) so dashboards carry over; DAPO-specific ones live under ``dapo/``.
``METRIC_DOCS`` holds one line per metric (what it means, what healthy looks like); the docs site's metrics
reference (``docs/reference/metrics.md``) is generated from it, and nothing else writes those meanings.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import torch

METRIC_DOCS: dict[str, str] = {
    # policy update (averaged over the step's mini-batch updates)
    "actor/pg_loss": "policy-gradient loss of the mini-batches; noisy, no trend expected",
    "actor/entropy": "mean per-token entropy of the policy on the trained responses; should fall slowly, not collapse "
    "toward 0 (Clip-Higher's purpose)",
    "actor/pg_clipfrac": "fraction of tokens whose clip bound is active (zero gradient); a few percent is healthy, "
    ">20% means too many updates per rollout or too high a learning rate",
    "actor/pg_clipfrac_lower": "fraction of tokens where the dual clip (clip_ratio_c, A<0) bounds the loss; near 0",
    "actor/ppo_kl": "mean old_log_prob - log_prob over trained tokens: how far the mini-batch updates moved the "
    "policy; small (<0.01)",
    "actor/grad_norm": "gradient norm before clipping; spikes signal instability",
    "actor/lr": "learning rate after warm-up scheduling",
    "dapo/clipfrac_high": "fraction of tokens with A>0 clipped at 1+clip_ratio_high (Clip-Higher's upper bound acting)",
    "dapo/clipfrac_low": "fraction of tokens with A<0 clipped at 1-clip_ratio_low",
    "dapo/entropy/logp_adv_cov": "covariance over the trained tokens of a token's log-probability (the sampling "
    "policy's) and its advantage (Cui et al. 2025): positive drives the entropy down (likely tokens rewarded), "
    "negative up; a persistently large positive value precedes entropy collapse",
    "dapo/adv/constant_acc_share": "share of the update's advantage mass (|advantage| summed over the trained tokens) "
    "in groups whose responses all have the same accuracy: 0 with dynamic sampling on accuracy (those groups are "
    "dropped); without it, the push of the reward's other terms (the soft overlong punishment), which the division "
    "by the group's std (norm_adv_by_std_in_grpo) scales to full size whatever the answers' correctness",
    "dapo/entropy/clipped_high": "mean entropy of the tokens the high clip bound acts on (A>0, ratio above "
    "1+clip_ratio_high), over the step's updates; NaN when none: the exploratory tokens Clip-Higher lets grow further "
    "than a symmetric clip would",
    "dapo/entropy/clipped_low": "mean entropy of the tokens the low clip bound acts on (A<0, ratio below "
    "1-clip_ratio_low); NaN when none",
    # rollouts
    "response_length/mean": "mean response length in tokens; grows as reasoning lengthens in long-CoT training",
    "response_length/max": "longest response in the batch",
    "response_length/min": "shortest response in the batch",
    "prompt_length/mean": "mean prompt length in tokens (chat template included) over the trained responses",
    "prompt_length/max": "longest trained prompt in tokens; at most data.max_prompt_length",
    "prompt_length/min": "shortest trained prompt in tokens",
    "response_length/clip_ratio": "fraction of responses cut at max_response_length (truncated, no EOS); rising means "
    "the length budget binds",
    "dapo/overlong_frac": "fraction of trained responses that were truncated (masked out of the loss by overlong "
    "filtering when on)",
    "dapo/loss_tokens": "verl engine: response tokens the loss counts after overlong filtering (truncated responses "
    "contribute none)",
    "dapo/weight_sync/logprob_diff_max": "verl engine: max |actor log-prob - rollout log-prob| of the sampled tokens; "
    "~1e-5 in fp32, ~1e-2 bf16 vs fp32; large means stale rollout weights",
    "dapo/weight_sync/logprob_diff_mean": "verl engine: mean of the same gap over the step's response tokens",
    "dapo/partial_rollout/frac": "verl asynchronous modes: fraction of the step's responses whose sampling spanned a "
    "weight update (aborted, kept and resumed on newer weights: partial rollouts)",
    "dapo/partial_rollout/logprob_diff_max": "max |actor log-prob - rollout log-prob| over the tokens of partial "
    "rollouts that ended on the last update's weights: their earlier tokens keep the log-probs of the older weights "
    "that sampled them, so this shows the policy's change, not a sync fault",
    "dapo/partial_rollout/last_token_logprob_diff_max": "the same gap at those responses' last tokens, sampled by the "
    "last update's weights: at the level of dapo/weight_sync/logprob_diff_max when the resume and the sync work",
    "response/repeat_ngram_frac": "fraction of trained responses in which some n-gram of token ids "
    "(n = dapo.metrics.REPEAT_NGRAM) occurs twice or more; low, rising means repetition loops (the paper's Fig. 4)",
    "dapo/overlong_penalty/mean": "mean soft overlong punishment added to the score (0 until responses enter the "
    "buffer)",
    "critic/score/mean": "mean task score (+1 correct / -1 wrong, before length shaping) of the trained responses; "
    "should rise. "
    "verl engine: verl computes it from the reward manager's reward, so it includes the overlong penalty there",
    "critic/rewards/mean": "mean shaped reward (score + overlong penalty) of the trained responses",
    "critic/advantages/mean": "mean advantage over valid tokens; near 0 by construction",
    "critic/advantages/max": "largest advantage in the batch",
    "critic/advantages/min": "smallest advantage in the batch",
    "train/acc/mean": "mean accuracy of every generated response this step, before the group filter; should rise",
    # dynamic sampling (see dapo.sampling)
    "train/num_gen_batches": "generation rounds needed to fill the train batch (1 = no refill needed, 0 = carried "
    "groups filled it)",
    "dapo/kept_group_frac": "fraction of generated groups with mixed accuracy (kept); healthy: well above 1/3 with "
    "verl's 3x round sizing; falling means prompts are saturating; NaN in a step that generated none (served by "
    "carried groups, or asynchronous groups that finished before it)",
    "dapo/filtered_all_correct": "groups dropped this step because every response was correct; rises as the policy "
    "solves the data, and a majority means the data is too easy (harder data, or dapo.sampling.skip_saturated)",
    "dapo/filtered_all_wrong": "groups dropped this step because every response was wrong; should fall over "
    "training, and a majority early on means the data is too hard for the starting model",
    "dapo/surplus_groups": "kept groups beyond the train batch (discarded, or carried when carry-over is on); small "
    "against the train batch means rounds are sized well",
    "dapo/discarded_groups": "surplus groups thrown away; 0 with carry-over",
    "dapo/dropped_stale_groups": "carried groups dropped as older than max_carry_age policy versions; near 0",
    "dapo/saturated_prompts": "distinct prompts currently on an all-correct / all-wrong streak (saturation skip)",
    "dapo/generated_prompts": "prompts generated this step over all rounds (asynchronous modes: groups that finished "
    "this step)",
    "dapo/kept_frac_estimate": "running kept-fraction estimate that sizes adaptive rounds; tracks dapo/kept_group_frac",
    "dapo/carried_groups": "groups carried in from the previous step (carry-over): at most its surplus, off-policy "
    "by up to max_carry_age policy versions",
    "dapo/skipped_prompts": "prompts skipped before generation as saturated (saturation skip)",
    "dapo/generated_per_trained": "responses generated per trained response; 1 is the floor, verl's recipe costs 3 "
    "a round, lower is cheaper",
    # asynchronous training (verl engine, trainer.v1.trainer_mode=dapo_colocate_async / dapo_separate_async)
    "training/off_policy/trajectory_staleness/mean": "verl engine, asynchronous modes: weight updates between the "
    "newest weights that sampled a trained response and the weights being trained, mean over the batch (0 = sampled "
    "by the last update's weights)",
    "training/off_policy/trajectory_staleness/max": "the same, largest in the batch",
    "training/off_policy/trajectory_staleness_worst/max": "weight updates between the oldest weights that sampled part "
    "of a trained response (its first segment) and the weights being trained, largest in the batch",
    "training/off_policy/trajectory_spans/max": "weight versions one trained response was sampled by, largest in the "
    "batch: above 1 when a partial rollout resumed on newer weights",
    "training/off_policy/evicted_samples": "groups dropped as older than trainer.v1.sampler.max_off_policy_threshold "
    "steps since their prompt was submitted (strategy drop); near 0",
    "training/filter_groups/evicted_samples": "verl engine, asynchronous modes: groups evicted by the accuracy filter "
    "this step (each replaced by a new prompt); dapo/filtered_all_correct + dapo/filtered_all_wrong",
    "dapo/weight_transfer/bytes": "verl engine, dapo_separate_async with checkpoint_engine.backend=shm: size of the "
    "weights file sent to the rollout servers after the step",
    "dapo/weight_transfer/write_s": "the same: seconds the actor's rank 0 took to write it (the servers' load is in "
    "timing_s/update_weights)",
    "timing_s/update_weights": "verl engine, asynchronous modes: seconds of the weight update after the step (abort, "
    "transfer, resume); the rollout is stopped for it",
    # timing
    "timing_s/gen": "seconds spent generating this step (all rounds)",
    "timing_s/reward": "seconds scoring responses this step (all rounds; part of timing_s/gen)",
    "timing_s/old_log_prob": "seconds recomputing old log-probs this step (all rounds; part of timing_s/gen; 0 with "
    "algorithm.rollout_correction.bypass_mode=true)",
    "timing_s/update_actor": "seconds spent in the policy update this step",
    "timing_s/step": "seconds for the whole step",
    "timing_s/testing": "seconds spent in validation (steps where it runs)",
    # validation
    "val-core/{data_source}/acc/mean@{k}": "validation accuracy averaged over k samples per problem (AIME: avg@32); "
    "should rise",
    "val-aux/{data_source}/score/mean@{k}": "validation score (+1/-1) averaged over k samples per problem",
    "val-aux/response_length/mean": "mean validation response length",
    "val-aux/{data_source}/overlong_reward/mean@{k}": "verl engine: mean validation overlong penalty; near 0",
    # verl engine only
    "actor/dapo/clipfrac_high": "verl engine: dapo/clipfrac_high under verl's actor/ prefix (tokens with A>0 clipped "
    "at 1+clip_ratio_high); small and non-zero shows Clip-Higher acting",
    "actor/dapo/clipfrac_low": "verl engine: dapo/clipfrac_low under verl's actor/ prefix (tokens with A<0 clipped at "
    "1-clip_ratio_low); small",
    "training/rollout_failure/evicted_samples": "verl engine: groups whose generation failed, dropped; 0",
}


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy ``[N, T]`` of the categorical distributions given by ``logits`` ``[N, T, V]``, in fp32 (fp64
    for fp64 logits)."""
    log_p = torch.log_softmax(logits if logits.dtype == torch.float64 else logits.float(), dim=-1)  # [N, T, V]
    return -(log_p.exp() * log_p).sum(dim=-1)  # [N, T]


def response_length_metrics(response_mask: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    """verl's ``response_length/*`` from a ``[N, T]`` mask and the ``[N]`` truncation flags."""
    length = response_mask.sum(dim=-1).float()  # [N]
    return {
        "response_length/mean": length.mean().item(),
        "response_length/max": length.max().item(),
        "response_length/min": length.min().item(),
        "response_length/clip_ratio": truncated.float().mean().item(),
    }


REPEAT_NGRAM = 4  # n of response/repeat_ngram_frac: a 4-gram of token ids occurring twice or more


def repeat_ngram_frac(response_ids: torch.Tensor, response_mask: torch.Tensor, n: int = REPEAT_NGRAM) -> float:
    """Fraction of responses ``[N, T]`` (right-padded, ``response_mask`` ``[N, T]`` 1 on real tokens) in which some
    n-gram of token ids occurs at least twice, overlapping occurrences included (``a a a a a`` repeats ``a a a a``
    with n = 4). The paper's §3.3 names repetition as the low-quality long pattern that a per-sample loss
    under-penalises; this is its cheapest exact measure. A response shorter than n + 1 tokens cannot repeat.

    Exact, no hashing: the windows of each row are sorted lexicographically (a stable sort on each of the n columns,
    last to first), so equal n-grams end up adjacent."""
    if n < 1:
        raise ValueError(f"repeat_ngram_frac: n must be >= 1, got {n}")
    N, T = response_ids.shape
    if T < n or N == 0:
        return 0.0
    windows = response_ids.long().unfold(1, n, 1).clone()  # [N, W, n], W = T - n + 1
    valid = response_mask.bool().unfold(1, n, 1).all(-1)  # [N, W] windows wholly inside the response
    W = windows.shape[1]
    # a window that reaches into the padding gets a first token of its own (negative, ids are >= 0): it equals none
    sentinel = -1 - torch.arange(W, device=windows.device).expand(N, W)  # [N, W]
    windows[..., 0] = torch.where(valid, windows[..., 0], sentinel)
    order = torch.arange(W, device=windows.device).expand(N, W)  # [N, W]
    for col in reversed(range(n)):  # least significant column first; stable sorts keep the earlier columns' order
        keys = windows.gather(1, order.unsqueeze(-1).expand(N, W, n))[..., col]  # [N, W]
        order = order.gather(1, keys.sort(dim=1, stable=True).indices)
    ordered = windows.gather(1, order.unsqueeze(-1).expand(N, W, n))  # [N, W, n] lexicographic per row
    repeated = (ordered[:, 1:] == ordered[:, :-1]).all(-1).any(-1)  # [N] two equal adjacent windows
    return repeated.float().mean().item()


def mean_metrics(records: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Average each key over a list of metric dicts (keys missing from some records average over the rest)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for record in records:
        for key, value in record.items():
            sums[key] = sums.get(key, 0.0) + float(value)
            counts[key] = counts.get(key, 0) + 1
    return {key: sums[key] / counts[key] for key in sums}


# A policy update that moved the policy this far is a collapse, not learning (healthy: ppo_kl below 0.01, a few
# percent of tokens clipped, a gradient norm of order 1 before clipping)
COLLAPSE_SIGNS = {"actor/ppo_kl": 1.0, "actor/pg_clipfrac": 0.5, "actor/grad_norm": 1e3}


def collapse_signs(metrics: Mapping[str, float]) -> list[str]:
    """The step's update metrics that say the policy collapsed (``COLLAPSE_SIGNS`` exceeded, or not finite), as
    ``"name value"``; empty when the update looks sane. Both engines read it to name the learning rate when the next
    step's dynamic sampling finds no group with signal."""
    signs = []
    for name, limit in COLLAPSE_SIGNS.items():
        value = metrics.get(name)
        if value is None and name == "actor/grad_norm" and name in metrics:
            value = float("nan")  # written as null: every update of the step was skipped
        if value is None:
            continue
        value = float(value)
        if not math.isfinite(value) or abs(value) > limit:
            signs.append(f"{name} {value:.3g}")
    return signs


# ---------------------------------------------------------------------------------------------------- entropy


def logprob_advantage_covariance(
    log_prob: torch.Tensor,  # [N, T] log-probs of the sampled tokens under the policy that sampled them
    advantages: torch.Tensor,  # [N, T]
    mask: torch.Tensor,  # [N, T] the trained tokens
) -> float:
    """``dapo/entropy/logp_adv_cov``: the covariance over the trained tokens of a token's log-probability and its
    advantage, ``mean((lp - mean lp) * (A - mean A))`` (population form). Cui et al. 2025 (arXiv 2505.22617): a
    policy-gradient step changes the policy's entropy by about ``-lr x Cov(log pi(a), A(a))`` over its own samples, so a
    positive covariance (likely tokens rewarded, unlikely ones punished) lowers the entropy and a negative one raises
    it. NaN without trained tokens."""
    m = mask.to(torch.float64)
    count = m.sum()
    if count == 0:
        return math.nan
    lp, adv = log_prob.to(torch.float64), advantages.to(torch.float64)
    lp_mean, adv_mean = (lp * m).sum() / count, (adv * m).sum() / count
    return float((((lp - lp_mean) * (adv - adv_mean)) * m).sum() / count)


def constant_accuracy_share(
    advantages: torch.Tensor,  # [N, T]
    mask: torch.Tensor,  # [N, T] the trained tokens
    acc: torch.Tensor,  # [N] each response's accuracy
    groups: torch.Tensor,  # [N] each response's group (prompt) id
) -> float:
    """``dapo/adv/constant_acc_share``: the share of ``sum |A|`` over the trained tokens that falls in groups whose
    accuracy is the same for every response. There the advantages come from the reward's other terms alone (the soft
    overlong punishment), normalised by the group's std like an accuracy spread. NaN when no trained token has an
    advantage."""
    weight = (advantages.to(torch.float64).abs() * mask.to(torch.float64)).sum(-1)  # [N]
    total = weight.sum()
    if total == 0:
        return math.nan
    _, group = torch.unique(groups, return_inverse=True)  # [N] 0..K-1
    a = acc.to(torch.float64)
    low = torch.full((int(group.max()) + 1,), math.inf, dtype=torch.float64, device=a.device)
    low = low.scatter_reduce(0, group, a, "amin")
    high = torch.full_like(low, -math.inf).scatter_reduce(0, group, a, "amax")
    constant = (low == high)[group]  # [N]
    return float(weight[constant].sum() / total)


def clipped_token_entropy(
    entropy: torch.Tensor,  # [N, T] the policy's entropy at each token (the update's forward)
    log_prob: torch.Tensor,  # [N, T]
    old_log_prob: torch.Tensor,  # [N, T]
    advantages: torch.Tensor,  # [N, T]
    mask: torch.Tensor,  # [N, T]
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
) -> dict[str, tuple[float, float]]:
    """Per bound, ``(sum of entropy, tokens)`` over the tokens that bound clips (A > 0 above ``1 + clip_ratio_high``:
    ``high``; A < 0 below ``1 - clip_ratio_low``: ``low``; the rule is :func:`dapo.loss.clipped_surrogate`'s) and over
    every trained token (``all``): summed over micro-batches by the engine, then ``dapo/entropy/clipped_high`` and
    ``dapo/entropy/clipped_low`` are ``sum / tokens`` (NaN without such tokens). Clip-Higher's claim is about the
    first: the tokens it stops from growing are the low-probability, high-entropy ones."""
    from dapo.loss import clipped_surrogate

    with torch.no_grad():
        _, stats = clipped_surrogate(
            log_prob, old_log_prob, advantages, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high
        )
        m = mask.bool()
        out = {}
        for name, where in (("high", stats["clipped_high"] & m), ("low", stats["clipped_low"] & m), ("all", m)):
            out[name] = (float(entropy[where].to(torch.float64).sum()), float(where.sum()))
    return out


def clipped_entropy_metrics(sums: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """``dapo/entropy/clipped_{high,low}`` from :func:`clipped_token_entropy`'s sums over a step's micro-batches."""
    return {
        f"dapo/entropy/clipped_{name}": (total / count if count else math.nan)
        for name, (total, count) in sums.items()
        if name != "all"
    }


class EntropyWatch:
    """Entropy collapse: ``actor/entropy`` below ``fraction`` of its value ``window`` steps earlier (of the first step,
    before ``window`` steps have passed). :meth:`update` returns the warning the first time it happens (again only after
    the entropy has recovered above the threshold), naming the knobs that counter it; both engines log it."""

    def __init__(self, fraction: float, window: int) -> None:
        self.fraction, self.window = fraction, window
        self.history: list[tuple[int, float]] = []
        self.warned = False

    def update(self, step: int, entropy: float, *, lr: float, clip_ratio_high: float) -> str | None:
        if entropy is None or not math.isfinite(entropy):
            return None
        self.history.append((step, float(entropy)))
        earlier = [(s, e) for s, e in self.history if s <= step - self.window] or self.history[:1]
        ref_step, ref = earlier[-1]
        if ref <= 0 or step == ref_step:
            return None
        collapsed = entropy < self.fraction * ref
        if collapsed and not self.warned:
            self.warned = True
            return (
                f"entropy collapse: actor/entropy fell from {ref:.3g} at step {ref_step} to {entropy:.3g} at step "
                f"{step} (below {self.fraction:g} x, dapo.entropy_watch): the policy stops exploring. Counter it with "
                f"Clip-Higher (raise actor_rollout_ref.actor.clip_ratio_high, now {clip_ratio_high:g}), a lower "
                f"learning rate (actor_rollout_ref.actor.optim.lr, now {lr:g}), or an entropy bonus "
                "(actor_rollout_ref.actor.entropy_coeff); dapo/entropy/logp_adv_cov > 0 is what drives it down"
            )
        if not collapsed:
            self.warned = False
        return None
