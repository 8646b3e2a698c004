"""Two ways must agree: dapo/ against the real verl 0.9.1 functions on CPU tensors."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from dapo.advantage import token_advantages
from dapo.loss import policy_loss
from dapo.shaping import overlong_penalty

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _random_batch(seed, n, t):
    gen = torch.Generator().manual_seed(seed)
    log_prob = torch.randn(n, t, generator=gen) * 0.5
    old = log_prob + torch.randn(n, t, generator=gen) * 0.4  # ratios spread over both clip bounds
    adv = torch.randn(n, t, generator=gen) * 2
    mask = (torch.rand(n, t, generator=gen) < 0.8).float()
    mask[:, 0] = 1.0
    return log_prob, old, adv, mask


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
    config = OmegaConf.create(
        {"clip_ratio": 0.2, "clip_ratio_low": low, "clip_ratio_high": high, "clip_ratio_c": c,
         "global_batch_info": batch_info}
    )
    verl_loss, verl_metrics = core_algos.compute_policy_loss_vanilla(old, log_prob, adv, mask, mode, config)
    ours, metrics = policy_loss(
        log_prob, old, adv, mask, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c,
        loss_agg_mode=mode, **batch_info,
    )
    torch.testing.assert_close(ours, verl_loss, rtol=1e-5, atol=1e-6)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert metrics[key] == pytest.approx(verl_metrics[key], rel=1e-4, abs=1e-6), key


def test_policy_loss_equals_verl_with_default_batch_info():
    # no global_batch_info: both fall back to the local token / sequence counts
    log_prob, old, adv, mask = _random_batch(0, 8, 12)
    mask[3] = 0.0  # a fully masked sequence is excluded from the sequence count in both
    for mode in MODES:
        config = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                                   "clip_ratio_c": 3.0, "global_batch_info": {}})
        verl_loss, _ = core_algos.compute_policy_loss_vanilla(old, log_prob, adv, mask, mode, config)
        ours, _ = policy_loss(log_prob, old, adv, mask, loss_agg_mode=mode)
        torch.testing.assert_close(ours, verl_loss, rtol=1e-5, atol=1e-6, msg=mode)


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
    score = (torch.randint(0, 2, (n,), generator=gen) * 2 - 1).float() if discrete else torch.randn(n, generator=gen)
    rewards = torch.zeros(n, t)
    rewards[torch.arange(n), lengths - 1] = score
    index = np.repeat(np.array([f"uid-{i}" for i in range(groups)], dtype=object), group_size)
    verl_adv, _ = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, index,
                                                              norm_adv_by_std_in_grpo=norm)
    ours = token_advantages(rewards, mask, group_size, norm_adv_by_std_in_grpo=norm)
    torch.testing.assert_close(ours, verl_adv, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def char_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
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

    config = OmegaConf.create({"reward": {"reward_kwargs": {
        "max_resp_len": max_resp_len,
        "overlong_buffer_cfg": {"enable": True, "len": buffer_len, "penalty_factor": factor, "log": True},
    }}})

    def zero_score(**_):  # isolate the penalty: the task score is 0
        return {"score": 0.0, "acc": False}

    manager = DAPORewardManager(config, char_tokenizer, zero_score)
    prompt_len = 3
    for length in range(0, max_resp_len + 1):
        responses = torch.full((1, max_resp_len), 2, dtype=torch.long)
        attention = torch.zeros(1, prompt_len + max_resp_len, dtype=torch.long)
        attention[0, :prompt_len] = 1
        attention[0, prompt_len:prompt_len + length] = 1
        data = DataProto.from_dict(
            tensors={"responses": responses, "attention_mask": attention,
                     "prompts": torch.full((1, prompt_len), 3, dtype=torch.long)},
            non_tensors={"data_source": np.array(["math_dapo"], dtype=object),
                         "reward_model": np.array([{"ground_truth": "1"}], dtype=object),
                         "extra_info": np.array([{}], dtype=object)},
        )
        out = manager.loop.run_until_complete(manager.run_single(data))
        ours = overlong_penalty(torch.tensor([length]), max_resp_len=max_resp_len, overlong_buffer_len=buffer_len,
                                penalty_factor=factor)
        assert ours.item() == pytest.approx(float(out["reward_score"]), abs=1e-6), length
