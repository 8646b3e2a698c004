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

from dataclasses import dataclass

import torch

NAME = "dapo_cpu"


def cpu_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, packed_rows=None, **kwargs):
    """``query`` ``[B, H, Q, D]``, ``key`` / ``value`` ``[B, KVH, K, D]``, ``attention_mask`` additive ``[B, 1, Q, K]``
    (or ``None``) -> ``([B, Q, H, D], None)``, the contract of transformers' attention functions. ``packed_rows``
    (a :class:`PackedRows`, passed through the model's forward): the rows are packed groups, computed by
    :func:`packed_attention` and the mask ignored."""
    b, h, q_len, d = query.shape
    h_kv = key.shape[1]
    rep = h // h_kv  # query heads per key head, consecutive (transformers' repeat_kv)
    dtype = query.dtype
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    scale = d**-0.5 if scaling is None else scaling
    if packed_rows is not None:
        with torch.autocast(query.device.type, enabled=False):
            out = packed_attention(query.to(acc), key.to(acc), value.to(acc), packed_rows, scale)
        return out.to(dtype), None
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


@dataclass(frozen=True)
class PackedRows:
    """The layout of packed rows ``[prompt | response 1 | ... | response n | pad]``, one row per distinct prompt
    (``decode.shared_prompt_log_probs``' packed layout), as index tensors for :func:`packed_attention`."""

    prompt_len: torch.Tensor  # [U]
    row: torch.Tensor  # [N] the row of each response
    cols: torch.Tensor  # [N, F] the columns of each response's fed tokens, padded with column 0 (masked out)
    fed: torch.Tensor  # [N, F] bool: a real fed token

    @classmethod
    def build(cls, prompt_len: torch.Tensor, row: torch.Tensor, start: torch.Tensor, fed: torch.Tensor) -> PackedRows:
        """``prompt_len`` ``[U]``; per response: its ``row``, ``start`` column and ``fed`` token count ``[N]``."""
        width = max(int(fed.max()), 1) if fed.numel() else 1
        t = torch.arange(width, device=fed.device)
        real = t < fed.unsqueeze(1)  # [N, F]
        cols = torch.where(real, start.unsqueeze(1) + t, 0)  # a response of one token feeds none: all padding
        return cls(prompt_len, row, cols, real)


def packed_attention(query, key, value, rows: PackedRows, scale: float) -> torch.Tensor:
    """Attention over packed rows with each response seeing its prompt and its own earlier tokens only, computed as
    the prompts' causal attention plus each response's attention over its prompt and itself (the work of the
    KV-cache layout, not the square of the packed row's length). ``query`` ``[U, H, S, D]`` and ``key`` / ``value``
    ``[U, KVH, S, D]`` in the accumulation dtype -> ``[U, S, H, D]`` (pad columns 0)."""
    u, h, s, d = query.shape
    h_kv = key.shape[1]
    rep = h // h_kv
    neg = torch.finfo(query.dtype).min
    p = int(rows.prompt_len.max())
    index = torch.arange(p, device=query.device)
    prompt_key = index.unsqueeze(0) < rows.prompt_len.unsqueeze(1)  # [U, P] a real prompt token
    # the prompts: causal over their own tokens
    qp = query[:, :, :p].reshape(u, h_kv, rep * p, d)
    kp, vp = key[:, :, :p], value[:, :, :p]  # [U, KVH, P, D]
    seen = (index.unsqueeze(1) >= index.unsqueeze(0)) & prompt_key[:, None, :]  # [U, P(query), P(key)]
    seen |= torch.eye(p, dtype=torch.bool, device=query.device)  # a pad query sees itself (no empty row)
    scores = (qp @ kp.mT).mul_(scale).view(u, h_kv, rep, p, p).masked_fill_(~seen[:, None, None], neg)
    out_p = (scores.softmax(-1).view(u, h_kv, rep * p, p) @ vp).view(u, h, p, d)  # [U, H, P, D]
    # the responses: their prompt's keys, then their own (causal)
    n, f = rows.cols.shape
    q_r = query.transpose(1, 2)[rows.row.unsqueeze(1), rows.cols]  # [N, F, H, D]
    k_r = key.transpose(1, 2)[rows.row.unsqueeze(1), rows.cols]  # [N, F, KVH, D]
    v_r = value.transpose(1, 2)[rows.row.unsqueeze(1), rows.cols]
    q_r = q_r.permute(0, 2, 1, 3).reshape(n, h_kv, rep * f, d)  # [N, KVH, rep*F, D]
    k_r, v_r = k_r.permute(0, 2, 1, 3), v_r.permute(0, 2, 1, 3)  # [N, KVH, F, D]
    kp_r, vp_r = kp[rows.row], vp[rows.row]  # [N, KVH, P, D] the prompt's, once per response
    to_prompt = (q_r @ kp_r.mT).mul_(scale).view(n, h_kv, rep, f, p)
    to_prompt.masked_fill_(~prompt_key[rows.row][:, None, None, None], neg)
    t = torch.arange(f, device=query.device)
    own_seen = (t.unsqueeze(1) >= t.unsqueeze(0)) & rows.fed[:, None, :]  # [N, F(query), F(key)]
    own_seen |= torch.eye(f, dtype=torch.bool, device=query.device)
    to_own = (q_r @ k_r.mT).mul_(scale).view(n, h_kv, rep, f, f).masked_fill_(~own_seen[:, None, None], neg)
    probs = torch.cat([to_prompt, to_own], dim=-1).softmax(-1).view(n, h_kv, rep * f, p + f)
    out_r = probs[..., :p] @ vp_r + probs[..., p:] @ v_r  # [N, KVH, rep*F, D]
    out_r = out_r.view(n, h, f, d).transpose(1, 2)  # [N, F, H, D]
    # back into the packed rows
    out = query.new_zeros(u, s, h, d)
    prompt_rows, prompt_cols = prompt_key.nonzero(as_tuple=True)
    out = out.index_put((prompt_rows, prompt_cols), out_p.transpose(1, 2)[prompt_rows, prompt_cols])
    fed_rows = rows.row.unsqueeze(1).expand(n, f)[rows.fed]
    return out.index_put((fed_rows, rows.cols[rows.fed]), out_r[rows.fed])
