"""Attention for the update's forward on a CPU, registered with transformers (``attn_implementation="dapo_cpu"``).

The ``sdpa`` kernels torch ships for CPUs are built for long sequences without a mask: on SmolLM2's update (8
responses of about 100 tokens over their prompts' cached keys, bf16 autocast) the flash kernel's forward and
backward took a fifth of the micro-batch for under 1% of its FLOPs, and the math kernel runs its products in bf16,
which oneDNN rebuilds for every new length. :func:`cpu_attention` computes Hugging Face's ``eager`` attention
(scores, the additive mask, softmax, weighted values) with the products in fp32 (fp64 for fp64 inputs), each group
of query heads that share a key head stacked into one product (no repeated keys), and returns the output in the
input's dtype. The mask is ``eager``'s (a float additive mask, never skipped).

:func:`use_cpu_attention` switches a model to it (a CPU model whose attention is ``sdpa`` or ``eager``). Registered
through transformers' own ``AttentionInterface`` and ``AttentionMaskInterface`` (transformers 5.10), not a patch.
"""

from __future__ import annotations

import torch

NAME = "dapo_cpu"


def cpu_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``query`` ``[B, H, Q, D]``, ``key`` / ``value`` ``[B, KVH, K, D]``, ``attention_mask`` additive ``[B, 1, Q, K]``
    (or ``None``) -> ``([B, Q, H, D], None)``, the contract of transformers' attention functions."""
    b, h, q_len, d = query.shape
    h_kv = key.shape[1]
    rep = h // h_kv  # query heads per key head, consecutive (transformers' repeat_kv)
    dtype = query.dtype
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    scale = d**-0.5 if scaling is None else scaling
    with torch.autocast(query.device.type, enabled=False):
        q = query.to(acc).reshape(b, h_kv, rep * q_len, d)  # [B, KVH, rep*Q, D]
        scores = torch.matmul(q, key.to(acc).transpose(-1, -2)).mul_(scale)  # [B, KVH, rep*Q, K]
        if attention_mask is not None:
            mask = attention_mask[:, :, :, : key.shape[-2]].to(acc)  # [B, 1, Q, K]
            scores = (scores.view(b, h_kv, rep, q_len, -1) + mask.unsqueeze(2)).view(b, h_kv, rep * q_len, -1)
        probs = scores.softmax(dim=-1)
        if dropout > 0.0 and module.training:
            probs = torch.nn.functional.dropout(probs, p=dropout)
        out = torch.matmul(probs, value.to(acc))  # [B, KVH, rep*Q, D]
    return out.view(b, h, q_len, d).transpose(1, 2).to(dtype), None


def register() -> None:
    """Make ``attn_implementation="dapo_cpu"`` known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    AttentionInterface.register(NAME, cpu_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, eager_mask)


def use_cpu_attention(model: torch.nn.Module) -> bool:
    """Switch a CPU model computing ``sdpa`` or ``eager`` attention to :func:`cpu_attention`; True if switched."""
    if next(model.parameters()).device.type != "cpu":
        return False
    if getattr(model.config, "_attn_implementation", None) not in ("sdpa", "eager", NAME):
        return False
    register()
    model.set_attn_implementation(NAME)
    return True
