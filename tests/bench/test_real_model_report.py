"""bench.experiments.real_model: both engines' metrics files read alike, the rise's interval worked by hand, the figure
drawn."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.common import read_steps
from bench.experiments import real_model

VAL = "val-core/word_problems/acc/mean@1"


def _lines(path: Path, records: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def runs(tmp_path):
    embedded = _lines(
        tmp_path / "embedded",
        [  # flat records, validation in the step's own record
            {"step": 0, VAL: 0.5},
            {"step": 1, "timing_s/step": 40.0, "actor/entropy": 0.3, "dapo/kept_group_frac": 0.5},
            {"step": 2, "timing_s/step": 50.0, "actor/entropy": 0.2, "dapo/kept_group_frac": 0.25, VAL: 0.6},
        ],
    )
    verl = _lines(
        tmp_path / "verl",
        [  # verl's file logger: {"step", "data"}; validation after the last step again
            {"step": 0, "data": {VAL: 0.5}},
            {"step": 1, "data": {"timing_s/step": 90.0, "actor/entropy": 0.3}},
            {"step": 2, "data": {"timing_s/step": 70.0, "actor/entropy": 0.25}},
            {"step": 2, "data": {VAL: 0.55}},
        ],
    )
    return embedded, verl


def test_both_formats_read_alike_and_a_repeated_step_is_merged(runs):
    embedded, verl = (read_steps(r) for r in runs)
    assert real_model.series(embedded, real_model.VAL_PREFIX) == [(0, 0.5), (2, 0.6)]
    assert real_model.series(verl, real_model.VAL_PREFIX) == [(0, 0.5), (2, 0.55)]
    assert verl[2] == {"timing_s/step": 70.0, "actor/entropy": 0.25, VAL: 0.55}
    assert real_model.series(embedded, "actor/entropy") == [(1, 0.3), (2, 0.2)]


def test_the_rise_and_its_interval_worked_by_hand():
    # 0.5 -> 0.6 over 256 problems: se = sqrt(0.5*0.5/256 + 0.6*0.4/256) = sqrt(0.49/256) = 0.7/16 = 0.04375,
    # 1.959964 * se = 0.085748
    rise, low, high = real_model.rise_interval(0.5, 0.6, 256)
    assert math.isclose(rise, 0.1) and low == pytest.approx(0.1 - 0.085748, abs=1e-6)
    assert high == pytest.approx(0.1 + 0.085748, abs=1e-6)


def test_summary_table_and_figure(runs, tmp_path, capsys):
    embedded, verl = runs
    figure = tmp_path / "real-model.png"
    out = tmp_path / "summary.json"
    assert (
        real_model.main(
            ["--run", f"embedded={embedded}", "--run", f"verl={verl}", "--figure", str(figure), "--json", str(out)]
        )
        == 0
    )
    figures = json.loads(out.read_text())
    assert figures["embedded"]["train_s"] == 90.0 and figures["verl"]["train_s"] == 160.0
    assert figures["embedded"]["steps"] == 2 and math.isclose(figures["verl"]["rise"], 0.05)
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "+0.100 [+0.014, +0.186]" in capsys.readouterr().out


def test_a_missing_run_names_the_command(tmp_path):
    with pytest.raises(SystemExit, match="make train-smollm2"):
        read_steps(tmp_path / "nowhere")


def test_the_wandb_check_names_what_the_offline_run_lacks(runs):
    embedded, _ = runs
    steps = read_steps(embedded)
    assert real_model.missing_from_wandb(embedded, steps) is None  # no W&B run at all
    run_file = embedded / "wandb" / "offline-run-1" / "run-1.wandb"
    run_file.parent.mkdir(parents=True)
    run_file.write_bytes(b"\x00timing_s/step\x01actor/entropy\x02" + VAL.encode())  # names inside binary records
    assert real_model.missing_from_wandb(embedded, steps) == ["dapo/kept_group_frac"]


def test_a_run_spec_without_a_label_is_refused(runs):
    with pytest.raises(SystemExit, match="LABEL=DIR"):
        real_model.main(["--run", str(runs[0])])
