"""The weight-sync and partial-rollout gaps (recipe/dapo/weight_sync.py) by hand, on padded ``[N, T]`` tensors."""

from __future__ import annotations

import pytest
import torch

from recipe.dapo.weight_sync import logprob_gap, partial_rollout_gap


def test_sync_gap_covers_the_valid_tokens_only():
    old = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 9.0]])
    rollout = torch.tensor([[-1.1, -2.0, -3.3], [-0.5, -0.7, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the 9.0 is padding
    out = logprob_gap(old, rollout, mask)
    assert out["dapo/weight_sync/logprob_diff_max"] == pytest.approx(0.3)
    assert out["dapo/weight_sync/logprob_diff_mean"] == pytest.approx((0.1 + 0 + 0.3 + 0 + 0.2) / 5)
    assert logprob_gap(old, rollout, torch.zeros_like(mask)) == {}


def test_partial_rollout_gap_reads_each_response_at_its_own_last_token():
    # response 0: 3 tokens, sampled by older weights then resumed (gap 0.5 early, 0.01 at its end);
    # response 1: 2 tokens and padding, gap 0.02 at its last token; response 2: masked out whole (overlong filter)
    old = torch.tensor([[-1.0, -1.0, -1.0, 0.0], [-2.0, -2.0, 0.0, 0.0], [-1.0, -1.0, -1.0, -1.0]])
    rollout = torch.tensor([[-1.5, -1.2, -1.01, 7.0], [-2.1, -2.02, 3.0, 3.0], [-9.0, -9.0, -9.0, -9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    out = partial_rollout_gap(old, rollout, mask)
    assert out["dapo/partial_rollout/logprob_diff_max"] == pytest.approx(0.5)
    assert out["dapo/partial_rollout/last_token_logprob_diff_max"] == pytest.approx(0.02)


def test_partial_rollout_gap_of_a_response_ending_at_the_full_width():
    old = torch.tensor([[-1.0, -1.0]])
    rollout = torch.tensor([[-1.25, -1.125]])
    out = partial_rollout_gap(old, rollout, torch.ones(1, 2))
    assert out["dapo/partial_rollout/last_token_logprob_diff_max"] == pytest.approx(0.125)
    assert partial_rollout_gap(old, rollout, torch.zeros(1, 2)) == {}
