"""Two ways must agree: one training step with micro-batches of 1 response and with micro-batch = mini-batch.

The token-mean loss of a micro-batch is divided by the token count of the whole mini-batch (DAPO's token-level
loss, ``batch_num_tokens``), so the accumulated gradient, and hence the parameters after the AdamW step, do not
depend on the micro-batch size. That is exact algebra, so the step runs in float64 end to end (the
``float64_end_to_end`` fixture keeps transformers' RMSNorm out of float32; attention is sdpa, which computes in the
model's dtype): the only difference left is the order of float64 sums, and the tolerance is the bound that order
allows (:func:`_weight_bound`). A deliberately wrong normaliser (each micro-batch divided by its own token count,
verl's behaviour before 0.8) is shown to break that bound by orders of magnitude, so the test can fail.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from dapo import loss as dapo_loss
from recipe import cli
from recipe.config import compose
from recipe.embedded.monitor import read_metrics
from tests.conftest import EPS64

pytestmark = pytest.mark.numerics

LR = 1e-3
ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which the engine uses
OPTIMIZER_STEPS = 2  # 4 prompts x 4 responses in mini-batches of 2 prompts
RESPONSES_PER_MINI_BATCH = 8
DEPTH = 2 * 4 + 2  # the tiny model's 4 layers (attention and MLP each), the embedding and the head


def _step(tiny_run, run_dir, micro: int, loss_agg_mode: str) -> tuple[dict[str, torch.Tensor], dict]:
    extra = {
        "embedded.dtype": "float64",
        "trainer.total_training_steps": 1,
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": 1,
        # 4 prompts x 4 responses, mini-batches of 2 prompts = 8 responses: 2 optimizer steps, the second one
        # off-policy (ratio != 1), so the clip and its gradient masking are part of what must agree
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": micro,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8,
        "actor_rollout_ref.actor.loss_agg_mode": loss_agg_mode,
        "actor_rollout_ref.actor.optim.lr": LR,
        "actor_rollout_ref.actor.entropy_coeff": 0.01,
    }
    assert cli.main(tiny_run(run_dir, extra)) == 0
    weights = load_file(run_dir / "global_step_1" / "actor" / "model.safetensors")
    (record,) = [r for r in read_metrics(run_dir) if r["step"] == 1]
    return weights, record


def _weight_bound(record: dict, tiny_run) -> float:
    """How far two summation orders can move a weight after the step, in float64.

    - A gradient element is a sum over the mini-batch's tokens (at most ``tokens`` terms, each one a chain of
      ``DEPTH`` layers' products); summed in another order it differs by at most ``tokens * DEPTH * eps64`` times
      the sum of its terms' magnitudes, which is taken as the gradient norm (no cancellation by more than that).
    - AdamW turns a gradient change δg into a weight change of at most ``lr * δg / eps_adam``: the slope of
      ``g / (sqrt(v) + eps)`` is largest, ``1 / eps``, at g = 0. Two optimizer steps add two such changes.
    """
    from recipe.embedded.config import read_config

    c = read_config(compose(tiny_run()))
    tokens = RESPONSES_PER_MINI_BATCH * (
        c.data.max_prompt_length + c.data.max_response_length
    )  # prompt + response rows
    delta_g = tokens * DEPTH * EPS64 * max(record["actor/grad_norm"], 1.0)
    return OPTIMIZER_STEPS * LR * delta_g / ADAM_EPS


def _max_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    return max(((a[name] - b[name]).abs().max().item(), name) for name in b)


@pytest.mark.slow
@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_size_does_not_change_the_update(
    tiny_run, tiny_start_weights, tmp_path, float64_end_to_end, loss_agg_mode
):
    per_response, metrics_1 = _step(tiny_run, tmp_path / "micro1", 1, loss_agg_mode)
    whole, metrics_8 = _step(tiny_run, tmp_path / "micro8", 8, loss_agg_mode)
    start = tiny_start_weights

    # the same rollouts were trained on (generation does not depend on the micro-batch size)
    for key in ("critic/score/mean", "response_length/mean", "train/acc/mean"):
        assert metrics_1[key] == metrics_8[key]
    # a norm over P parameters summed in another order: relative error at most P * eps64 (P < 2e6 here: < 5e-10)
    assert metrics_1["actor/grad_norm"] == pytest.approx(metrics_8["actor/grad_norm"], rel=2e6 * EPS64)
    for name, value in whole.items():
        assert value.dtype == torch.float64
        assert (value - start[name].double()).abs().max() > 1e-6, f"{name} did not move: nothing to compare"
    bound = _weight_bound(metrics_8, tiny_run)
    gap, name = _max_gap(per_response, whole)
    assert gap <= bound, f"{name}: micro-batches of 1 and of 8 differ by {gap:.3g}, float64 allows {bound:.3g}"


@pytest.mark.slow
def test_a_per_micro_batch_normaliser_breaks_the_bound(tiny_run, tmp_path, float64_end_to_end, monkeypatch):
    """The bound above is tight enough to catch the bug it guards against: with each micro-batch's token-mean
    divided by its own token count (``batch_num_tokens`` dropped), the update depends on the micro-batch size."""
    whole, metrics_8 = _step(tiny_run, tmp_path / "micro8", 8, "token-mean")
    correct = dapo_loss.LOSS_MODES["dapo"]

    def per_micro_batch(*args, batch_num_tokens=None, **kwargs):
        return correct(*args, **kwargs)  # normalised by this micro-batch's own tokens

    monkeypatch.setitem(dapo_loss.LOSS_MODES, "dapo", per_micro_batch)
    wrong, _ = _step(tiny_run, tmp_path / "wrong", 1, "token-mean")
    bound = _weight_bound(metrics_8, tiny_run)
    gap, name = _max_gap(wrong, whole)
    assert gap > 100 * bound, f"a wrong normaliser moved {name} by only {gap:.3g} (bound {bound:.3g})"
