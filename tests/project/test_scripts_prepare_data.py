"""scripts/prepare_data.py on the real AIME 2024 parquet (tests/data) and on malformed files.

Nothing is downloaded: the hub path is only reached with a source that is not a file, and is not tested here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import run_process

REPO = Path(__file__).resolve().parents[2]
AIME = REPO / "tests" / "data" / "aime-2024.parquet"
SCRIPT = REPO / "scripts" / "prepare_data.py"

spec = importlib.util.spec_from_file_location("prepare_data", SCRIPT)
prepare_data = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prepare_data)


def run(*args: str) -> int:
    return prepare_data.main(list(args))


def test_aime_deduplicated_to_30_problems(tmp_path, capsys):
    assert run("--train", "none", "--val", str(AIME), "--out-dir", str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "deduplicated 960 rows to 30 unique prompts (930 repeats dropped)" in out  # 30 problems x 32 copies
    df = pd.read_parquet(tmp_path / "aime-2024.parquet")
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert len(df) == 30 and df["extra_info"].map(lambda e: e["index"]).tolist() == list(range(30))
    # same prompts and answers as the source, in first-seen order
    first = pd.read_parquet(AIME)
    first = first[~first["prompt"].map(lambda p: p[0]["content"]).duplicated()]

    def text(frame):
        return frame["prompt"].map(lambda p: p[0]["content"]).tolist()

    assert text(df) == text(first)
    assert (
        df["reward_model"].map(lambda r: r["ground_truth"]).tolist()
        == first["reward_model"].map(lambda r: r["ground_truth"]).tolist()
    )
    assert set(df["data_source"]) == {"math_dapo"} and set(df["ability"]) == {"MATH"}
    assert df["prompt"].map(lambda p: p[0]["role"]).eq("user").all()


def test_no_dedup_keeps_every_row(tmp_path, capsys):
    assert run("--train", "none", "--val", str(AIME), "--out-dir", str(tmp_path), "--no-dedup") == 0
    assert "kept all 960 rows" in capsys.readouterr().out
    assert len(pd.read_parquet(tmp_path / "aime-2024.parquet")) == 960


def test_verls_dataset_reads_the_output(tmp_path):
    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    assert run("--train", "none", "--val", str(AIME), "--out-dir", str(tmp_path)) == 0
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 4096,
            "filter_overlong_prompts": False,
            "return_raw_chat": True,
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    dataset = RLHFDataset(str(tmp_path / "aime-2024.parquet"), tokenizer=None, config=config)
    row = dataset[3]
    assert len(dataset) == 30 and row["index"] == 3
    assert row["raw_prompt"][0]["role"] == "user" and "Answer:" in row["raw_prompt"][0]["content"]
    assert row["reward_model"]["ground_truth"] and row["data_source"] == "math_dapo"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_raw_problem_rows_get_the_dapo_instruction(tmp_path, capsys):
    rows = [
        {"problem": "What is 2+2?", "answer": 4},
        {"question": "What is 3+3?", "answer": "6"},
        {"problem": "What is 2+2?", "answer": 5},
    ]  # a repeat with another answer: kept once, reported
    src = write_jsonl(tmp_path / "raw.jsonl", rows)
    assert run("--train", str(src), "--val", "none", "--out-dir", str(tmp_path / "out")) == 0
    out = capsys.readouterr().out
    assert "deduplicated 3 rows to 2 unique prompts" in out and "1 repeats had a different ground truth" in out
    df = pd.read_parquet(tmp_path / "out" / "dapo-math-17k.parquet")
    content = df["prompt"][0][0]["content"]
    assert content == prepare_data.DAPO_TEMPLATE.format(problem="What is 2+2?")
    assert [r["ground_truth"] for r in df["reward_model"]] == ["4", "6"]  # numbers become strings
    assert df["extra_info"][1]["raw_problem"] == "What is 3+3?"


def test_rows_without_ground_truth_are_an_error_naming_them(tmp_path, capsys):
    rows = [
        {"problem": "a", "answer": "1"},
        {"problem": "b"},
        {"problem": "c", "answer": ""},
        {"problem": "d", "answer": None},
    ]
    src = write_jsonl(tmp_path / "bad.jsonl", rows)
    assert run("--train", str(src), "--val", "none", "--out-dir", str(tmp_path / "out")) == 1
    err = capsys.readouterr().err
    assert "3 of 4 rows have no ground truth (rows 1, 2, 3)" in err and "--drop-invalid" in err
    assert not (tmp_path / "out").exists()
    assert run("--train", str(src), "--val", "none", "--out-dir", str(tmp_path / "out"), "--drop-invalid") == 0
    assert len(pd.read_parquet(tmp_path / "out" / "dapo-math-17k.parquet")) == 1


def test_verl_schema_rows_without_ground_truth(tmp_path, capsys):
    df = pd.DataFrame(
        {
            "data_source": ["math_dapo"] * 2,
            "prompt": [[{"role": "user", "content": "p1"}], [{"role": "user", "content": "p2"}]],
            "reward_model": [{"ground_truth": "3", "style": "x"}, {"ground_truth": None, "style": "x"}],
        }
    )
    src = tmp_path / "schema.parquet"
    df.to_parquet(src)
    assert run("--train", str(src), "--val", "none", "--out-dir", str(tmp_path / "out")) == 1
    assert "1 of 2 rows have no ground truth (rows 1)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("notparquet.parquet", "plain text", "cannot read it as parquet"),
        ("broken.jsonl", '{"problem": "a", "answer": 1}\n{not json\n', "cannot read it as jsonl"),
        ("table.csv", "problem,answer\na,1\n", "unsupported input '.csv'"),
        ("empty.jsonl", "", "holds no rows"),
        ("noprompt.jsonl", '{"answer": 1}\n', "1 of 1 rows have no prompt"),
    ],
)
def test_malformed_files(tmp_path, capsys, name, content, message):
    src = tmp_path / name
    src.write_text(content)
    assert run("--train", str(src), "--val", "none", "--out-dir", str(tmp_path / "out")) == 1
    assert message in capsys.readouterr().err


def test_missing_file_and_cli_exit_status(tmp_path):
    result = run_process(
        [sys.executable, str(SCRIPT), "--train", str(tmp_path / "nope.parquet"), "--val", "none"], timeout=120
    )
    assert result.returncode == 1 and "no such file" in result.stderr
