"""The entropy diagnostics (``dapo.metrics``): the log-prob / advantage covariance (Cui et al. 2025), the entropy of the
clipped tokens, and the collapse warning."""

from __future__ import annotations

import math

import pytest
import torch

from dapo.loss import policy_loss
from dapo.metrics import (
    EntropyWatch,
    clipped_entropy_metrics,
    clipped_token_entropy,
    constant_accuracy_share,
    logprob_advantage_covariance,
)


def test_the_covariance_on_a_hand_worked_batch():
    # trained tokens (mask 1): log-probs -1, -2, -3, -4 with advantages 1, 1, -1, -1; a padded fifth token is ignored
    # means: lp -2.5, A 0; products (1.5)(1) + (0.5)(1) + (-0.5)(-1) + (-1.5)(-1) = 4, over 4 tokens: 1.0
    log_prob = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -9.0, 0.0]])
    advantages = torch.tensor([[1.0, 1.0, -1.0], [-1.0, 5.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert logprob_advantage_covariance(log_prob, advantages, mask) == pytest.approx(1.0, abs=1e-12)
    assert logprob_advantage_covariance(log_prob, -advantages, mask) == pytest.approx(-1.0, abs=1e-12)
    assert math.isnan(logprob_advantage_covariance(log_prob, advantages, torch.zeros_like(mask)))


def test_the_share_of_the_advantages_in_groups_of_constant_accuracy():
    # three groups of 2 responses, in any row order: a mixed one (advantages +-1 over 2 and 1 trained tokens), an
    # all-wrong one pushed by the soft punishment alone (+-0.5 over 2 tokens each), an all-right one with no spread
    advantages = torch.tensor(
        [[1.0, 1.0, 0.0], [0.5, 0.5, 0.0], [-1.0, 0.0, 0.0], [-0.5, -0.5, 9.0], [0.0] * 3, [0.0] * 3]
    )
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 1, 1]])  # the 9.0 is not trained
    acc = torch.tensor([1, 0, 0, 0, 1, 1])
    groups = torch.tensor([7, 3, 7, 3, 5, 5])
    # |A| summed: mixed 2 + 1 = 3, all-wrong 1 + 1 = 2: 2 of 5
    assert constant_accuracy_share(advantages, mask, acc, groups) == pytest.approx(0.4, abs=1e-12)
    assert constant_accuracy_share(advantages, mask, torch.tensor([1, 0, 0, 1, 1, 1]), groups) == 0.0  # all mixed
    assert math.isnan(constant_accuracy_share(advantages, torch.zeros_like(mask), acc, groups))


@pytest.mark.parametrize("direction", [1.0, -1.0], ids=["likely_rewarded", "unlikely_rewarded"])
def test_the_covariance_sign_predicts_the_entropy_change_of_an_update(direction, float64_end_to_end):
    """One small policy-gradient step of the DAPO loss on a random Qwen2 (the tests' tiny shape), on its own samples:
    rewarding the tokens it found likely (positive covariance) lowers its entropy at those positions, rewarding the
    unlikely ones (negative covariance) raises it (Cui et al. 2025, first order in the step size)."""
    from recipe.embedded.decode import sample, shared_prompt_log_probs
    from recipe.embedded.rollout import SamplingParams
    from tests.embedded.test_decode import EOS, PAD, prompts, qwen2

    model = qwen2(64, torch.float64).train()
    rows = [p for p in prompts(64, count=4) for _ in range(4)]
    torch.manual_seed(3)
    ids, mask, _ = sample(
        model,
        prompts(64, count=4),
        n=4,
        params=SamplingParams(True, 1.0, 1.0, 0),
        max_new_tokens=8,
        eos_ids=EOS,
        pad_id=PAD,
        max_num_seqs=64,
    )

    def forward():
        return shared_prompt_log_probs(model, rows, ids, mask, temperature=1.0, pad_id=PAD, with_entropy=True)

    log_prob, entropy = forward()
    m = mask.bool()
    median = log_prob[m].median()
    advantages = direction * torch.where(log_prob.detach() > median, 1.0, -1.0) * mask  # [N, T]
    cov = logprob_advantage_covariance(log_prob.detach(), advantages, mask)
    assert cov * direction > 0
    loss, _ = policy_loss(log_prob, log_prob.detach(), advantages, mask, batch_num_tokens=mask.sum())
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.05 * p.grad  # one small SGD step
    _, after = forward()
    change = float((after - entropy.detach())[m].mean())
    assert change * cov < 0, (change, cov)  # entropy moves against the covariance


def test_the_entropy_of_the_clipped_tokens_on_a_hand_worked_batch():
    # ratios exp(log_prob - old): token 0 r=1.5 with A>0 (above 1.28: clipped high), token 1 r=0.5 with A<0 (below
    # 0.8: clipped low), token 2 r=1.0 (inside), token 3 r=2.0 but masked out
    old = torch.zeros(1, 4)
    log_prob = torch.log(torch.tensor([[1.5, 0.5, 1.0, 2.0]]))
    advantages = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    entropy = torch.tensor([[2.0, 0.5, 1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    sums = clipped_token_entropy(entropy, log_prob, old, advantages, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert sums == {"high": (2.0, 1.0), "low": (0.5, 1.0), "all": (3.5, 3.0)}
    merged = {k: (sums[k][0] + 1.0, sums[k][1] + 1.0) if k == "high" else sums[k] for k in sums}  # a second batch
    assert clipped_entropy_metrics(merged) == {"dapo/entropy/clipped_high": 1.5, "dapo/entropy/clipped_low": 0.5}
    assert math.isnan(clipped_entropy_metrics({"high": (0.0, 0.0)})["dapo/entropy/clipped_high"])


def test_the_collapse_warning_fires_once_names_the_knobs_and_rearms_after_recovery():
    watch = EntropyWatch(fraction=0.3, window=3)
    kwargs = dict(lr=1e-6, clip_ratio_high=0.28)
    assert watch.update(1, 1.0, **kwargs) is None
    assert watch.update(2, 0.5, **kwargs) is None  # 0.5 >= 0.3 x 1.0 (the first step: fewer than 3 steps so far)
    warning = watch.update(3, 0.2, **kwargs)  # below 0.3 x the first step's
    assert warning.startswith("entropy collapse: actor/entropy fell from 1 at step 1 to 0.2 at step 3")
    for knob in ("clip_ratio_high, now 0.28", "optim.lr, now 1e-06", "entropy_coeff", "dapo/entropy/logp_adv_cov"):
        assert knob in warning
    assert watch.update(4, 0.1, **kwargs) is None  # said once
    assert watch.update(5, 0.9, **kwargs) is None  # recovered (0.9 >= 0.3 x step 2's 0.5): re-armed
    assert watch.update(8, 0.2, **kwargs).startswith("entropy collapse: actor/entropy fell from 0.9 at step 5")
    assert watch.update(9, float("nan"), **kwargs) is None and watch.update(10, None, **kwargs) is None
