"""The rollout's shared pieces: sampling parameters, padding, the response mask, batched log-probabilities.

The engine samples with its own decode loop (:func:`recipe.embedded.decode.sample`), whose greedy tokens the tests
hold to Hugging Face's ``generate`` (``tests/embedded/test_decode.py``, ``hf_generate``; sampled ones are held to a
loop without a cache drawing the same uniforms); :func:`batched_log_probs` runs
:func:`recipe.common.log_probs.sequence_log_probs`, the full-forward reference of the shared-prompt update.

Layout (as verl's): a prompt is left-padded, its response right-padded; the G responses of a prompt are
contiguous rows. ``response_mask`` covers the response up to and including its first end-of-sequence token;
a response without one was cut at ``max_response_length`` (truncated).

Log-probabilities and entropies are taken from ``logits / temperature`` (the rollout temperature), as verl's
actor does, so that the PPO ratio compares the distributions the responses were actually sampled from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from recipe.common.log_probs import sequence_log_probs


@dataclass(frozen=True)
class SamplingParams:
    """What the decode loop samples with (verl's ``rollout.{temperature,top_p,top_k}`` or ``val_kwargs``)."""

    do_sample: bool
    temperature: float
    top_p: float
    top_k: int  # verl's -1 (off) is given to HF as 0


def right_pad(rows: Sequence[torch.Tensor], width: int, value: float | int) -> torch.Tensor:
    """Right-pad ``[n_i, T_i]`` blocks to ``[sum n_i, width]``."""
    out = []
    for block in rows:
        out.append(F.pad(block, (0, width - block.shape[-1]), value=value))
    return torch.cat(out, dim=0)


def response_mask_from_eos(response_ids: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """``[N, T]`` mask of each response up to and including its first EOS token (all of it if none)."""
    is_eos = torch.isin(response_ids, eos_ids).long()  # [N, T]
    eos_before = torch.cumsum(is_eos, dim=-1) - is_eos  # [N, T] EOS tokens strictly before t
    return (eos_before == 0).long()


@torch.no_grad()
def batched_log_probs(
    model,
    prompts,
    response_ids,
    response_mask,
    *,
    temperature,
    pad_id,
    micro_batch_size,
    log_prob_fn=sequence_log_probs,
):
    """``log_prob_fn`` (:func:`sequence_log_probs` or ``decode.shared_prompt_log_probs``) in chunks of
    ``micro_batch_size`` rows, without gradients, on the CPU."""
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, response_ids.shape[0], micro_batch_size):
        rows = slice(start, start + micro_batch_size)
        log_prob, _ = log_prob_fn(
            model, prompts[rows], response_ids[rows], response_mask[rows], temperature=temperature, pad_id=pad_id
        )
        out.append(log_prob.cpu())
    model.train(was_training)
    return torch.cat(out, dim=0)  # [N, T]
