"""W&B online but unreachable: a bounded, stated wait, then offline logging (no real address is contacted: the
server is a closed port on 127.0.0.1); and plots with labelled axes."""

from __future__ import annotations

import json
import socket
import time

import pytest

from recipe.common.metrics_file import metrics_line
from recipe.common.tracking import WANDB_CONNECT_TIMEOUT_S
from recipe.embedded.monitor import Monitor, read_metrics, write_plots


def _closed_port() -> int:
    with socket.socket() as s:  # bound and released: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fresh_wandb():
    """wandb keeps its settings (here the unreachable server and the fake key) in a per-process singleton: torn
    down afterwards, so that a later run in this process does not start from them."""
    import wandb

    yield
    wandb.teardown()


@pytest.mark.slow
def test_unreachable_wandb_falls_back_to_offline_within_the_stated_wait(tmp_path, monkeypatch, capsys, fresh_wandb):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)  # credentials present: the online path
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("WANDB_SILENT", "true")
    start = time.perf_counter()
    monitor = Monitor(
        tmp_path,
        loggers=["wandb"],
        project="p",
        experiment="e",
        config={},
        start_step=0,
        total_steps=1,
        progress_bar=False,
        wandb_id=None,
    )
    elapsed = time.perf_counter() - start
    monitor.log(1, {"critic/score/mean": 0.5})
    monitor.close()
    out = capsys.readouterr().out
    assert f"(at most {WANDB_CONNECT_TIMEOUT_S} s" in out
    assert "W&B is offline (http://127.0.0.1:" in out and "unreachable: ConnectionRefusedError" in out
    assert monitor.wandb_dir is not None and monitor.wandb_dir.name.startswith("offline-run-")
    assert elapsed < WANDB_CONNECT_TIMEOUT_S + 30  # a refused connection is immediate; wandb's offline start is not
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 1, "data": {"critic/score/mean": 0.5}}


def test_plots_label_both_axes_and_keep_score_and_accuracy_apart(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    records = [
        {
            "step": s,
            "critic/score/mean": -0.5 + 0.1 * s,
            "train/acc/mean": 0.2 + 0.05 * s,
            "val-core/x/acc/mean@4": 0.3,
            "actor/entropy": 0.4,
            "response_length/mean": 4.0,
            "response_length/max": 6.0,
            "dapo/kept_group_frac": 0.8,
        }
        for s in range(1, 4)
    ]
    lines = [metrics_line(r["step"], {k: v for k, v in r.items() if k != "step"}) for r in records]
    (tmp_path / "metrics.jsonl").write_text("".join(lines))
    figures = {p.name: f for p, f in write_plots(tmp_path, keep_figures=True).items()}
    for path, fig in figures.items():
        for ax in fig.axes:
            assert ax.get_xlabel() == "step" and ax.get_ylabel(), (path, ax.get_title())
    (score_ax, acc_ax) = figures["reward_accuracy.png"].axes
    assert {line.get_label() for line in score_ax.lines} == {"critic/score/mean"}
    assert {line.get_label() for line in acc_ax.lines} == {"train/acc/mean", "val-core/x/acc/mean@4"}
    assert "(-1 to 1)" in score_ax.get_ylabel() and "(0 to 1)" in acc_ax.get_ylabel()


@pytest.mark.slow
def test_warm_up_shows_a_progress_bar(tmp_path, capsys):
    from recipe.common.warmup import warm_model

    warm_model(
        str(tmp_path), {"digits": 1, "val_size": 16}, {}, {"steps": 3, "batch_size": 4}, device="cpu", progress_bar=True
    )
    captured = capsys.readouterr()
    assert "warm-up: 3 supervised steps" in captured.out and "warm-up: done" in captured.out
    assert "warm-up: 100%" in captured.err and "3/3" in captured.err


def test_metrics_jsonl_has_verls_line_format_and_a_resume_keeps_the_steps_before_it(tmp_path, monkeypatch):
    """Both engines write one format: the embedded engine's lines are byte for byte what verl's ``file`` logger
    writes for the same step and values; a resume keeps the records up to its step, and flat lines an earlier
    version wrote are still read."""
    from verl.utils.tracking import FileLogger

    values = [{"critic/score/mean": 0.5, "actor/entropy": 0.123456789, "dapo/kept_group_frac": 1.0}, {"x": -2.5}]
    args = dict(loggers=["console"], project="p", experiment="e", config={}, total_steps=3, progress_bar=False)
    monitor = Monitor(tmp_path, start_step=0, wandb_id=None, **args)
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "verl.jsonl"))
    verl = FileLogger("p", "e")
    for step, metrics in enumerate(values, start=1):
        monitor.log(step, metrics)
        verl.log(metrics, step)
    monitor.close()
    verl.finish()
    assert (tmp_path / "metrics.jsonl").read_bytes() == (tmp_path / "verl.jsonl").read_bytes()
    assert read_metrics(tmp_path) == [{"step": 1, **values[0]}, {"step": 2, **values[1]}]

    Monitor(tmp_path, start_step=1, wandb_id=None, **args).close()  # resumed at step 1: step 2's record dropped
    assert (tmp_path / "metrics.jsonl").read_text() == metrics_line(1, values[0])
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "x": 1.0}) + "\n")  # an earlier version's line
    assert read_metrics(tmp_path) == [{"step": 1, "x": 1.0}]
