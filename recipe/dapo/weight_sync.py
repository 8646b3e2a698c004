"""The weight-sync check: the rollout's log-probs of its own sampled tokens against the actor's, every step.

verl's vLLM rollout starts from dummy weights (``actor_rollout_ref.rollout.load_format=dummy``) and receives the
actor's weights before every step, so every token it generates came through the sync. With
``actor_rollout_ref.rollout.calculate_log_probs=true`` (verl's default) the rollout records the log-probability it
sampled each token with (``rollout_log_probs``), and the trainer recomputes it with the actor
(``old_log_probs``, same weights, same temperature). Their gap measures the sync plus the numerics of the two
engines:

* ``dapo/weight_sync/logprob_diff_max``: max over the step's valid response tokens of
  ``|old_log_prob - rollout_log_prob|``;
* ``dapo/weight_sync/logprob_diff_mean``: its mean.

Measured on a CPU (configs/experiment/cpu_tiny.yaml, fp32 actor and fp32 vLLM): about 1e-5 to 1e-4 when the sync
works; a stale rollout (weights not updated after training steps) shows the policy's change instead, orders of
magnitude larger. With a bf16 rollout against an fp32 actor expect about 1e-2 from rounding alone. verl logs the
same comparison on probabilities (``training/rollout_probs_diff_*``); this one is on log-probs, the quantity the
importance ratio is built from.
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


def weight_sync_metrics(batch: KVBatchMeta, version: int | None = None) -> dict[str, float]:
    """:func:`logprob_gap` of a batch in the TransferQueue, once verl has written ``old_log_probs``; with ``version``,
    of the responses sampled entirely by the weights of that update (the trajectory tags ``min_global_steps`` and
    ``max_global_steps``, which verl's partial-rollout client writes) and nothing if there is none."""
    keys = batch.keys
    if version is not None:
        keys = [
            key
            for key, tag in zip(batch.keys, batch.tags)
            if tag.get("min_global_steps") == tag.get("max_global_steps") == version
        ]
        if not keys:
            return {}
    fields = ["old_log_probs", "rollout_log_probs", "response_mask"]
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=fields)
    if "rollout_log_probs" not in data.keys():
        return {}
    padded = {name: data[name].to_padded_tensor(padding=0) if data[name].is_nested else data[name] for name in fields}
    width = padded["response_mask"].shape[-1]
    return logprob_gap(
        padded["old_log_probs"][:, :width], padded["rollout_log_probs"][:, :width], padded["response_mask"]
    )
