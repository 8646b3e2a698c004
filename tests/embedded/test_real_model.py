"""The "real model" path: ``actor_rollout_ref.model.path`` at a Hugging Face directory (a tiny Qwen2 saved with
``save_pretrained``, nothing downloaded), validated on AIME 2024 in verl's schema, trained by the same loop."""

from __future__ import annotations

import pytest

from recipe import cli
from recipe.common.task import AdditionTask
from recipe.embedded.monitor import read_metrics
from tests.conftest import tiny_qwen2


@pytest.mark.slow
def test_local_model_dir_trains_and_validates_on_aime(tiny_run, tmp_path, aime_parquet, capsys):
    task = AdditionTask(digits=1, val_size=16)
    train_file, _ = task.write_parquet(tmp_path / "data")
    model_dir = tmp_path / "tiny-qwen2"
    model, tokenizer = tiny_qwen2(task, hidden_size=64, num_hidden_layers=2, max_position_embeddings=4096)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    extra = {
        "actor_rollout_ref.model.path": str(model_dir),
        "data.train_files": str(train_file),
        "data.val_files": str(aime_parquet),
        "data.val_max_samples": 4,  # 4 of the 960 rows, 2 samples each
        "data.max_prompt_length": 1024,
        "data.filter_overlong_prompts": True,
        "algorithm.filter_groups.enable": False,  # an untrained model gets nothing right: train every group
        "trainer.total_training_steps": 1,
        "trainer.test_freq": 1,
    }
    assert cli.main(tiny_run(tmp_path / "run", extra)) == 0
    assert "warm-up" not in capsys.readouterr().out  # a given model is trained as it is

    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 1]
    assert records[0]["val-core/math_dapo/acc/mean@2"] == 0.0  # AIME is out of reach of a random 2-layer model
    assert records[1]["val-aux/math_dapo/score/mean@2"] == -1.0
    assert (tmp_path / "run" / "global_step_1" / "actor" / "config.json").is_file()
