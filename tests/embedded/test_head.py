"""The update's chunked head (``recipe.embedded.head.token_log_probs``) and its CPU attention
(``recipe.embedded.attention``) against the plain computations they replace: full logits and ``sdpa``."""

from __future__ import annotations

import functools

import pytest
import torch

from recipe.common.log_probs import sequence_log_probs
from recipe.embedded import head
from recipe.embedded.attention import NAME, use_cpu_attention
from recipe.embedded.decode import shared_prompt_log_probs
from tests.conftest import EPS64, reorder_bound
from tests.embedded.test_decode import DEPTH, HIDDEN, INTERMEDIATE, PAD, prompts, qwen2

pytestmark = pytest.mark.numerics


def _plain(hidden, weight, targets, temperature):
    """What the model's head and the plain path compute: full fp logits, log-softmax, entropy."""
    from dapo.metrics import entropy_from_logits

    logits = (hidden @ weight.T) / temperature  # [M, V]
    log_prob = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return log_prob, entropy_from_logits(logits.unsqueeze(0))[0]


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_chunked_log_probs_entropies_and_gradients_equal_the_full_logits(entropy_grad, monkeypatch):
    """float64, 11 tokens in chunks of 4 (3 chunks, the last one short), temperature 0.7, random upstream gradients
    on both outputs: values and the gradients of the hidden states and of the head's weight agree with autograd
    through full logits, within what another summation order allows (sums over the hidden size of 16 and the
    vocabulary of 50; the weight's gradient also over the 11 tokens). ``entropy_grad=False``: the entropy is a
    metric and carries no gradient (the update's default, entropy_coeff=0)."""
    monkeypatch.setattr(head, "CHUNK_TOKENS", 4)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(11, 16, dtype=torch.float64, generator=g) * 2
    weight = torch.randn(50, 16, dtype=torch.float64, generator=g)
    targets = torch.randint(0, 50, (11,), generator=g)
    up_lp, up_ent = torch.randn(11, dtype=torch.float64, generator=g), torch.randn(11, dtype=torch.float64, generator=g)

    def grads(fn):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        log_prob, entropy = fn(h, w)
        loss = (log_prob * up_lp).sum() + ((entropy * up_ent).sum() if entropy_grad else 0)
        loss.backward()
        return log_prob.detach(), entropy.detach(), h.grad, w.grad

    chunked = grads(
        lambda h, w: head.token_log_probs(h, w, targets, temperature=0.7, with_entropy=True, entropy_grad=entropy_grad)
    )
    full = grads(lambda h, w: _plain(h, w, targets, 0.7))
    scale = 1 + (hidden.abs().max() * weight.abs().max() * 16 / 0.7).item()  # the largest |logit| bound
    for got, expected, terms in zip(chunked, full, (16 + 50, 16 + 50, 16 + 50, 16 + 50 + 11)):
        bound = 4 * reorder_bound(terms, 2, EPS64, scale * (1 + expected.abs().max().item()))
        torch.testing.assert_close(got, expected, rtol=0, atol=bound)
    if not entropy_grad:  # the loss without the entropy: the hidden gradient is the log-prob's alone
        assert chunked[2].abs().sum() > 0


def test_under_bf16_autocast_the_logits_are_rounded_as_the_model_head_rounds_them():
    """bf16 autocast over fp32 weights (the real model's update): the head computes bf16 logits, as a bf16
    ``lm_head`` does; log-probs equal the plain path's (``F.linear`` under autocast, then fp32) to fp32 rounding,
    since both round the same bf16 logits."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(9, 32, generator=g)
    weight = torch.randn(40, 32, generator=g)
    targets = torch.randint(0, 40, (9,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = head.token_log_probs(hidden, weight, targets, temperature=1.0, with_entropy=False)
        logits = torch.nn.functional.linear(hidden, weight).float()  # [9, 40] bf16 rounded, then fp32
    expected = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(got, expected, rtol=0, atol=40 * 2 * torch.finfo(torch.float32).eps * 100)
    exact, _ = _plain(hidden, weight, targets, 1.0)
    assert (got - exact).abs().max() > 1e-4  # the bf16 rounding is really there


def test_the_update_never_holds_full_vocabulary_logits():
    """On a 151,936-token vocabulary, 400 response tokens: the plain path allocates [400, V] fp32 logits (243 MB)
    several times; the chunked head's largest single allocation is a chunk's [256, V] (156 MB), in the forward and
    the backward alike (measured by the profiler's per-op allocations)."""
    from torch.profiler import ProfilerActivity, profile

    model = qwen2(151936).train()
    rows = [prompts(151936, count=1)[0]] * 8
    ids = torch.randint(3, 151936, (8, 50), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(8, 50, dtype=torch.long)
    full_logits = 8 * 50 * 151936 * 4

    def largest_allocation(chunked: bool) -> int:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
            log_prob, _ = shared_prompt_log_probs(
                model, rows, ids, mask, temperature=1.0, pad_id=PAD, with_entropy=True, chunked_head=chunked
            )
            log_prob.sum().backward()
        model.zero_grad()
        return max(e.cpu_memory_usage for e in p.events())

    assert largest_allocation(chunked=False) >= full_logits
    assert largest_allocation(chunked=True) <= head.CHUNK_TOKENS * 151936 * 4 + 1_000_000  # + a few small tensors


@pytest.mark.parametrize("layout", ["packed", "cache"])
def test_cpu_attention_gives_the_sdpa_forward_and_gradients(layout, float64_end_to_end):
    """The shared-prompt forward with ``dapo_cpu`` attention against the full forward with ``sdpa``: log-probs,
    entropies and every parameter's gradient, float64 end to end (the same algebra: one additive mask, one softmax,
    stacked key-head groups instead of repeated keys). Packed, the attention runs on the rows' layout
    (``PackedRows``: each prompt causal, each response over its prompt and itself); responses of 2 to 6 tokens and
    one of a single token, last in its row, which feeds nothing."""
    model = qwen2(64, torch.float64).train()
    reference = qwen2(64, torch.float64).train()  # the same weights (seeded), sdpa
    assert use_cpu_attention(model) and model.config._attn_implementation == NAME
    distinct = prompts(64, count=3)
    rows = [distinct[0]] * 3 + [distinct[1]] + [distinct[2]] * 4
    response_ids = torch.randint(3, 64, (8, 6), generator=torch.Generator().manual_seed(2))
    response_mask = torch.ones(8, 6, dtype=torch.long)
    response_mask[1, 4:] = 0
    response_mask[6, 2:] = 0
    response_mask[7, 1:] = 0  # one token (its end token at once): the last response of a row feeds none

    def run(m, fn):
        m.zero_grad()
        log_prob, entropy = fn(m, rows, response_ids, response_mask, temperature=1.0, pad_id=PAD, with_entropy=True)
        (log_prob * response_mask).sum().backward()
        return log_prob.detach(), entropy.detach(), [p.grad.clone() for p in m.parameters()]

    got = run(model, functools.partial(shared_prompt_log_probs, layout=layout))
    expected = run(reference, sequence_log_probs)
    m = response_mask.bool()
    terms = HIDDEN + INTERMEDIATE + 39
    for a, b in ((got[0], expected[0]), (got[1], expected[1])):
        bound = 2 * reorder_bound(terms, DEPTH, EPS64, 1 + b[m].abs().max().item())
        torch.testing.assert_close(a[m], b[m], rtol=0, atol=bound)
    for a, b in zip(got[2], expected[2]):
        torch.testing.assert_close(a, b, rtol=0, atol=reorder_bound(terms + 48, DEPTH, EPS64, 1 + b.abs().max().item()))
