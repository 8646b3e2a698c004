"""The registered ``dapo`` loss, called the ways verl calls it, equals ``dapo.loss`` called directly.

1. through the registry: ``get_policy_loss_fn("dapo")`` on padded tensors with a real ``FSDPActorConfig``;
2. through ``verl.workers.utils.losses.ppo_loss``, the function verl's FSDP engine runs per micro-batch, on
   nested (unpadded) TensorDicts split into micro-batches, with the mini-batch token count the engine would
   compute from the overlong-filtered loss mask: the micro-batch losses sum to the whole-batch loss of
   ``dapo.loss.policy_loss`` on the filtered mask.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

pytest.importorskip("verl")
pytestmark = pytest.mark.numerics
from verl.trainer.ppo.core_algos import get_policy_loss_fn  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

import recipe.dapo.policy_loss  # noqa: E402,F401  registers "dapo" (the plugin does this in verl's workers)
from dapo.loss import overlong_filter_mask, policy_loss  # noqa: E402
from tests.conftest import EPS32, EPS64, reorder_bound  # noqa: E402

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
# actor_config's clip range and dual-clip bound, as dapo.loss names them
CLIPS_32B = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 10.0}
MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.fixture(scope="module")
def actor_config():
    """The 32B run's actor config, instantiated by verl (clip 0.2 / 0.28, clip_ratio_c 10, loss_mode dapo)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose("dapo_trainer", overrides=["+experiment=qwen2_5_32b"])
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def set_batch_info(config, info: dict) -> None:
    """What the engine does before each micro-batch (the dataclass field is frozen, its dict is not)."""
    config.global_batch_info.clear()
    config.global_batch_info.update(info)


def random_batch(seed: int, n: int, t: int):
    gen = torch.Generator().manual_seed(seed)
    # float64: the tests compare the same algebra reached two ways, so only the order of float64 sums may differ
    log_prob = torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.5  # [N, T]
    old = log_prob + torch.randn(n, t, generator=gen, dtype=torch.float64) * 0.4  # ratios on both sides of the clip
    adv = torch.randn(n, t, generator=gen, dtype=torch.float64) * 2
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()  # [N, T] right-padded responses
    return log_prob, old, adv, mask, lengths


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_registry_dispatch_equals_dapo_loss(actor_config, mode, seed):
    log_prob, old, adv, mask, _ = random_batch(seed, 8, 12)
    batch_info = {
        "dp_size": 2,
        "batch_num_tokens": int(mask.sum()) * 2,
        "global_batch_size": 16,
        "loss_scale_factor": None,
    }
    set_batch_info(actor_config, batch_info)
    # verl's signature: old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
    via_verl, verl_metrics = get_policy_loss_fn("dapo")(old, log_prob, adv, mask, mode, actor_config, None)
    direct, metrics = policy_loss(log_prob, old, adv, mask, loss_agg_mode=mode, **CLIPS_32B, **batch_info)
    torch.testing.assert_close(via_verl, direct, rtol=0, atol=0)
    assert verl_metrics == metrics


def test_registry_dispatch_passes_rollout_is_weights(actor_config):
    log_prob, old, adv, mask, _ = random_batch(3, 6, 10)
    weights = torch.rand(6, 10, generator=torch.Generator().manual_seed(3))
    set_batch_info(actor_config, {})
    via_verl, _ = get_policy_loss_fn("dapo")(old, log_prob, adv, mask, "token-mean", actor_config, weights)
    direct, _ = policy_loss(log_prob, old, adv, mask, rollout_is_weights=weights, **CLIPS_32B)
    torch.testing.assert_close(via_verl, direct, rtol=0, atol=0)  # the same function on the same tensors


def nested(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def engine_micro_batch(rows, *, batch_num_tokens: int, global_batch_size: int):
    """One micro-batch as verl's engine hands it to ppo_loss: nested tensors + the mini-batch totals, and the
    model output (log-probs over the whole prompt + response, shifted by one as the model produces them)."""
    data = tu.get_tensordict(
        {
            "prompts": nested([r["prompt"] for r in rows]),
            "responses": nested([r["response"] for r in rows]),
            "response_mask": nested([r["mask"] for r in rows]),
            "old_log_probs": nested([r["old"] for r in rows]),
            "advantages": nested([r["adv"] for r in rows]),
        },
        non_tensor_dict={"dp_size": 1, "batch_num_tokens": batch_num_tokens, "global_batch_size": global_batch_size},
    )
    sequence_log_probs = []
    for r in rows:
        full = torch.zeros(len(r["prompt"]) + len(r["response"]))  # position p predicts token p + 1
        full[len(r["prompt"]) - 1 : len(r["prompt"]) - 1 + len(r["response"])] = r["log_prob"]
        sequence_log_probs.append(full)
    return {"log_probs": nested(sequence_log_probs)}, data


def test_ppo_loss_micro_batches_with_overlong_filter_sum_to_whole_batch(actor_config):
    # 8 responses of lengths 1..12, cut at T = 12; responses 2 and 5 reached 12 tokens without EOS: truncated
    n, t, eos = 8, 12, 1
    log_prob, old, adv, mask, lengths = random_batch(7, n, t)
    lengths[[2, 5]] = t
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()  # [N, T]
    responses = torch.randint(2, 9, (n, t), generator=torch.Generator().manual_seed(7))
    for i in range(n):
        if i not in (2, 5):
            responses[i, lengths[i] - 1] = eos  # the others stopped at EOS
    truncated = torch.zeros(n, dtype=torch.bool)
    truncated[[2, 5]] = True
    filtered = overlong_filter_mask(mask, truncated)  # what DAPOTrainer writes into response_mask and loss_mask
    rows = [
        {
            "prompt": torch.full((3,), 5),
            "response": responses[i, : lengths[i]],
            "mask": filtered[i, : lengths[i]],
            "old": old[i, : lengths[i]],
            "adv": adv[i, : lengths[i]],
            "log_prob": log_prob[i, : lengths[i]],
        }
        for i in range(n)
    ]
    batch_num_tokens = int(filtered.sum())  # the engine: loss_mask.sum(), before micro-batching
    set_batch_info(actor_config, {})
    total = torch.tensor(0.0)
    for micro in (rows[:3], rows[3:5], rows[5:]):
        output, data = engine_micro_batch(micro, batch_num_tokens=batch_num_tokens, global_batch_size=n)
        loss, _ = ppo_loss(actor_config, output, data)
        total = total + loss

    whole, _ = policy_loss(
        log_prob * mask,
        old * mask,
        adv * mask,
        filtered,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=10.0,
        loss_agg_mode="token-mean",
    )
    # a token-mean over 96 tokens in 3 partial sums or one. verl's ppo_loss hands back float32-rounded values
    # whatever the inputs' dtype (measured: a 1.5e-8 relative gap), so: a float32 rounding of each token's loss
    # (at most |A| * max(ratio, c)) and of each of the 3 partial sums, on top of the float64 reordering
    per_token = (adv.abs() * torch.maximum((log_prob - old).exp(), torch.tensor(10.0)))[filtered.bool()].mean()
    bound = 4 * EPS32 * per_token.item() + reorder_bound(n * t, 4, EPS64, per_token.item())
    torch.testing.assert_close(total, whole.to(total.dtype), rtol=0, atol=bound)
    # the truncated responses count neither in the numerator nor in the denominator:
    # sum(l * m) / 53 with the filter (lengths 1..12 here sum to 77 - 24 truncated tokens = 53)
    assert batch_num_tokens == int(mask.sum()) - 2 * t
    unfiltered, _ = policy_loss(
        log_prob * mask, old * mask, adv * mask, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0
    )
    assert (total - unfiltered.to(total.dtype)).abs().item() > 10 * bound  # the filter is visible above rounding
