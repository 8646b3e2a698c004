"""Two ways must agree: dapo/ against the real verl 0.9.1 functions on CPU tensors.

The same formulas written twice, so compared in float64, within what another order of operations allows
(``conftest.reorder_bound``); counts of clipped tokens must agree exactly (a tolerance below 1 / tokens).
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from dapo.advantage import token_advantages
from dapo.loss import policy_loss
from dapo.shaping import overlong_penalty
from tests.conftest import EPS32, EPS64, reorder_bound

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

pytestmark = pytest.mark.numerics

MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _random_batch(seed, n, t):
    gen = torch.Generator().manual_seed(seed)
    log_prob = torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.5
    old = log_prob + torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.4  # ratios over both clip bounds
    adv = torch.randn(n, t, generator=gen, dtype=torch.float64) * 2
    mask = (torch.rand(n, t, generator=gen) < 0.8).double()
    mask[:, 0] = 1.0
    return log_prob, old, adv, mask


def _loss_bound(log_prob, old, adv, c: float, scale: float = 1.0) -> float:
    """A per-token loss is at most |A| * max(ratio, c) (the ratio, clipped or dual-clipped); an aggregate sums
    every token's (times ``scale``: dp_size, or a seq-mean's 1 / length folded in), in 4 operations deep."""
    ratio = (log_prob - old).clamp(-20, 20).exp()
    per_token = (adv.abs() * torch.maximum(ratio, torch.tensor(c))).max().item()
    return reorder_bound(log_prob.numel(), 4, EPS64, scale * log_prob.numel() * per_token)


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(1, 16),
    t=st.integers(1, 24),
    mode=st.sampled_from(MODES),
    low=st.floats(0.05, 0.4),
    high=st.floats(0.05, 0.5),
    c=st.floats(1.5, 10.0),
    dp_size=st.integers(1, 4),
)
def test_policy_loss_equals_verl_vanilla_plus_agg_loss(seed, n, t, mode, low, high, c, dp_size):
    log_prob, old, adv, mask = _random_batch(seed, n, t)
    batch_info = {"dp_size": dp_size, "batch_num_tokens": int(mask.sum()) * dp_size, "global_batch_size": n * dp_size}
    clips = {"clip_ratio_low": low, "clip_ratio_high": high, "clip_ratio_c": c}  # verl's keys are dapo.loss's names
    config = OmegaConf.create({"clip_ratio": 0.2, **clips, "global_batch_info": batch_info})
    verl_loss, verl_metrics = core_algos.compute_policy_loss_vanilla(old, log_prob, adv, mask, mode, config)
    ours, metrics = policy_loss(log_prob, old, adv, mask, loss_agg_mode=mode, **clips, **batch_info)
    torch.testing.assert_close(ours, verl_loss, rtol=0, atol=_loss_bound(log_prob, old, adv, c, dp_size))
    for key in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower"):  # shares of n * t tokens: one token is 1 / (n t)
        assert metrics[key] == pytest.approx(verl_metrics[key], rel=0, abs=0.5 / (n * t)), key
    # a mean of old - new, which verl computes in float32 whatever the inputs' dtype
    kl_bound = reorder_bound(n * t, 2, EPS32, (log_prob - old).abs().mean().item())
    assert metrics["actor/ppo_kl"] == pytest.approx(verl_metrics["actor/ppo_kl"], rel=0, abs=kl_bound)


def test_policy_loss_equals_verl_with_default_batch_info():
    # no global_batch_info: both fall back to the local token / sequence counts
    log_prob, old, adv, mask = _random_batch(0, 8, 12)
    mask[3] = 0.0  # a fully masked sequence is excluded from the sequence count in both
    for mode in MODES:
        config = OmegaConf.create(
            {
                "clip_ratio": 0.2,
                "clip_ratio_low": 0.2,
                "clip_ratio_high": 0.28,
                "clip_ratio_c": 3.0,
                "global_batch_info": {},
            }
        )
        verl_loss, _ = core_algos.compute_policy_loss_vanilla(old, log_prob, adv, mask, mode, config)
        ours, _ = policy_loss(log_prob, old, adv, mask, loss_agg_mode=mode)
        torch.testing.assert_close(ours, verl_loss, rtol=0, atol=_loss_bound(log_prob, old, adv, 3.0), msg=mode)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    groups=st.integers(1, 8),
    group_size=st.integers(1, 8),
    norm=st.booleans(),
    discrete=st.booleans(),
)
def test_group_advantages_equal_verl_grpo_outcome(seed, groups, group_size, norm, discrete):
    gen = torch.Generator().manual_seed(seed)
    n, t = groups * group_size, 6
    mask = torch.ones(n, t)
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    # discrete +1/-1 scores (DAPO's) produce the constant groups that exercise the epsilon
    score = (
        (torch.randint(0, 2, (n,), generator=gen) * 2 - 1).double()
        if discrete
        else torch.randn(n, generator=gen, dtype=torch.float64)
    )
    rewards = torch.zeros(n, t, dtype=torch.float64)
    rewards[torch.arange(n), lengths - 1] = score
    index = np.repeat(np.array([f"uid-{i}" for i in range(groups)], dtype=object), group_size)
    verl_adv, _ = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, index, norm_adv_by_std_in_grpo=norm)
    ours = token_advantages(rewards, mask, group_size, norm_adv_by_std_in_grpo=norm)
    # (s - mean) / (std + 1e-6) over a group of at most 8, a few operations deep. Ours computes in float32, so each
    # score carries a rounding of eps32 * |s| from the start; s - mean cancels it into a relative error of
    # eps32 * |s| / |s - mean|, and the division by the group's std scales the advantage's error to about
    # eps32 * |s| / std * (1 + |A|): two close scores (std 0.015 beside |s| 0.86) lose that much to the cast alone.
    # A constant group's 0 is exact in both.
    grouped = score.reshape(groups, group_size)
    spread = grouped.std(dim=1) if group_size > 1 else torch.ones(groups, dtype=torch.float64)
    cancellation = (grouped.abs().max(dim=1).values / (spread + 1e-6)).max().item()
    adv_bound = reorder_bound(group_size, 4, EPS32, (1 + ours.abs().max().item()) * (1 + cancellation))
    torch.testing.assert_close(ours, verl_adv.to(ours.dtype), rtol=0, atol=adv_bound)


@pytest.fixture(scope="module")
def char_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{ch: i + 2 for i, ch in enumerate("abcdefghij0123456789 :")}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


@pytest.mark.parametrize("max_resp_len, buffer_len, factor", [(16, 8, 1.0), (20, 4, 1.0), (32, 10, 0.5)])
def test_overlong_penalty_equals_verl_reward_loop_dapo_manager(char_tokenizer, max_resp_len, buffer_len, factor):
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager

    config = OmegaConf.create(
        {
            "reward": {
                "reward_kwargs": {
                    "max_resp_len": max_resp_len,
                    "overlong_buffer_cfg": {"enable": True, "len": buffer_len, "penalty_factor": factor, "log": True},
                }
            }
        }
    )

    def zero_score(**_):  # isolate the penalty: the task score is 0
        return {"score": 0.0, "acc": False}

    manager = DAPORewardManager(config, char_tokenizer, zero_score)
    prompt_len = 3
    for length in range(0, max_resp_len + 1):
        responses = torch.full((1, max_resp_len), 2, dtype=torch.long)
        attention = torch.zeros(1, prompt_len + max_resp_len, dtype=torch.long)
        attention[0, :prompt_len] = 1
        attention[0, prompt_len : prompt_len + length] = 1
        data = DataProto.from_dict(
            tensors={
                "responses": responses,
                "attention_mask": attention,
                "prompts": torch.full((1, prompt_len), 3, dtype=torch.long),
            },
            non_tensors={
                "data_source": np.array(["math_dapo"], dtype=object),
                "reward_model": np.array([{"ground_truth": "1"}], dtype=object),
                "extra_info": np.array([{}], dtype=object),
            },
        )
        out = manager.loop.run_until_complete(manager.run_single(data))
        ours = overlong_penalty(
            torch.tensor([length]), max_resp_len=max_resp_len, overlong_buffer_len=buffer_len, penalty_factor=factor
        )
        # -(exceed / len) * factor: one division and one product of small integers, rounded in float32 by ours
        # (verl's is a python float): at most 2 roundings of a value <= 1
        assert ours.item() == pytest.approx(float(out["reward_score"]), rel=0, abs=2 * EPS32), length
