"""Two ways must agree: one training step with micro-batches of 1 response and with micro-batch = mini-batch.

The token-mean loss of a micro-batch is divided by the token count of the whole mini-batch (DAPO's token-level
loss, ``batch_num_tokens``), so the accumulated gradient, and hence the parameters after the AdamW step, do not
depend on the micro-batch size. Run in float64 so that the only difference left is summation order.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from recipe import cli
from recipe.embedded.monitor import read_metrics


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
        "actor_rollout_ref.actor.optim.lr": 1e-3,
        "actor_rollout_ref.actor.entropy_coeff": 0.01,
    }
    assert cli.main(tiny_run(run_dir, extra)) == 0
    weights = load_file(run_dir / "global_step_1" / "actor" / "model.safetensors")
    (record,) = [r for r in read_metrics(run_dir) if r["step"] == 1]
    return weights, record


@pytest.mark.slow
@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_size_does_not_change_the_update(tiny_run, tiny_start_weights, tmp_path, loss_agg_mode):
    per_response, metrics_1 = _step(tiny_run, tmp_path / "micro1", 1, loss_agg_mode)
    whole, metrics_8 = _step(tiny_run, tmp_path / "micro8", 8, loss_agg_mode)
    start = tiny_start_weights

    # the same rollouts were trained on (generation does not depend on the micro-batch size)
    for key in ("critic/score/mean", "response_length/mean", "train/acc/mean"):
        assert metrics_1[key] == metrics_8[key]
    # rel 1e-7: float32 rounding inside Qwen2's RMSNorm, see the weights' tolerance below (measured: 4e-9)
    assert metrics_1["actor/grad_norm"] == pytest.approx(metrics_8["actor/grad_norm"], rel=1e-7)
    for name, value in whole.items():
        assert value.dtype == torch.float64
        assert (value - start[name].double()).abs().max() > 1e-6, f"{name} did not move: nothing to compare"
        # atol 1e-7, not 1e-10: Qwen2's RMSNorm computes in float32 even in a float64 model (transformers 5.10,
        # Qwen2RMSNorm.forward casts to float32), so gradients through it are rounded to float32. The update's
        # shared-prompt forward (recipe/embedded/decode.py) sums a prompt's gradient over its responses before
        # that rounding, micro-batches of 1 response after it: the weights (moved by about 2e-3) differ by at most
        # 3e-8. A wrong normaliser would change them by a ratio of token counts, orders of magnitude more.
        torch.testing.assert_close(per_response[name], value, rtol=0, atol=1e-7, msg=name)
