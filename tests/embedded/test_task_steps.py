"""The ablation's task: ``addition_steps``, a + b answered after column-by-column working."""

from __future__ import annotations

import pytest

from dapo.reward import compute_score
from recipe.common.task import StepsAdditionTask, build_tokenizer, solution_text, worked_solution
from recipe.common.warmup import task_files
from recipe.embedded.config import ConfigError


def test_worked_solution_by_hand():
    # 47 + 385: 7+5=12 carry 1; 4+8+1=13 carry 1; 0+3+1=4 -> 432
    assert worked_solution(47, 385) == "7+5=12\n4+8+1=13\n0+3+1=4\nAnswer: 432"
    # 999 + 1: the final carry goes into the answer, not into a fourth column
    assert worked_solution(999, 1) == "9+1=10\n9+0+1=10\n9+0+1=10\nAnswer: 1000"
    assert worked_solution(3, 4) == "3+4=7\nAnswer: 7"


def test_every_line_of_every_solution_is_true_and_the_scorer_accepts_the_answer():
    task = StepsAdditionTask(digits=3, val_size=50, train_size=400, seed=1)
    for row in task.rows("train") + task.rows("val"):
        text = solution_text(row)
        *columns, answer = text.split("\n")
        for line in columns:
            left, right = line.split("=")
            assert sum(int(x) for x in left.split("+")) == int(right), line
        truth = row["reward_model"]["ground_truth"]
        assert answer == f"Answer: {truth}"
        a, b = (int(x) for x in row["extra_info"]["raw_problem"].removeprefix("What is ").rstrip("?").split(" + "))
        assert int(truth) == a + b and len(columns) == max(len(str(a)), len(str(b)))
        assert compute_score("synthetic_addition", text, truth) == {"score": 1.0, "acc": True, "pred": truth}


def test_problems_are_distinct_held_out_and_vary_in_length():
    task = StepsAdditionTask(digits=3, val_size=100, train_size=900, seed=0)
    train = {r["extra_info"]["raw_problem"] for r in task.rows("train")}
    val = {r["extra_info"]["raw_problem"] for r in task.rows("val")}
    assert len(train) == 900 and len(val) == 100 and not train & val
    assert task.rows("val") == StepsAdditionTask(digits=3, val_size=100, train_size=900, seed=0).rows("val")
    tokenizer = build_tokenizer(task)
    lengths = {len(tokenizer(solution_text(r), add_special_tokens=False)["input_ids"]) for r in task.rows("train")}
    assert min(lengths) <= 10 and max(lengths) >= 28  # one column to three columns with carries


def test_bad_task_settings_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="tiny.task.name='subtraction' is unknown; the tasks are"):
        task_files(str(tmp_path), {"name": "subtraction"})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['train_size'\] under tiny.task"):
        task_files(str(tmp_path), {"name": "addition", "train_size": 10})
    with pytest.raises(ConfigError, match="raise tiny.task.digits or ask for fewer problems"):
        task_files(str(tmp_path), {"name": "addition_steps", "digits": 1, "val_size": 30, "train_size": 30})
    assert not list(tmp_path.rglob("*.parquet"))
