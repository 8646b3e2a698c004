"""The benches' real-model settings compose what they say: ``bench.compare.engines --real-model`` runs the two
real-model configs with the same overrides, ``bench.compare.trl_grpo --real-model`` reads
configs/embedded_smollm2.yaml and gives TRL the engine's precision, and ``bench.experiments.ablation_start`` finds a
configured model's data and end tokens."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from bench.compare import engines, trl_grpo
from bench.compare.trl_peer import trl_grpo_kwargs
from recipe.common.cpu import cpu_has_bf16
from recipe.config import compose
from recipe.embedded.config import read_config
from recipe.embedded.policy import bf16_compute


def test_bench_engines_real_model_runs_both_real_model_configs_with_the_same_overrides():
    overrides = engines.shared_overrides(4, real_model=True)
    embedded = compose(overrides, "embedded_smollm2")
    verl = compose(["+experiment=cpu_smollm2", *overrides], "dapo_trainer")
    for key in (
        "trainer.total_training_steps",
        "trainer.test_freq",
        "data.val_max_samples",
        "data.max_response_length",
        "actor_rollout_ref.model.path",
        "data.train_files",
    ):
        assert OmegaConf.select(embedded, key) == OmegaConf.select(verl, key), key
    assert embedded.trainer.total_training_steps == 4 and embedded.trainer.save_freq == -1
    assert embedded.data.val_max_samples == 64 and embedded.data.max_response_length == 104
    # the tiny setting is unchanged
    assert "data.max_response_length=8" in engines.shared_overrides(8)


@pytest.mark.parametrize("preset", ["default", "real-model"])
def test_bench_trl_presets_compose_their_config(preset, tmp_path):
    spec = trl_grpo.PRESETS[preset]
    assert spec["steps"] % spec["eval_every"] == 0
    overrides = trl_grpo.engine_overrides(tmp_path / "run", spec["steps"], spec["eval_every"], None, 0)
    _, c = trl_grpo.engine_config(overrides + spec["overrides"], spec["config"])
    assert c.trainer.total_training_steps == spec["steps"] and c.trainer.save_freq == spec["eval_every"]
    kwargs = trl_grpo_kwargs(c, str(tmp_path / "trl"), spec["steps"])
    # 8 prompts x 4 responses in micro-batches of 16 (real model), B/b updates per rollout either way
    assert (
        kwargs["max_steps"]
        == spec["steps"] * c.data.train_batch_size // c.actor.ppo_mini_batch_size * c.actor.ppo_epochs
    )
    assert kwargs["max_completion_length"] == c.data.max_response_length
    if preset == "real-model":
        assert c.model.path.endswith("smollm2/run/model") and c.data.max_response_length == 104
        assert kwargs["bf16"] == cpu_has_bf16()  # TRL computes as the engine does: bf16 where this CPU has it
    else:
        assert c.model.path is None and kwargs["bf16"] is False  # the tiny model: fp32 on a CPU (embedded.dtype=auto)


def test_trl_precision_follows_the_engine_dtype():
    base = read_config(compose([], "embedded_smollm2"))
    assert bf16_compute(read_config(compose(["embedded.dtype=float32"], "embedded_smollm2"))) is False
    assert bf16_compute(base) is cpu_has_bf16()


def test_start_model_bench_counts_operations_of_both_tasks():
    from bench.experiments.ablation_start import ANSWER_LINE, _operations

    assert _operations({"num_ops": 3, "solution": "a\nb\nc\nd\nAnswer: 1"}) == 3  # word problems
    assert _operations({"solution": "12 + 3 = 15\n15 + 4 = 19\nAnswer: 19"}) == 2  # the chain tasks: lines
    assert ANSWER_LINE.search("so 4 + 5 = 9.\nAnswer: 9").group(1) == "9"
    assert ANSWER_LINE.search("The answer is: 22") is None  # what the base model writes; the scorer reads nothing
