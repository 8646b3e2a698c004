"""dapo.advantage and dapo.shaping: hand-worked values."""

import math

import pytest
import torch

from dapo.advantage import group_advantages, token_advantages
from dapo.shaping import overlong_penalty

pytestmark = pytest.mark.numerics


def test_group_advantage_hand_worked():
    # group 0: scores 1, -1, -1, -1 -> mean -0.5, unbiased std sqrt((1.5^2 + 3 * 0.5^2) / 3) = sqrt(1) = 1
    #   adv = (1 + 0.5) / (1 + 1e-6), (-1 + 0.5) / (1 + 1e-6) x3
    # group 1: all 1 -> mean 1, std 0 -> adv 0 (eps keeps it finite)
    scores = torch.tensor([1.0, -1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_advantages(scores, 4)
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.0, 0.0, 0.0, 0.0]) / (1 + 1e-6)
    torch.testing.assert_close(adv, expected)


def test_group_advantage_without_std_normalisation_is_centred_only():
    scores = torch.tensor([3.0, 1.0])  # mean 2 -> 1, -1
    torch.testing.assert_close(group_advantages(scores, 2, norm_adv_by_std_in_grpo=False), torch.tensor([1.0, -1.0]))


def test_singleton_groups_keep_the_raw_reward():
    # verl: a group of one gets mean 0 and std 1, so adv = score / (1 + 1e-6)
    adv = group_advantages(torch.tensor([0.5, -1.0]), 1)
    torch.testing.assert_close(adv, torch.tensor([0.5, -1.0]) / (1 + 1e-6))


def test_group_size_must_divide_the_batch():
    with pytest.raises(ValueError, match="rollout.n"):
        group_advantages(torch.zeros(6), 4)


def test_token_advantages_broadcast_over_valid_tokens():
    # reward sits on the last valid token; advantage spreads over the whole response mask
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    a = 1 / math.sqrt(2) / (1 + 1e-6)  # (1 - 0) / std(1, -1) = 1 / sqrt(2)
    expected = torch.tensor([[a, a, 0.0], [-a, -a, -a]])
    torch.testing.assert_close(token_advantages(rewards, mask, 2), expected)


# Paper setting scaled down: L_max = 20, L_cache = 4 -> full reward up to 16 tokens, -1 at 20.
@pytest.mark.parametrize(
    "length, expected",
    [
        (0, 0.0),
        (16, 0.0),  # exactly L_max - L_cache: no penalty
        (17, -0.25),  # (16 - 17) / 4
        (18, -0.5),  # (16 - 18) / 4
        (20, -1.0),  # at L_max
        (25, -1.0),  # beyond L_max: held at -1 (Eq. 13)
    ],
)
def test_soft_overlong_punishment_eq13(length, expected):
    out = overlong_penalty(torch.tensor([length]), max_resp_len=20, overlong_buffer_len=4)
    assert out.item() == pytest.approx(expected)


def test_penalty_factor_scales_the_penalty():
    out = overlong_penalty(torch.tensor([18, 20]), max_resp_len=20, overlong_buffer_len=4, penalty_factor=0.5)
    torch.testing.assert_close(out, torch.tensor([-0.25, -0.5]))


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"max_resp_len": 0, "overlong_buffer_len": 4}, "max_resp_len"),
        ({"max_resp_len": 20, "overlong_buffer_len": 0}, "overlong_buffer_cfg.len"),
        ({"max_resp_len": 20, "overlong_buffer_len": 30}, "overlong_buffer_cfg.len"),
        ({"max_resp_len": 20, "overlong_buffer_len": 4, "penalty_factor": -1.0}, "penalty_factor"),
    ],
)
def test_invalid_overlong_parameters_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        overlong_penalty(torch.tensor([1]), **kwargs)
