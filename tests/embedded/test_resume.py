"""Kill a real ``python -m recipe.cli`` process after a checkpoint, start it again with the same command, and the
steps after the checkpoint are those of an uninterrupted run: same metrics, same final parameters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from recipe import cli
from recipe.embedded.checkpoint import TRACKER
from recipe.embedded.monitor import read_metrics
from tests.conftest import run_process

STEPS = 6


def _comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("timing_s/")}


@pytest.mark.slow
def test_killed_run_resumes_where_it_stopped(tiny_run, tmp_path):
    extra = {
        "trainer.total_training_steps": STEPS,
        "trainer.save_freq": 1,
        "trainer.test_freq": 3,
        "trainer.max_actor_ckpt_to_keep": 2,
    }

    # the reference: uninterrupted
    reference_dir = tmp_path / "reference"
    assert cli.main(tiny_run(reference_dir, extra)) == 0
    reference = {r["step"]: _comparable(r) for r in read_metrics(reference_dir)}

    # the same command in a subprocess, killed with SIGKILL once checkpoint 2 is on disk
    run_dir = tmp_path / "killed"
    command = [sys.executable, "-m", "recipe.cli", *tiny_run(run_dir, extra)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "killed.log"
    with log.open("w") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    tracker = run_dir / TRACKER
    deadline = time.monotonic() + 240
    while not (tracker.is_file() and int(tracker.read_text() or 0) >= 2):
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint within 240 s"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL
    resumed_from = int(tracker.read_text())
    assert resumed_from < STEPS, "the process finished before it could be killed"

    # started again with the same command: it resumes from the latest checkpoint
    result = run_process(command, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"resumed from {run_dir / f'global_step_{resumed_from}'}" in result.stdout

    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(STEPS + 1))  # no step lost, none twice
    for record in records:
        assert _comparable(record) == reference[record["step"]], f"step {record['step']} differs"
    final = f"global_step_{STEPS}/actor/model.safetensors"
    expected, got = load_file(reference_dir / final), load_file(run_dir / final)
    for name in expected:
        assert (expected[name] == got[name]).all(), name


@pytest.mark.slow
def test_a_carry_over_run_resumed_from_its_checkpoint_trains_the_carried_groups(tiny_run, tmp_path):
    # dapo.sampling.carry_over keeps a step's surplus groups for the next one; the checkpoint holds them (with the
    # older policy's log-probs), so a run stopped after step 2 and extended to 4 trains steps 3 and 4 exactly as
    # an uninterrupted run does, the carried groups included
    extra = {
        "dapo.sampling.carry_over": True,
        "data.gen_batch_size": 8,  # twice the train batch: surplus groups to carry
        "trainer.save_freq": 1,
        "trainer.test_freq": -1,
    }
    reference_dir = tmp_path / "reference"
    assert cli.main(tiny_run(reference_dir, {**extra, "trainer.total_training_steps": 4})) == 0
    reference = {r["step"]: _comparable(r) for r in read_metrics(reference_dir)}
    assert reference[3]["dapo/carried_groups"] > 0, "no group carried into step 3: the test would show nothing"

    run_dir = tmp_path / "stopped"
    assert cli.main(tiny_run(run_dir, {**extra, "trainer.total_training_steps": 2})) == 0
    assert cli.main(tiny_run(run_dir, {**extra, "trainer.total_training_steps": 4})) == 0
    records = {r["step"]: _comparable(r) for r in read_metrics(run_dir)}
    assert sorted(records) == sorted(reference)
    for step in (3, 4):
        assert records[step] == reference[step], f"step {step} differs"
    final = "global_step_4/actor/model.safetensors"
    expected, got = load_file(reference_dir / final), load_file(run_dir / final)
    for name in expected:
        assert (expected[name] == got[name]).all(), name
