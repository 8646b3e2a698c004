"""Log-probabilities and entropies of chosen tokens from the last hidden states, in chunks of tokens, never holding
``[tokens, vocabulary]`` fp32 logits.

The update needs ``log pi(y_t)`` (and the entropy, a metric) of the trained tokens only, but the plain forward
materialises the logits of every position over the whole vocabulary in fp32, then their log-softmax: on SmolLM2
(49,152 tokens), a micro-batch of 8 responses of 104 tokens holds about 160 MB per copy and makes several.
:func:`token_log_probs` computes the same quantities from the hidden states of the predicting positions, one chunk
of tokens at a time, keeping only the head's own 16-bit logits for the backward (under bf16 autocast: a quarter of
one fp32 copy; in fp32 and fp64 the backward recomputes them); the largest fp32 transient is one chunk's
``[CHUNK_TOKENS, V]``.

The arithmetic is the plain path's: logits ``hidden @ W.T`` in the compute dtype (bf16 under autocast, rounded to
it as a bf16 ``lm_head`` rounds them), then fp32 (fp64 for fp64 weights), divided by the temperature; ``log_prob =
z_y - logsumexp(z)``; ``entropy = logsumexp(z) - sum(softmax(z) * z)``. Gradients, with ``p = softmax(z)``:
``d log_prob / dz = onehot(y) - p``; ``d entropy / dz = -p * (z - logsumexp(z) + entropy)`` (only when the entropy
is in the loss, ``entropy_grad``); both times ``1 / temperature`` back to the logits. ``tests/embedded/
test_head.py`` holds values and gradients to the plain full-logits computation in float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_TOKENS = 256  # tokens whose logits exist at once: 256 x 49,152 x 4 bytes = 50 MB on SmolLM2


def token_log_probs(
    hidden: torch.Tensor,  # [M, d] the positions predicting the tokens
    weight: torch.Tensor,  # [V, d] the output embedding (lm_head.weight)
    targets: torch.Tensor,  # [M] the tokens
    *,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(hidden @ weight.T / temperature)`` at ``targets`` ``[M]`` and, with ``with_entropy``, the entropy
    ``[M]`` (differentiable when ``entropy_grad``); fp32 (fp64 for fp64 weights). Under autocast the logits are
    computed in the autocast dtype, as the model's own head computes them."""
    device = hidden.device
    compute = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else weight.dtype
    with torch.autocast(device.type, enabled=False):
        log_prob, entropy = _HeadLogProbs.apply(
            hidden, weight, targets, temperature, compute, with_entropy, entropy_grad and torch.is_grad_enabled()
        )
    return log_prob, (entropy if with_entropy else None)


def _scaled(logits: torch.Tensor, temperature: float, out_dtype: torch.dtype) -> torch.Tensor:
    """``[c, V]`` logits (rounded to the compute dtype, as ``lm_head`` rounds them) / temperature, in ``out_dtype``."""
    z = logits.to(out_dtype)
    return z if temperature == 1.0 else z.div_(temperature)


class _HeadLogProbs(torch.autograd.Function):
    """Forward: per chunk, the head's logits (kept for the backward when they are 16-bit: the model's own output, a
    quarter of fp32 logits' size; recomputed in fp32 and fp64), their fp32 log-sum-exp, the targets' log-probs and
    the entropy. Backward: per chunk, softmax from the kept logits and log-sum-exp, the logits' gradient, then the
    two products of the head."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, compute, with_entropy, entropy_grad):
        out_dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
        keep = compute in (torch.bfloat16, torch.float16)
        w = weight.detach().to(compute)
        m = hidden.shape[0]
        log_prob = torch.empty(m, dtype=out_dtype, device=hidden.device)
        lse = torch.empty(m, dtype=out_dtype, device=hidden.device)
        entropy = torch.empty(m if with_entropy else 0, dtype=out_dtype, device=hidden.device)
        kept = []
        for start in range(0, m, CHUNK_TOKENS):
            rows = slice(start, start + CHUNK_TOKENS)
            raw = F.linear(hidden[rows].detach().to(compute), w)  # [c, V] in the compute dtype
            if keep:
                kept.append(raw)
            z = _scaled(raw, temperature, out_dtype)  # [c, V]
            top = z.amax(dim=-1, keepdim=True)  # [c, 1]
            e = (z - top).exp_()  # [c, V] unnormalised softmax
            total = e.sum(dim=-1)  # [c]
            lse[rows] = top.squeeze(-1) + total.log()
            log_prob[rows] = z.gather(-1, targets[rows].unsqueeze(-1)).squeeze(-1) - lse[rows]
            if with_entropy:  # logsumexp(z) - sum(softmax(z) * z)
                entropy[rows] = lse[rows] - torch.linalg.vecdot(e, z) / total
        ctx.save_for_backward(hidden, weight, targets, lse, entropy)
        ctx.kept, ctx.temperature, ctx.compute, ctx.entropy_grad = kept, temperature, compute, entropy_grad
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return log_prob, entropy

    @staticmethod
    def backward(ctx, grad_log_prob, grad_entropy):
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        compute, temperature = ctx.compute, ctx.temperature
        out_dtype = grad_log_prob.dtype
        w = weight.to(compute)
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=out_dtype, device=weight.device)
        use_entropy = ctx.entropy_grad and grad_entropy is not None
        for chunk, start in enumerate(range(0, hidden.shape[0], CHUNK_TOKENS)):
            rows = slice(start, start + CHUNK_TOKENS)
            h = hidden[rows].to(compute)
            raw = ctx.kept[chunk] if ctx.kept else F.linear(h, w)  # [c, V] kept, or recomputed
            z = _scaled(raw, temperature, out_dtype)
            p = z.sub(lse[rows].unsqueeze(-1)).exp_()  # [c, V] softmax
            if use_entropy:  # d entropy / dz = -p (z - lse + entropy)
                z.sub_((lse[rows] - entropy[rows]).unsqueeze(-1)).mul_(p).mul_(-grad_entropy[rows].unsqueeze(-1))
            grad_z = p.mul_(-grad_log_prob[rows].unsqueeze(-1))  # d log_prob / dz = onehot - p
            grad_z.scatter_add_(-1, targets[rows].unsqueeze(-1), grad_log_prob[rows].unsqueeze(-1))
            if use_entropy:
                grad_z.add_(z)
            if temperature != 1.0:
                grad_z.div_(temperature)  # back through the division
            grad_z = grad_z.to(compute)  # into the head's dtype
            grad_hidden[rows] = (grad_z @ w).to(hidden.dtype)
            grad_weight += (grad_z.T @ h).to(out_dtype)
        ctx.kept = None
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None
