"""Bad input gets one clear line naming the fix (``dapo-train: error: ...``, exit status 2), never a traceback."""

from __future__ import annotations

import sys
import types

import pandas as pd
import pytest

from recipe import cli
from recipe.common.task import AdditionTask
from tests.conftest import run_process


def _rows(digits: int = 1) -> list[dict]:
    return AdditionTask(digits=digits, val_size=16).rows("train")


def _parquet(tmp_path, rows, name="train.parquet"):
    path = tmp_path / name
    pd.DataFrame(rows).to_parquet(path, index=False)
    return str(path)


def _error(capsys, overrides) -> str:
    assert cli.main(overrides) == 2
    err = capsys.readouterr().err
    assert err.startswith("dapo-train: error: ") and "Traceback" not in err
    return err


def test_misspelt_key_fails_at_once_naming_it_without_traceback():
    # a real process, as the user runs it: composing fails before anything else is imported or built
    result = run_process([sys.executable, "-m", "recipe.cli", "data.trian_batch_size=8"], timeout=120)
    assert result.returncode == 2
    assert "dapo-train: error: Could not override 'data.trian_batch_size'" in result.stderr
    assert "Key 'trian_batch_size' is not in struct" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_engine_help_and_the_composed_config(capsys):
    assert "dapo.engine='tpu' is unknown; use one of embedded, verl" in _error(capsys, ["dapo.engine=tpu"])
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    # the configs it can compose, the keys most runs set, the exit codes
    assert "embedded, embedded_smollm2" in out and "trainer.default_local_dir" in out and "75 stopped by" in out
    # --cfg job (Hydra's flag) prints the composed config with the overrides, and trains nothing
    assert cli.main(["--cfg", "job", "trainer.total_training_steps=7", "--config-name", "embedded_smollm2"]) == 0
    printed = capsys.readouterr().out
    assert (
        "total_training_steps: 7" in printed and "max_response_length: 104" in printed and "engine: embedded" in printed
    )


def test_batch_not_divisible_by_mini_batch(tiny_run, capsys):
    err = _error(capsys, tiny_run(extra={"data.train_batch_size": 6, "actor_rollout_ref.actor.ppo_mini_batch_size": 4}))
    assert "data.train_batch_size=6" in err and "ppo_mini_batch_size=4" in err


def test_mini_batch_not_divisible_by_micro_batch(tiny_run, capsys):
    err = _error(capsys, tiny_run(extra={"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 3}))
    assert "ppo_micro_batch_size_per_gpu=3" in err and "2 prompts x 4 responses = 8" in err


def test_missing_columns(tiny_run, tmp_path, capsys):
    rows = [{k: v for k, v in row.items() if k != "reward_model"} for row in _rows()]
    err = _error(capsys, tiny_run(extra={"data.train_files": _parquet(tmp_path, rows)}))
    assert "data.train_files" in err and "reward_model" in err and "verl's schema" in err


def test_row_without_ground_truth(tiny_run, tmp_path, capsys):
    rows = _rows()
    rows[3]["reward_model"] = {"ground_truth": "", "style": "rule"}
    err = _error(capsys, tiny_run(extra={"data.train_files": _parquet(tmp_path, rows)}))
    assert "1 of 65 rows have no reward_model.ground_truth (rows [3])" in err


def test_overlong_prompt_fails_naming_the_keys(tiny_run, tmp_path, capsys):
    rows = _rows()
    rows[5]["prompt"] = [{"role": "user", "content": rows[5]["prompt"][0]["content"] + " 1 2 3 4 5 6 7 8 9" * 10}]
    err = _error(capsys, tiny_run(extra={"data.train_files": _parquet(tmp_path, rows)}))
    assert "1 of 65 prompts are longer than data.max_prompt_length=32" in err
    assert "data.filter_overlong_prompts=True" in err


def test_overlong_prompt_filtered_and_counted(tiny_run, tmp_path, capsys):
    rows = _rows()
    for row in rows[:2]:
        row["prompt"] = [{"role": "user", "content": row["prompt"][0]["content"] + " 1 2 3 4 5 6 7 8 9" * 10}]
    extra = {
        "data.train_files": _parquet(tmp_path, rows),
        "data.filter_overlong_prompts": True,
        "trainer.total_training_steps": 1,
        "trainer.val_before_train": False,
    }
    assert cli.main(tiny_run(extra=extra)) == 0
    assert "filtered out 2 of 65 prompts longer than data.max_prompt_length=32" in capsys.readouterr().out


def test_every_group_filtered_for_max_num_gen_batches_rounds(tiny_run, tmp_path, capsys):
    # a scorer that calls every response correct: every group is constant, dynamic sampling can keep none
    scorer = tmp_path / "always_right.py"
    scorer.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': 1.0, 'acc': True, 'pred': ground_truth}\n"
    )
    extra = {
        "reward.custom_reward_function.path": str(scorer),
        "algorithm.filter_groups.max_num_gen_batches": 2,
        "trainer.val_before_train": False,
    }
    err = _error(capsys, tiny_run(extra=extra))
    assert "step 1:" in err and "0 of 4 groups" in err and "max_num_gen_batches=2" in err
    assert "12 groups all correct" in err


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("algorithm.adv_estimator=gae", "algorithm.adv_estimator=grpo"),
        ("actor_rollout_ref.actor.use_kl_loss=true", "use_kl_loss=false"),
        ("actor_rollout_ref.actor.loss_agg_mode=token-avg", "token-mean"),
        ("algorithm.filter_groups.metric=reward", "algorithm.filter_groups.metric"),
        ("actor_rollout_ref.rollout.val_kwargs.do_sample=false", "val_kwargs.n=1"),
        ("+dapo.sampling.carry_overr=true", "dapo.sampling"),
    ],
)
def test_settings_the_engine_cannot_use(tiny_run, capsys, override, fragment):
    assert fragment in _error(capsys, [*tiny_run(), override])


def test_verl_engine_is_dispatched_lazily(monkeypatch, capsys):
    calls = []
    fake = types.ModuleType("recipe.dapo.main_dapo")
    fake.run_dapo = calls.append
    monkeypatch.setitem(sys.modules, "recipe.dapo.main_dapo", fake)
    assert cli.main(["dapo.engine=verl", "trainer.total_training_steps=3"]) == 0
    (config,) = calls
    assert config.trainer.total_training_steps == 3 and config.dapo.engine == "verl"


def test_verl_engine_missing_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "recipe.dapo.main_dapo", None)  # import fails as if the file were absent
    err = _error(capsys, ["dapo.engine=verl"])
    assert "dapo.engine=verl needs recipe.dapo.main_dapo, which cannot be imported" in err
    assert "or set dapo.engine to another one" in err
