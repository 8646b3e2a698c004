"""The ablation's task: ``chain``, a chain of one-digit additions and subtractions worked one line per operation."""

from __future__ import annotations

import re

import pytest

from dapo.reward import compute_score
from recipe.common.task import ChainTask, build_tokenizer, chain_solution, solution_text
from recipe.common.warmup import task_files
from recipe.config import compose
from recipe.embedded.config import ConfigError, read_config
from tests.conftest import prompt_lengths


def test_chain_solution_by_hand():
    # 17+5-3+8: 17+5=22, 22-3=19, 19+8=27
    assert chain_solution(17, [5, -3, 8]) == "17+5=22\n22-3=19\n19+8=27\nAnswer: 27"
    # crossing 10 both ways, and a start of 0
    assert chain_solution(0, [9, -9, 1]) == "0+9=9\n9-9=0\n0+1=1\nAnswer: 1"
    assert chain_solution(95, [4]) == "95+4=99\nAnswer: 99"


def test_rows_by_hand():
    task = ChainTask(min_steps=1, max_steps=4, val_size=3, train_size=5, seed=0)
    row = task.rows("val")[0]
    problem = row["extra_info"]["raw_problem"]
    start, *operands = (int(x) for x in re.findall(r"[+-]?\d+", problem.removeprefix("What is ").rstrip("?")))
    assert problem == f"What is {start}{''.join(f'{x:+d}' for x in operands)}?"
    assert row["reward_model"]["ground_truth"] == str(start + sum(operands))
    assert solution_text(row) == chain_solution(start, operands)
    assert problem in row["prompt"][0]["content"] and row["prompt"][0]["content"].startswith("Solve the following")


def _parse(row: dict) -> tuple[int, list[int]]:
    start, *operands = (int(x) for x in re.findall(r"[+-]?\d+", row["extra_info"]["raw_problem"][len("What is ") :]))
    return start, operands


def test_every_line_of_every_solution_is_true_and_the_scorer_accepts_the_answer():
    task = ChainTask(min_steps=1, max_steps=20, val_size=50, train_size=400, seed=1)
    steps_seen = set()
    for row in task.rows("train") + task.rows("val"):
        start, operands = _parse(row)
        text = solution_text(row)
        *lines, answer = text.split("\n")
        assert 1 <= len(lines) == len(operands) <= 20
        steps_seen.add(len(lines))
        value = start
        for line, operand in zip(lines, operands):
            left, right = line.split("=")
            assert left == f"{value}{operand:+d}"  # the line copies the running value and the next operation
            assert 0 <= int(right) == value + operand <= 99
            value = int(right)
        truth = row["reward_model"]["ground_truth"]
        assert answer == f"Answer: {truth}" and int(truth) == value
        assert compute_score("synthetic_addition", text, truth) == {"score": 1.0, "acc": True, "pred": truth}
        # a wrong final answer scores nothing, whatever the lines above it
        wrong = text.replace(f"Answer: {truth}", "Answer: 100")
        assert compute_score("synthetic_addition", wrong, truth)["acc"] is False
    assert steps_seen == set(range(1, 21))  # every chain length occurs


def test_problems_are_distinct_held_out_reproducible_and_span_an_order_of_magnitude_in_tokens():
    task = ChainTask(min_steps=1, max_steps=20, val_size=100, train_size=1500, seed=0)
    train = {r["extra_info"]["raw_problem"] for r in task.rows("train")}
    val = {r["extra_info"]["raw_problem"] for r in task.rows("val")}
    assert len(train) == 1500 and len(val) == 100 and not train & val
    assert task.rows("val") == ChainTask(min_steps=1, max_steps=20, val_size=100, train_size=1500, seed=0).rows("val")
    assert task.rows("val") != ChainTask(min_steps=1, max_steps=20, val_size=100, train_size=1500, seed=1).rows("val")
    tokenizer = build_tokenizer(task)
    # one token per digit and sign, "=" and newline: "17+5=22\n" is 8 tokens; "Answer: " one token; EOS one more
    assert tokenizer.tokenize("17+5=22\n22-3=19\nAnswer: 19") == [
        "1",
        "7",
        "+",
        "5",
        "=",
        "2",
        "2",
        "Ċ",
        "2",
        "2",
        "-",
        "3",
        "=",
        "1",
        "9",
        "ĊAnswer:Ġ",
        "1",
        "9",
    ]
    lengths = [len(tokenizer(solution_text(r), add_special_tokens=False)["input_ids"]) + 1 for r in task.rows("train")]
    # shortest: one operation on one-digit values, "5+3=8\nAnswer: 8" + EOS = 8 tokens; longest: 20 lines of
    # 8 tokens (two-digit values throughout) + "Answer: " + 2 digits + EOS = 163 tokens (the bounds are exact)
    assert 8 <= min(lengths) <= 11 and 150 <= max(lengths) <= 163
    assert max(lengths) / min(lengths) >= 10


def test_the_chain_setting_budget_binds_for_the_longest_solutions_and_the_buffer_holds_the_long_ones():
    cfg = read_config(compose([], "ablation_chain"))
    assert cfg.tiny.task["name"] == "chain" and cfg.tiny.task["digits"] is None
    spec = ChainTask(**{k: v for k, v in cfg.tiny.task.items() if k not in ("name", "digits")})
    tokenizer = build_tokenizer(spec)
    lengths = [len(tokenizer(solution_text(r), add_special_tokens=False)["input_ids"]) + 1 for r in spec.rows("train")]
    budget, buffer = cfg.data.max_response_length, cfg.dapo.overlong.buffer_len
    over = sum(n > budget for n in lengths) / len(lengths)
    in_buffer = sum(budget - buffer < n <= budget for n in lengths) / len(lengths)
    assert 0.02 < over <= 0.12  # the longest chains (8 operations on two-digit values) do not fit the budget
    assert 0.10 < in_buffer < 0.40  # the long correct solutions are softly punished
    prompts = prompt_lengths(tokenizer, spec.rows("train"))
    assert max(prompts) <= cfg.data.max_prompt_length
    assert max(prompts) + budget <= cfg.tiny.model["max_position_embeddings"]


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"min_steps": 0},
            "tiny.task.min_steps and max_steps must satisfy 1 <= min_steps <= max_steps, got 0 and 20",
        ),
        ({"min_steps": 5, "max_steps": 4}, "1 <= min_steps <= max_steps, got 5 and 4"),
        ({"val_size": 0}, "tiny.task.val_size and tiny.task.train_size must be >= 1, got 0 and 4000"),
        (
            {"min_steps": 1, "max_steps": 1, "val_size": 100, "train_size": 400},
            r"500 is more than half of the 900 chains of 1 to 1 operations; raise tiny.task.max_steps",
        ),
        (
            {"digits": 3},
            r"unknown key\(s\) \['digits'\] under tiny.task; known: .*unset with tiny.task.digits=null",
        ),
    ],
)
def test_bad_chain_settings_name_the_key(tmp_path, settings, message):
    with pytest.raises(ConfigError, match=message):
        task_files(str(tmp_path), {"name": "chain", **settings})
    assert not list(tmp_path.rglob("*.parquet"))


def test_a_null_knob_is_unset(tmp_path):
    # configs/ablation.yaml unsets the addition tasks' digits inherited from configs/embedded.yaml
    out = task_files(str(tmp_path), {"name": "chain", "digits": None, "max_steps": 3, "val_size": 4, "train_size": 8})
    assert sorted(p.name for p in out.iterdir()) == ["done.json", "tokenizer", "train.parquet", "val.parquet"]
