"""dapo.loss: hand-worked values, micro-batch invariance, overlong filtering."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.loss import (
    aggregate_loss,
    clipped_surrogate,
    overlong_filter_mask,
    policy_loss,
    truncated_responses,
)

pytestmark = pytest.mark.numerics


def _one_token(ratio: float, adv: float, **kw):
    """Loss and stats of a single token with the given ratio r = exp(logp - old_logp) and advantage."""
    log_prob = torch.tensor([[math.log(ratio)]])
    old = torch.zeros(1, 1)
    loss, stats = clipped_surrogate(log_prob, old, torch.tensor([[adv]]), **kw)
    return loss.item(), {k: v.item() for k, v in stats.items()}


def test_clip_high_binds_at_1_28_for_positive_advantage():
    # r = 1.5, A = +1: L1 = -A r = -1.5; L2 = -A clip(1.5, 0.8, 1.28) = -1.28; max = -1.28 (clipped high)
    loss, s = _one_token(1.5, 1.0)
    assert loss == pytest.approx(-1.28)
    assert s["clipped"] and s["clipped_high"] and not s["clipped_low"]


def test_clip_higher_lets_ratio_1_25_through_where_symmetric_clip_would_stop_it():
    # r = 1.25, A = +1, eps_high = 0.28: 1.25 < 1.28 so L = -1.25 (unclipped, gradient flows)
    loss, s = _one_token(1.25, 1.0)
    assert loss == pytest.approx(-1.25)
    assert not s["clipped"]
    # symmetric clip (eps_high = 0.2): L2 = -clip(1.25, 0.8, 1.2) = -1.2 > -1.25, so the bound binds
    loss_sym, s_sym = _one_token(1.25, 1.0, clip_ratio_high=0.2)
    assert loss_sym == pytest.approx(-1.2)
    assert s_sym["clipped"]


def test_clip_low_binds_at_0_8_for_negative_advantage():
    # r = 0.5, A = -1: L1 = 0.5; L2 = clip(0.5, 0.8, 1.28) = 0.8; max = 0.8; dual bound 3 * 1 = 3 > 0.8
    loss, s = _one_token(0.5, -1.0)
    assert loss == pytest.approx(0.8)
    assert s["clipped"] and s["clipped_low"] and not s["dual_clipped"]


def test_low_clip_does_not_act_on_positive_advantage():
    # r = 0.5, A = +1: L1 = -0.5; L2 = -0.8; max = -0.5 -> unclipped (the pessimistic bound is the ratio)
    loss, s = _one_token(0.5, 1.0)
    assert loss == pytest.approx(-0.5)
    assert not s["clipped"]


def test_high_clip_does_not_act_on_negative_advantage():
    # r = 1.5, A = -2: L1 = 3.0; L2 = 2 * 1.28 = 2.56; max = 3.0 (unclipped); dual bound 2 * 3 = 6 > 3
    loss, s = _one_token(1.5, -2.0)
    assert loss == pytest.approx(3.0)
    assert not s["clipped"] and not s["dual_clipped"]


def test_dual_clip_bounds_negative_advantage_with_exploded_ratio():
    # r = 5, A = -1: L1 = 5; L2 = 1.28; max = 5; dual bound c * -A = 3 -> min(3, 5) = 3
    loss, s = _one_token(5.0, -1.0)
    assert loss == pytest.approx(3.0)
    assert s["dual_clipped"]
    # the paper's 32B run uses c = 10: 5 < 10, so the loss stays 5
    loss10, s10 = _one_token(5.0, -1.0, clip_ratio_c=10.0)
    assert loss10 == pytest.approx(5.0)
    assert not s10["dual_clipped"]


def test_log_ratio_is_clamped_at_20():
    # logp - old = 100 would overflow nothing in float32 exp? exp(100) = 2.7e43 is finite, but exp(1000) is inf;
    # the clamp to 20 gives r = exp(20) for both, so A = +1 yields the upper clip -1.28 and no inf/nan
    loss, _ = clipped_surrogate(torch.tensor([[1000.0]]), torch.zeros(1, 1), torch.tensor([[1.0]]))
    assert loss.item() == pytest.approx(-1.28)


@pytest.mark.parametrize("bad", [{"clip_ratio_c": 1.0}, {"clip_ratio_low": -0.1}])
def test_invalid_clip_parameters_name_the_key(bad):
    with pytest.raises(ValueError, match="clip_ratio"):
        _one_token(1.0, 1.0, **bad)


# loss_mat and mask used by the aggregation tests:
#   row 0: losses 1, 2, 3 all valid   -> token sum 6, 3 tokens
#   row 1: losses 4, 9, 9 only first  -> token sum 4, 1 token
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (6 + 4) / 4),  # every valid token weighs the same: 10 / 4 = 2.5
        ("token-sum", 6 + 4),  # 10
        ("seq-mean-token-sum", (6 + 4) / 2),  # per-sequence sums averaged: 5
        ("seq-mean-token-mean", (6 / 3 + 4 / 1) / 2),  # GRPO's per-sequence mean first: (2 + 4) / 2 = 3
        ("seq-mean-token-sum-norm", (6 + 4) / 2 / 3),  # seq-mean-token-sum / padded length T=3 -> 5/3
    ],
)
def test_aggregation_modes_hand_worked(mode, expected):
    assert aggregate_loss(LOSS, MASK, mode).item() == pytest.approx(expected, rel=1e-6)


def test_token_mean_uses_the_passed_mini_batch_token_count_and_dp_size():
    # 10 / 8 tokens in the whole mini-batch, times dp_size 2 (undoes the all-reduce average) = 2.5
    assert aggregate_loss(LOSS, MASK, "token-mean", batch_num_tokens=8, dp_size=2).item() == pytest.approx(2.5)


def test_token_mean_of_an_all_masked_batch_is_zero_not_nan():
    out = aggregate_loss(LOSS, torch.zeros_like(MASK), "token-mean")
    assert out.item() == 0.0


def test_unknown_agg_mode_names_the_choices():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_loss(LOSS, MASK, "sequence-mean")


def _grads(log_prob, old, adv, mask, splits, mode):
    """Gradient w.r.t. log_prob of the loss summed over micro-batches given by `splits` (row counts)."""
    lp = log_prob.clone().requires_grad_(True)
    total_tokens = mask.sum()
    n_seq = mask.shape[0]
    start = 0
    for size in splits:
        rows = slice(start, start + size)
        loss, _ = policy_loss(
            lp[rows],
            old[rows],
            adv[rows],
            mask[rows],
            loss_agg_mode=mode,
            batch_num_tokens=total_tokens,
            global_batch_size=n_seq,
        )
        loss.backward()
        start += size
    return lp.grad


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 12),
    t=st.integers(1, 16),
    seed=st.integers(0, 2**31 - 1),
    data=st.data(),
    mode=st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum"]),
)
def test_micro_batches_sum_to_the_whole_mini_batch_gradient(n, t, seed, data, mode):
    gen = torch.Generator().manual_seed(seed)
    log_prob = torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.3
    old = log_prob + torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(n, t, generator=gen, dtype=torch.float64)
    mask = (torch.rand(n, t, generator=gen) < 0.7).double()
    # random split of the n rows into micro-batches
    cuts = sorted(data.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=4, unique=True))) if n > 1 else []
    bounds = [0, *[c for c in cuts if 0 < c < n], n]
    splits = [b - a for a, b in zip(bounds, bounds[1:]) if b > a]
    whole = _grads(log_prob, old, adv, mask, [n], mode)
    micro = _grads(log_prob, old, adv, mask, splits, mode)
    # float64, at most 12 x 16 = 192 terms through 4 operations: 192 * 4 * eps64 = 2e-13 relative to the terms
    torch.testing.assert_close(micro, whole, rtol=1e-10, atol=1e-12)


def test_truncated_responses_detects_missing_eos():
    eos = 2
    ids = torch.tensor([[5, 6, 2, 0], [5, 6, 7, 8], [2, 0, 0, 0], [5, 2, 7, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0]])
    # row 0 ends with EOS; row 1 ran to the limit; row 2 is an immediate EOS;
    # row 3 has an EOS id only outside its mask -> truncated
    assert truncated_responses(ids, mask, eos).tolist() == [False, True, False, True]
    # several EOS ids (e.g. <|im_end|> and <|endoftext|>)
    assert truncated_responses(ids, mask, [8, 2]).tolist() == [False, False, False, True]


def test_overlong_filter_removes_truncated_rows_from_the_token_mean():
    # row 1 truncated: only row 0's tokens remain -> token-mean = 6 / 3 = 2
    mask = overlong_filter_mask(MASK, torch.tensor([False, True]))
    assert mask.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert aggregate_loss(LOSS, mask, "token-mean").item() == pytest.approx(2.0)


def test_policy_loss_metrics_hand_worked():
    # two tokens: (r=1.5, A=+1) clipped high; (r=1.0, A=+1) not clipped
    lp = torch.log(torch.tensor([[1.5, 1.0]]))
    loss, m = policy_loss(lp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    # token-mean of (-1.28, -1.0) = -1.14
    assert loss.item() == pytest.approx(-1.14)
    assert m["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert m["dapo/clipfrac_high"] == pytest.approx(0.5)
    assert m["dapo/clipfrac_low"] == 0.0
    # ppo_kl = mean(old - new) = mean(-log 1.5, 0) = -0.2027
    assert m["actor/ppo_kl"] == pytest.approx(-math.log(1.5) / 2)
