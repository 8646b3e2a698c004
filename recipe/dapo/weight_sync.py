"""The weight-sync check: the rollout's log-probs of its own sampled tokens against the actor's, every step.

verl's vLLM rollout starts from dummy weights (``actor_rollout_ref.rollout.load_format=dummy``) and receives the
actor's weights before every step, so every token it generates came through the sync. With
``actor_rollout_ref.rollout.calculate_log_probs=true`` (verl's default) the rollout records the log-probability it
sampled each token with (``rollout_log_probs``), and the trainer recomputes it with the actor
(``old_log_probs``, same weights, same temperature). Their gap, ``|old_log_prob - rollout_log_prob|`` over the
step's valid response tokens, measures the sync plus the numerics of the two engines: its max and mean are
``dapo/weight_sync/logprob_diff_{max,mean}`` (meanings: :data:`dapo.metrics.METRIC_DOCS`).

In the asynchronous modes a response may be a partial rollout: aborted at a weight update, its tokens kept, and
resumed on the new weights (verl's ``FullyAsyncLLMServerClient``), so its tokens come from several policies and
each keeps the log-prob of the one that sampled it. The ``dapo/weight_sync/*`` gap covers the responses sampled
entirely by the last update's weights; ``dapo/partial_rollout/*`` the others (:func:`weight_sync_metrics`).

A working sync gives a gap of rounding size, a stale rollout (weights not updated after training steps) one of the
policy's change, orders of magnitude larger; a bf16 rollout against an fp32 actor about 1e-2 from rounding alone.
The figures measured on a CPU, and the test that breaks the sync on purpose, are in ``docs/verl.md`` ("The
weight-sync check"). verl logs the same comparison on probabilities (``training/rollout_probs_diff_*``); this one is
on log-probs, the quantity the importance ratio is built from.
"""

from __future__ import annotations

import torch
import transfer_queue as tq
from transfer_queue import KVBatchMeta


def logprob_gap(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``dapo/weight_sync/*`` from ``[N, T]`` actor and rollout log-probs and the ``[N, T]`` response mask."""
    valid = mask.bool()  # [N, T]
    if not valid.any():
        return {}
    gap = (old_log_probs.float() - rollout_log_probs.float()).abs()[valid]  # [valid tokens]
    return {
        "dapo/weight_sync/logprob_diff_max": gap.max().item(),
        "dapo/weight_sync/logprob_diff_mean": gap.mean().item(),
    }


def partial_rollout_gap(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """``dapo/partial_rollout/*_logprob_diff_max`` from ``[N, T]`` log-probs and mask of responses whose sampling
    began on older weights and ended on the actor's (a partial rollout resumed after a weight update)."""
    valid = mask.bool()  # [N, T]
    ends = valid.any(dim=-1)  # [N] responses with a token in the loss
    if not ends.any():
        return {}
    gap = (old_log_probs.float() - rollout_log_probs.float()).abs()  # [N, T]
    last = valid.shape[-1] - 1 - valid.flip(-1).int().argmax(dim=-1)  # [N] index of each last valid token
    return {
        "dapo/partial_rollout/logprob_diff_max": gap[valid].max().item(),
        "dapo/partial_rollout/last_token_logprob_diff_max": gap[ends, last[ends]].max().item(),
    }


def weight_sync_metrics(batch: KVBatchMeta, version: int | None = None) -> dict[str, float]:
    """:func:`logprob_gap` of a batch in the TransferQueue, once verl has written ``old_log_probs``.

    With ``version`` (the asynchronous modes, the weights of the last update): the gap of the responses sampled
    entirely by those weights (the trajectory tags ``min_global_steps`` and ``max_global_steps``, which verl's
    partial-rollout client writes), and the partial rollouts': ``dapo/partial_rollout/frac``, the fraction of the
    batch's responses whose sampling spanned a weight update, and for those that ended on ``version``
    :func:`partial_rollout_gap`. verl keeps each segment's log-probs from the weights that sampled it, so a partial
    rollout's last token is at the sync's gap and its earlier tokens show the policy's change since they were
    sampled."""
    tags = dict(zip(batch.keys, batch.tags))
    metrics: dict[str, float] = {}
    if version is None:
        whole, partial = list(batch.keys), []
    else:
        whole = [
            key for key, tag in tags.items() if tag.get("min_global_steps") == tag.get("max_global_steps") == version
        ]
        spans = [key for key, tag in tags.items() if tag.get("min_global_steps") != tag.get("max_global_steps")]
        partial = [key for key in spans if tags[key].get("max_global_steps") == version]
        if tags:
            metrics["dapo/partial_rollout/frac"] = len(spans) / len(tags)
    keys = whole + partial  # one fetch for both
    if not keys:
        return metrics
    fields = ["old_log_probs", "rollout_log_probs", "response_mask"]
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=fields)
    if "rollout_log_probs" not in data.keys():
        return metrics
    padded = {n: data[n].to_padded_tensor(padding=0) if data[n].is_nested else data[n] for n in fields}
    width = padded["response_mask"].shape[-1]
    rows = (padded["old_log_probs"][:, :width], padded["rollout_log_probs"][:, :width], padded["response_mask"])
    n = len(whole)  # the rows come in the order of the keys: the whole responses, then the partial ones
    if whole:
        metrics.update(logprob_gap(*(t[:n] for t in rows)))
    if partial:
        metrics.update(partial_rollout_gap(*(t[n:] for t in rows)))
    return metrics
