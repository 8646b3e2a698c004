"""The loss-mode table ``dapo.loss.LOSS_MODES``: GSPO worked by hand, and each mode equal to verl 0.9.1's own.

GSPO (arXiv 2507.18071): a response's ratio is the geometric mean of its token ratios, s = exp(mean_t log r_t),
clipped as a whole; every token of the response carries s, and the gradient reaches each token's log-prob as
s * d log pi(y_t) (verl's s_{i,t} = sg[s] * pi(y_t) / sg[pi(y_t)]).
"""

from __future__ import annotations

import math

import pytest
import torch

from dapo.loss import LOSS_MODES, gspo_policy_loss, policy_loss, vanilla_policy_loss

pytest.importorskip("verl")
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402

import recipe.dapo.policy_loss as plugin  # noqa: E402  registers the table's names verl lacks

pytestmark = pytest.mark.numerics

ACTOR = "actor_rollout_ref.actor"


def one_response(log_ratios: list[float], advantage: float, **kwargs):
    old = torch.zeros(1, len(log_ratios), dtype=torch.float64)
    log_prob = torch.tensor([log_ratios], dtype=torch.float64, requires_grad=True)  # [1, T]
    adv = torch.full((1, len(log_ratios)), advantage, dtype=torch.float64)
    loss, metrics = gspo_policy_loss(log_prob, old, adv, torch.ones(1, len(log_ratios)), **kwargs)
    loss.backward()
    return loss.item(), log_prob.grad[0].tolist(), metrics


def test_gspo_unclipped_by_hand():
    # log r = (0.2, 0.0): log s = mean = 0.1, s = e^0.1 = 1.105171 < 1 + 0.28: not clipped
    # per token -A s = -1.105171; token-mean over 2 tokens = -1.105171
    # d loss / d log pi_t = -A * s / 2 = -0.552585 for both tokens (a token ratio would give -e^0.2/2, -1/2)
    loss, grad, metrics = one_response([0.2, 0.0], 1.0)
    assert loss == pytest.approx(-math.exp(0.1))
    assert grad == pytest.approx([-math.exp(0.1) / 2, -math.exp(0.1) / 2])
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.1)  # mean of -log r


def test_gspo_clips_the_whole_response():
    # log r = (0.4, 0.2): s = e^0.3 = 1.349859 > 1.28: both tokens clipped at 1.28, no gradient;
    # a token-level clip would clip only the first (e^0.2 = 1.2214 < 1.28)
    loss, grad, metrics = one_response([0.4, 0.2], 1.0)
    assert loss == pytest.approx(-1.28)
    assert grad == [0.0, 0.0]
    assert metrics["actor/pg_clipfrac"] == 1.0


def test_gspo_negative_advantage_clips_below():
    # A = -1, log r = (-0.5, -0.1): s = e^-0.3 = 0.740818 < 1 - 0.2: loss = max(-A s, -A 0.8) = 0.8 per token
    loss, grad, _ = one_response([-0.5, -0.1], -1.0)
    assert loss == pytest.approx(0.8)
    assert grad == [0.0, 0.0]


def test_gspo_ignores_padding():
    # the padded token's log-ratio (5.0) must not enter the geometric mean
    old = torch.zeros(1, 3)
    log_prob = torch.tensor([[0.2, 0.0, 5.0]])
    loss, _ = gspo_policy_loss(log_prob, old, torch.ones(1, 3), torch.tensor([[1.0, 1.0, 0.0]]))
    assert loss.item() == pytest.approx(-math.exp(0.1), rel=1e-6)


def test_vanilla_equals_dapo_surrogate():
    gen = torch.Generator().manual_seed(3)
    log_prob, old, adv = (torch.randn(8, 10, generator=gen) for _ in range(3))
    mask = (torch.rand(8, 10, generator=gen) > 0.2).float()
    for low, high in ((0.2, 0.2), (0.2, 0.28)):
        a, ma = vanilla_policy_loss(log_prob, old, adv, mask, clip_ratio_low=low, clip_ratio_high=high)
        b, mb = policy_loss(log_prob, old, adv, mask, clip_ratio_low=low, clip_ratio_high=high)
        torch.testing.assert_close(a, b)
        assert {k: ma[k] for k in ma} == pytest.approx({k: mb[k] for k in ma})


def actor_config(mode: str, low: float, high: float, c: float, info: dict):
    """verl's actor config of the 32B experiment with these loss settings, instantiated by verl."""
    from recipe.config import compose

    cfg = compose(
        [
            "+experiment=qwen2_5_32b",
            f"{ACTOR}.policy_loss.loss_mode={mode}",
            f"{ACTOR}.clip_ratio_low={low}",
            f"{ACTOR}.clip_ratio_high={high}",
            f"{ACTOR}.clip_ratio_c={c}",
        ],
        "dapo_trainer",
    )
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    actor.global_batch_info.clear()
    actor.global_batch_info.update(info)
    return actor


@pytest.mark.parametrize("mode", ["vanilla", "gspo", "dapo"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_table_equals_verl_registry_on_random_inputs(mode, agg, seed):
    gen = torch.Generator().manual_seed(seed)
    n, t = 8, 12
    log_prob = torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.5  # [N, T]
    old = log_prob + torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(n, t, generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()  # [N, T]
    weights = torch.rand(n, t, generator=gen, dtype=torch.float64) + 0.5  # rollout correction
    info = {
        "dp_size": 2,
        "batch_num_tokens": int(mask.sum()) * 2,
        "global_batch_size": 2 * n,
        "loss_scale_factor": None,
    }
    low, high, c = 0.2, 0.28, 3.0
    if mode == "gspo":  # GSPO's own clip range, so both clipped and unclipped responses occur
        low, high = 3e-2, 4e-2
    actor = actor_config(mode, low, high, c, info)

    theirs_lp = log_prob.clone().requires_grad_(True)
    theirs, theirs_metrics = get_policy_loss_fn(mode)(old, theirs_lp, adv, mask, agg, actor, weights)
    ours_lp = log_prob.clone().requires_grad_(True)
    clips = {"clip_ratio_low": low, "clip_ratio_high": high, "clip_ratio_c": c}
    ours, ours_metrics = LOSS_MODES[mode](
        ours_lp, old, adv, mask, loss_agg_mode=agg, rollout_is_weights=weights, **clips, **info
    )
    # float64 inputs, the same formula in another order of operations: 8 x 12 = 96 terms of per-token losses
    # below |A| * max(ratio, c) * weight < 60 here, so the reordering bound is 96 * 4 * eps64 * 60 = 5e-12;
    # assert_close's float64 default (rtol 1e-7, atol 1e-7) is looser but far below any change of formula (> 1e-3)
    torch.testing.assert_close(ours, theirs)
    theirs.backward()
    ours.backward()
    torch.testing.assert_close(ours_lp.grad, theirs_lp.grad)  # the same gradient, not only the same value
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        # verl computes its metrics in float32: a share of 96 tokens or a mean of |log r| < 2, within 1e-6
        assert ours_metrics[key] == pytest.approx(float(theirs_metrics[key]), abs=1e-6)


def test_plugin_registers_only_what_verl_lacks():
    from verl.trainer.ppo import core_algos

    assert plugin.REGISTERED_HERE == ("dapo",)
    assert POLICY_LOSS_REGISTRY["vanilla"] is core_algos.compute_policy_loss_vanilla  # verl's, untouched
    assert POLICY_LOSS_REGISTRY["gspo"] is core_algos.compute_policy_loss_gspo
    assert set(LOSS_MODES) <= set(POLICY_LOSS_REGISTRY)  # every mode of the table trains on verl
