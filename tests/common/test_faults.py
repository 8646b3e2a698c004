"""Faults and bad input on both entry points, on real processes: a second run in a busy run directory, Ctrl-C,
a full disk during a checkpoint, a reward function that raises or hangs, and the config values both entry points
refuse before any expensive work (the verl entry point: before Ray starts)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from recipe import cli
from recipe.common.rundir import LOCK_FILE
from recipe.common.task import AdditionTask
from recipe.config import compose
from recipe.embedded.checkpoint import TRACKER, damage
from recipe.embedded.monitor import read_metrics
from tests.conftest import interruptible, run_process

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def _start(args: list[str], log: Path, module: str = "recipe.cli") -> subprocess.Popen:
    with log.open("w") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=REPO,
            env=ENV,
            stdout=sink,
            stderr=subprocess.STDOUT,
            preexec_fn=interruptible,  # the tests send SIGINT, as Ctrl-C does
        )


def _wait(condition, process: subprocess.Popen, log: Path, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"exited ({process.returncode}) before {what}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


def _checkpointed(run_dir: Path, step: int):
    tracker = run_dir / TRACKER
    return lambda: tracker.is_file() and int(tracker.read_text() or 0) >= step


def _verl_args(tmp_path: Path, run_dir: Path, *extra: str) -> list[str]:
    parquet = tmp_path / "train.parquet"
    if not parquet.exists():
        pd.DataFrame(AdditionTask(digits=1, val_size=16).rows("train")).to_parquet(parquet, index=False)
    return [f"data.train_files={parquet}", f"data.val_files={parquet}", f"trainer.default_local_dir={run_dir}", *extra]


# ---------------------------------------------------------------------------------------------------- one run, one dir


@pytest.mark.slow
def test_a_second_run_in_a_busy_directory_refuses_at_once_on_both_entry_points(tiny_run, tmp_path):
    run_dir = tmp_path / "run"
    # long enough to be running while both second runs start; stopped with Ctrl-C once they have been refused
    args = tiny_run(run_dir, {"trainer.total_training_steps": 5000, "trainer.save_freq": 50, "trainer.test_freq": -1})
    first = _start(args, tmp_path / "first.log")
    try:
        _wait(
            lambda: (run_dir / LOCK_FILE).is_file() and (run_dir / LOCK_FILE).read_text(),
            first,
            tmp_path / "first.log",
            "lock",
        )
        for command in (
            [sys.executable, "-m", "recipe.cli", *args],
            [sys.executable, "-m", "recipe.dapo.main_dapo", *_verl_args(tmp_path, run_dir)],
        ):
            started = time.monotonic()
            second = run_process(command, cwd=REPO, env=ENV, timeout=300)
            assert second.returncode == 2, second.stderr[-2000:]
            message = second.stderr.strip().splitlines()[-1]
            assert (
                f"trainer.default_local_dir={str(run_dir)!r} is in use by another run (process {first.pid}" in message
            ), message
            assert "Traceback" not in second.stderr and "ray" not in second.stdout.lower()
            assert time.monotonic() - started < 120  # refused before any warm-up, model load or Ray
        assert first.poll() is None, "the first run ended before the second ones were refused: nothing was tested"
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=60)
    assert first.returncode == 130, (tmp_path / "first.log").read_text()[-3000:]
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == list(range(len(steps))) and len(steps) > 1  # the first run's records only, each once


# ---------------------------------------------------------------------------------------------------- Ctrl-C


@pytest.mark.slow
def test_ctrl_c_exits_in_seconds_in_one_line_and_the_same_command_resumes(tiny_run, tmp_path):
    steps = 5
    extra = {
        "trainer.total_training_steps": steps,
        "trainer.save_freq": 1,
        "trainer.test_freq": -1,
        "trainer.val_before_train": False,
    }
    reference_dir, run_dir = tmp_path / "reference", tmp_path / "run"
    assert cli.main(tiny_run(reference_dir, extra)) == 0
    log = tmp_path / "first.log"
    first = _start(tiny_run(run_dir, extra), log)
    _wait(_checkpointed(run_dir, 2), first, log, "checkpoint 2")
    first.send_signal(signal.SIGINT)
    sent = time.monotonic()
    first.wait(timeout=60)
    assert time.monotonic() - sent < 15
    text = log.read_text()
    assert first.returncode == 130, text[-2000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    assert f"dapo-train: interrupted; the checkpoints in {run_dir} are kept" in text
    resumed = run_process(
        [sys.executable, "-m", "recipe.cli", *tiny_run(run_dir, extra)], cwd=REPO, env=ENV, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == list(range(1, steps + 1))  # one record per step, none twice
    reference = {r["step"]: r for r in read_metrics(reference_dir)}
    for record in records:
        assert record["critic/score/mean"] == reference[record["step"]]["critic/score/mean"], record["step"]


# ---------------------------------------------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem of 20 MiB (tmpfs), so that a write fails with ENOSPC; skipped where mounting is not
    allowed (not root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({result.stderr.strip()}): run as root to test a full disk")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_is_named_and_never_taken_for_a_checkpoint(tiny_run, tmp_path, small_disk):
    run_dir = small_disk / "run"
    # a checkpoint of the tiny model holds about 12 MiB (weights, tokenizer, AdamW state): 20 MiB fit one
    extra = {
        "trainer.total_training_steps": 4,
        "trainer.save_freq": 1,
        "trainer.test_freq": -1,
        "trainer.val_before_train": False,
    }
    result = run_process(
        [sys.executable, "-m", "recipe.cli", *tiny_run(run_dir, extra)], cwd=REPO, env=ENV, timeout=600
    )
    assert result.returncode == 1, result.stderr[-3000:]
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("dapo-train: stopped: saving the step-") and "Traceback" not in result.stderr
    assert f"checkpoint into {run_dir} failed (no space left on device" in message, message
    failed = int(message.split("step-")[1].split(" ")[0])
    assert failed >= 2 and not (run_dir / f"global_step_{failed}").exists()
    assert not list(run_dir.glob("*.tmp"))  # no partial checkpoint left to be mistaken for one
    assert int((run_dir / TRACKER).read_text()) == failed - 1
    assert damage(run_dir / f"global_step_{failed - 1}") is None  # the last one written is intact


# ---------------------------------------------------------------------------------------------------- reward function


def _scorer(tmp_path: Path, fail: str) -> str:
    """A scorer that answers the start-up probe (its first two calls) and then ``fail``s."""
    path = tmp_path / "scorer.py"
    path.write_text(
        "import time\n"
        "calls = 0\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    if calls <= 2:\n"
        "        return 1.0\n"
        f"    {fail}\n"
    )
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "fail, fragment",
    [
        ("raise KeyError('answer')", "raised KeyError: 'answer' on the row data_source="),
        ("return 'right'", "returned 'right' on the row data_source="),
        ("return None", "returned None on the row data_source="),
        ("time.sleep(3600)", "did not return within dapo.reward_timeout_s=2 s on the row data_source="),
    ],
    ids=["raises", "not-a-number", "none", "hangs"],
)
def test_a_failing_reward_function_stops_the_run_naming_it_and_the_row(tiny_run, tmp_path, capsys, fail, fragment):
    path = _scorer(tmp_path, fail)
    extra = {"reward.custom_reward_function.path": path, "trainer.val_before_train": False, "dapo.reward_timeout_s": 2}
    started = time.monotonic()
    assert cli.main(tiny_run(extra=extra)) == 1
    assert time.monotonic() - started < 120
    err = capsys.readouterr().err
    assert err.startswith("dapo-train: stopped: ") and "Traceback" not in err
    assert f"reward.custom_reward_function ({path}:compute_score) {fragment}" in err, err
    assert "ground truth" in err and "response" in err


def test_a_reward_function_that_hangs_on_the_probe_is_refused_before_ray(tmp_path, capsys):
    path = tmp_path / "scorer.py"
    path.write_text("import time\ndef compute_score(*args, **kwargs):\n    time.sleep(3600)\n")
    args = [
        "--config-name",
        "dapo_trainer",
        *_verl_args(
            tmp_path, tmp_path / "run", f"reward.custom_reward_function.path={path}", "dapo.reward_timeout_s=1"
        ),
    ]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"({path}:compute_score) did not return within dapo.reward_timeout_s=1 s on a probe" in err


# ---------------------------------------------------------------------------------------------------- config values

BAD_VALUES = [  # (override, the key the refusal must name, a word of the allowed values)
    ("actor_rollout_ref.rollout.n=1", "actor_rollout_ref.rollout.n=1", "at least 2"),
    ("actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.temperature", "> 0"),
    ("actor_rollout_ref.rollout.temperature=hot", "actor_rollout_ref.rollout.temperature", "finite number"),
    ("actor_rollout_ref.rollout.top_p=1.5", "actor_rollout_ref.rollout.top_p", "(0, 1]"),
    (
        "actor_rollout_ref.rollout.val_kwargs.temperature=0",
        "actor_rollout_ref.rollout.val_kwargs.temperature",
        "do_sample=false",
    ),
    ("actor_rollout_ref.rollout.val_kwargs.n=0", "actor_rollout_ref.rollout.val_kwargs.n", "positive integer"),
    ("actor_rollout_ref.rollout.val_kwargs.top_p=0", "actor_rollout_ref.rollout.val_kwargs.top_p", "(0, 1]"),
    ("actor_rollout_ref.actor.optim.lr=-1", "actor_rollout_ref.actor.optim.lr", "> 0"),
    ("dapo.reward_timeout_s=-1", "dapo.reward_timeout_s", "> 0"),
    ("actor_rollout_ref.actor.optim.betas=[0.9,1.5]", "actor_rollout_ref.actor.optim.betas", "[0, 1)"),
    ("actor_rollout_ref.actor.optim.weight_decay=-0.1", "actor_rollout_ref.actor.optim.weight_decay", ">= 0"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3", "divides"),
    ("actor_rollout_ref.actor.ppo_epochs=0", "actor_rollout_ref.actor.ppo_epochs", "positive integer"),
    ("actor_rollout_ref.actor.clip_ratio_high=-0.1", "actor_rollout_ref.actor.clip_ratio_high", ""),
    ("actor_rollout_ref.actor.loss_agg_mode=mean", "actor_rollout_ref.actor.loss_agg_mode", "token-mean"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode=ppo2", "actor_rollout_ref.actor.policy_loss.loss_mode", "dapo"),
    ("algorithm.filter_groups.metric=reward", "algorithm.filter_groups.metric", "acc"),
    ("data.max_response_length=0", "data.max_response_length", "positive integer"),
    ("data.max_prompt_length=-5", "data.max_prompt_length", "positive integer"),
    ("reward.reward_kwargs.overlong_buffer_cfg.len=100000", "overlong_buffer", ""),
    ("trainer.total_training_steps=-1", "trainer.total_training_steps", "positive integer"),
    ("trainer.test_freq=often", "trainer.test_freq", "an integer"),
]


def _bad_config(tiny_run, override):
    return [a for a in tiny_run() if not a.startswith(override.split("=")[0] + "=")] + [override]


@pytest.mark.parametrize("override, key, allowed", BAD_VALUES, ids=[b[0].rsplit(".", 1)[-1] for b in BAD_VALUES])
def test_dapo_train_refuses_a_bad_value_at_once_naming_the_key(tiny_run, capsys, override, key, allowed):
    assert cli.main(_bad_config(tiny_run, override)) == 2
    err = capsys.readouterr().err
    assert err.startswith("dapo-train: error: ") and key in err and allowed in err, err


@pytest.mark.parametrize("override, key, allowed", BAD_VALUES, ids=[b[0].rsplit(".", 1)[-1] for b in BAD_VALUES])
def test_the_verl_entry_point_refuses_the_same_value_before_ray(tmp_path, monkeypatch, override, key, allowed):
    import verl.trainer.main_ppo

    from dapo.settings import ConfigError
    from recipe.dapo.main_dapo import run_dapo

    def ray_started(*args, **kwargs):
        raise AssertionError(f"{override} reached verl's run_ppo (Ray) instead of being refused")

    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", ray_started)
    config = compose(_verl_args(tmp_path, tmp_path / "run", "+experiment=cpu_tiny", override), "dapo_trainer")
    with pytest.raises(ConfigError) as refused:
        run_dapo(config)
    assert key in str(refused.value) and allowed in str(refused.value), str(refused.value)


@pytest.mark.slow
def test_main_dapo_refuses_a_misspelt_key_and_a_bad_value_with_exit_code_2(tmp_path):
    for override, expected in (
        ("actor_rollout_ref.rollout.nn=4", "actor_rollout_ref.rollout.nn"),
        ("actor_rollout_ref.rollout.top_p=1.5", "actor_rollout_ref.rollout.top_p must be"),
    ):
        result = run_process(
            [sys.executable, "-m", "recipe.dapo.main_dapo", *_verl_args(tmp_path, tmp_path / "run", override)],
            cwd=REPO,
            env=ENV,
            timeout=300,
        )
        assert result.returncode == 2, result.stderr[-2000:]
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("main_dapo: error: ") and expected in last, last
        assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------------- verl's metrics


def test_verl_metrics_keep_each_step_once_across_a_restart(tmp_path, monkeypatch):
    """verl's file logger, patched to append (``recipe.dapo.resume``), after :func:`trim_metrics` dropped what a
    killed run logged past its checkpoint (a line cut short by the kill included): each step once."""
    from verl.utils import tracking

    from recipe.dapo.resume import trim_metrics
    from recipe.dapo.verl_patches import patch_file_logger_append

    path = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    patch_file_logger_append()
    first = tracking.FileLogger("p", "e")
    for step in (1, 2, 3):  # checkpoint at 2, killed while logging step 3's record
        first.log({"x": step}, step)
    first.finish()
    path.write_bytes(path.read_bytes() + b'{"step": 4, "da')  # cut short
    assert trim_metrics(path, resumed_step=2) == 2
    second = tracking.FileLogger("p", "e")  # the resumed run, from step 2
    for step in (3, 4):
        second.log({"x": step}, step)
    second.finish()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["data"]["x"]) for r in records] == [(1, 1), (2, 2), (3, 3), (4, 4)]


def test_an_error_of_ours_from_a_ray_worker_is_found_inside_rays_error():
    """What the entry points print in one line when a Ray worker raised :class:`RunStopped` or ``ConfigError``:
    Ray hands back a ``RayTaskError(X)`` that is also an X, whose text is the remote traceback."""
    import ray.exceptions

    from dapo.settings import ConfigError
    from recipe.common.rundir import RunStopped, carried_error

    for error, kind in (
        (RunStopped("a reward function returned nan"), "stopped"),
        (ConfigError("step 3: dynamic sampling has 0 of 4 groups"), "error"),
    ):
        try:
            raise error
        except Exception as raised:  # noqa: BLE001
            wrapped = ray.exceptions.RayTaskError(
                "run", f"Traceback ...\n{type(raised).__name__}: {raised}", raised
            ).as_instanceof_cause()
        assert carried_error(wrapped) == (kind, str(error))
        assert carried_error(RuntimeError(f"remote\n{type(error).__name__}: {error}")) == (kind, str(error))
    assert carried_error(RuntimeError("something else")) is None


def test_the_verl_resume_takes_the_newest_intact_checkpoint(tmp_path, capsys):
    """verl's layout, real files: the tracked step 2 cut short is named and skipped, verl is pointed at step 1; with
    every checkpoint damaged the start is refused, saying how to start over."""
    import torch
    from omegaconf import OmegaConf

    from dapo.settings import ConfigError
    from recipe.dapo.resume import choose_checkpoint

    for step in (1, 2):
        (tmp_path / f"global_step_{step}" / "actor").mkdir(parents=True)
        torch.save({"w": torch.zeros(1000)}, tmp_path / f"global_step_{step}" / "actor" / "model.pt")
        torch.save({}, tmp_path / f"global_step_{step}" / "data.pt")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    weights = tmp_path / "global_step_2" / "actor" / "model.pt"
    weights.write_bytes(weights.read_bytes()[:1000])
    config = OmegaConf.create(
        {"trainer": {"resume_mode": "auto", "default_local_dir": str(tmp_path), "resume_from_path": None}}
    )
    assert choose_checkpoint(config) == tmp_path / "global_step_1"
    out = capsys.readouterr().out
    assert f"warning: checkpoint {tmp_path / 'global_step_2'} is damaged and skipped: {weights} is damaged" in out
    assert f"resuming from {tmp_path / 'global_step_1'}, the newest intact checkpoint" in out
    assert (config.trainer.resume_mode, config.trainer.resume_from_path) == (
        "resume_path",
        str(tmp_path / "global_step_1"),
    )
    (tmp_path / "global_step_1" / "data.pt").write_bytes(b"")
    config.trainer.resume_mode = "auto"
    with pytest.raises(ConfigError, match="every checkpoint in .* is damaged .*trainer.resume_mode=disable"):
        choose_checkpoint(config)


def test_the_verl_resume_skips_a_checkpoint_whose_step_was_never_logged(tmp_path, capsys, monkeypatch):
    """verl saves step K's checkpoint before it logs step K: killed in between, the run has a checkpoint of a step
    that ``metrics.jsonl`` lacks. The resume takes the checkpoint before, so that step K is trained and logged
    again; once step K's record is there, its checkpoint is taken; with no record of any checkpoint's step (a run
    that did not log to this file) the newest intact checkpoint is taken as before."""
    import json

    import torch
    from omegaconf import OmegaConf

    from recipe.dapo.resume import choose_checkpoint

    for step in (1, 2):
        (tmp_path / f"global_step_{step}" / "actor").mkdir(parents=True)
        torch.save({"w": torch.zeros(10)}, tmp_path / f"global_step_{step}" / "actor" / "model.pt")
        torch.save({}, tmp_path / f"global_step_{step}" / "data.pt")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics))

    def config():
        trainer = {"resume_mode": "auto", "default_local_dir": str(tmp_path), "resume_from_path": None}
        return OmegaConf.create({"trainer": {**trainer, "logger": ["console", "file"]}})

    def record(step):
        return json.dumps({"step": step, "data": {"actor/pg_loss": 0.1}}) + "\n"

    metrics.write_text(record(0) + record(1) + '{"step": 2, "da')  # step 2's line cut short by the kill
    assert choose_checkpoint(config()) == tmp_path / "global_step_1"
    out = capsys.readouterr().out
    assert f"checkpoint {tmp_path / 'global_step_2'} is damaged and skipped: step 2 has no record in {metrics}" in out
    assert f"resuming from {tmp_path / 'global_step_1'}, the newest intact checkpoint" in out

    metrics.write_text(record(0) + record(1) + record(2))
    assert choose_checkpoint(config()) == tmp_path / "global_step_2"
    metrics.write_text(record(0))  # step 1 was logged elsewhere (this run did not log here): the files decide
    assert choose_checkpoint(config()) == tmp_path / "global_step_2"
    metrics.unlink()  # no file: the run logged elsewhere until now
    assert choose_checkpoint(config()) == tmp_path / "global_step_2"


def test_the_verl_resume_starts_over_when_its_only_checkpoint_was_never_logged(tmp_path, capsys, monkeypatch):
    """Killed between saving step 1 and logging it (the file logger had created the file, with the validation
    before training as its only record): nothing before the checkpoint to resume from, so the run starts over
    (``resume_mode=disable``) and logs step 1, where resuming from it would have lost step 1's record."""
    import json

    import torch
    from omegaconf import OmegaConf

    from recipe.dapo.resume import choose_checkpoint, prepare_metrics

    (tmp_path / "global_step_1" / "actor").mkdir(parents=True)
    torch.save({"w": torch.zeros(10)}, tmp_path / "global_step_1" / "actor" / "model.pt")
    torch.save({}, tmp_path / "global_step_1" / "data.pt")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("1")
    metrics = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics))
    trainer = {"resume_mode": "auto", "default_local_dir": str(tmp_path), "resume_from_path": None}
    config = OmegaConf.create({"trainer": {**trainer, "logger": ["console", "file"]}})
    metrics.write_text(json.dumps({"step": 0, "data": {"val-core/acc": 0.1}}) + "\n")

    assert choose_checkpoint(config) is None
    assert config.trainer.resume_mode == "disable"
    out = capsys.readouterr().out
    assert f"checkpoint {tmp_path / 'global_step_1'} is skipped: step 1 has no record in {metrics}" in out
    assert "the run starts over from step 0" in out
    prepare_metrics(config, None)
    assert not metrics.exists()  # the new start logs step 0 again

    metrics.write_text(json.dumps({"step": 1, "data": {"actor/pg_loss": 0.1}}) + "\n")  # step 1 logged: resumed
    config.trainer.resume_mode = "auto"
    assert choose_checkpoint(config) == tmp_path / "global_step_1"


# ------------------------------------------------------------------------------------------- refusals leave no trace


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def test_a_refused_start_leaves_the_run_directory_as_it_found_it(tiny_run, tmp_path, capsys):
    """A missing model path, on both entry points, in the same words: refused before the lock (no directory made,
    no ``.run.lock``); a directory that existed keeps exactly what it held."""
    missing = tmp_path / "no-model"
    fresh = tmp_path / "fresh"
    assert cli.main([*tiny_run(fresh), f"actor_rollout_ref.model.path={missing}"]) == 2
    assert f"actor_rollout_ref.model.path={str(missing)!r}: no such directory" in capsys.readouterr().err
    assert not fresh.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    args = ["--config-name", "dapo_trainer", *_verl_args(tmp_path, kept, f"actor_rollout_ref.model.path={missing}")]
    assert cli.main(args) == 2
    assert f"actor_rollout_ref.model.path={str(missing)!r}: no such directory" in capsys.readouterr().err
    assert _tree(kept) == ["notes.txt"]


def test_a_finished_run_started_again_leaves_no_lock_behind(tiny_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    extra = {"trainer.total_training_steps": 1, "trainer.save_freq": 1, "trainer.val_before_train": False}
    assert cli.main(tiny_run(run_dir, extra)) == 0
    assert not (run_dir / LOCK_FILE).exists()  # a trained run's too
    before = _tree(run_dir)
    capsys.readouterr()
    assert cli.main(tiny_run(run_dir, extra)) == 0  # nothing to train: says so, and changes nothing
    assert "nothing to train" in capsys.readouterr().out
    assert _tree(run_dir) == before


def _lock_elsewhere(run_dir: Path) -> subprocess.CompletedProcess:
    code = (
        f"import pathlib; from recipe.common.rundir import lock_run_dir; lock_run_dir(pathlib.Path({str(run_dir)!r}))"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_two_processes_never_both_hold_a_run_directory_and_the_lock_goes_with_its_holder(tmp_path):
    from recipe.common.rundir import lock_run_dir, unlock_run_dir

    run_dir = tmp_path / "run"
    lock_run_dir(run_dir)
    assert str(os.getpid()) in (run_dir / LOCK_FILE).read_text()
    other = _lock_elsewhere(run_dir)
    assert other.returncode != 0 and "is in use by another run (process" in other.stderr
    unlock_run_dir(run_dir)
    assert not run_dir.exists()  # this lock made the directory, and it is empty again
    assert _lock_elsewhere(run_dir).returncode == 0  # free: another process takes it (and exits, releasing it)


def test_prompts_too_long_are_refused_before_the_warm_up(tiny_run, tmp_path, capsys):
    """The tiny task's prompts are checked with its tokenizer, built with the task, before the model is warmed up:
    a cold cache holds the task afterwards, and no warm-up."""
    cache = tmp_path / "cache"
    args = [a for a in tiny_run() if not a.startswith("cache_dir=")]
    started = time.monotonic()
    assert cli.main([*args, f"cache_dir={cache}", "data.max_prompt_length=4"]) == 2
    err = capsys.readouterr().err
    assert "data.max_prompt_length=4" in err, err
    assert time.monotonic() - started < 60
    assert not [p for p in cache.rglob("*") if "warmup" in p.name]


# ------------------------------------------------------------------------------------------------- verl, before Ray


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (
            ["actor_rollout_ref.rollout.max_model_len=30"],
            "actor_rollout_ref.rollout.max_model_len=30 cannot hold a prompt and a response",
        ),
        (
            ["actor_rollout_ref.model.path={smollm2}"],
            "has {tiny} tokens, but actor_rollout_ref.model.path=",
        ),
    ],
    ids=["max_model_len", "tokenizer_of_another_model"],
)
def test_the_verl_entry_point_refuses_a_rollout_that_cannot_fit_before_ray(
    tmp_path, monkeypatch, overrides, fragment, request
):
    import verl.trainer.main_ppo

    from dapo.settings import ConfigError
    from recipe.dapo.main_dapo import run_dapo

    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", lambda *a, **k: pytest.fail("reached Ray"))
    if "{smollm2}" in overrides[0]:  # the real model with cpu_tiny's tokenizer (the tiny task's) left in place
        from recipe.common.warmup import task_files

        assets = request.getfixturevalue("smollm2_assets")
        tiny = task_files(str(request.getfixturevalue("embedded_cache")), {}) / "tokenizer"
        overrides = [
            overrides[0].format(smollm2=assets / "base"),
            f"actor_rollout_ref.model.tokenizer_path={tiny}",
            "actor_rollout_ref.rollout.max_model_len=null",
        ]
    config = compose(_verl_args(tmp_path, tmp_path / "run", "+experiment=cpu_tiny", *overrides), "dapo_trainer")
    if "{tiny}" in fragment:
        from recipe.common.checks import tokenizer_size

        fragment = fragment.format(tiny=tokenizer_size(str(config.actor_rollout_ref.model.tokenizer_path)))
    with pytest.raises(ConfigError) as refused:
        run_dapo(config)
    assert fragment in str(refused.value), str(refused.value)
    assert not (tmp_path / "run").exists()


def test_without_dynamic_sampling_the_verl_round_is_the_train_batch(tmp_path, monkeypatch, capsys):
    """verl's unfiltered sampler needs rounds that divide the batch: with the filter off, data.gen_batch_size is
    set to the batch, saying so, as the embedded engine generates one round of the batch."""
    import verl.trainer.main_ppo

    from recipe.dapo.main_dapo import run_dapo

    seen = {}
    monkeypatch.setattr(
        verl.trainer.main_ppo, "run_ppo", lambda config, **k: seen.update(gen=config.data.gen_batch_size)
    )
    (tmp_path / "model").mkdir()  # only checked to exist before Ray (run_ppo, where it would load, is replaced)
    overrides = [
        "algorithm.filter_groups.enable=false",
        f"actor_rollout_ref.model.path={tmp_path / 'model'}",
        "actor_rollout_ref.model.tokenizer_path=null",
    ]
    config = compose(_verl_args(tmp_path, tmp_path / "run", "+experiment=cpu_tiny", *overrides), "dapo_trainer")
    assert config.data.gen_batch_size == 8 and config.data.train_batch_size == 4
    run_dapo(config)
    assert seen == {"gen": 4}
    assert "data.gen_batch_size=8 is set to 4" in capsys.readouterr().out
    # the driver's watch ends with the training call: none is left to end this process later
    import threading

    for thread in [t for t in threading.enumerate() if t.name == "dapo-driver-watchdog"]:
        thread.join(timeout=10)
        assert not thread.is_alive(), "the driver's watchdog thread outlived run_dapo"


# ------------------------------------------------------------------------------------------------ the last line


@pytest.mark.slow
def test_a_reward_that_turns_nan_mid_run_ends_with_our_line_last_after_wandbs(tiny_run, tmp_path):
    """With W&B on (offline), W&B's closing lines come before the run's own: the last line a user or a scheduler
    sees names the failure, and the exit code is 1 (stopped at run time)."""
    scorer = tmp_path / "scorer.py"
    scorer.write_text(
        "import math\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if solution_str in ('', 'Answer: ' + str(ground_truth)):\n"
        "        return 1.0\n"
        "    return math.nan\n"
    )
    extra = {
        "reward.custom_reward_function.path": str(scorer),
        "trainer.val_before_train": False,
        "trainer.logger": "[console,wandb]",
    }
    env = {k: v for k, v in ENV.items() if k != "WANDB_SILENT"}
    result = subprocess.run(
        [sys.executable, "-m", "recipe.cli", *tiny_run(tmp_path / "run", extra)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert result.returncode == 1, result.stdout[-3000:]
    assert any(line.startswith("wandb:") for line in lines), "W&B printed nothing: the test shows nothing"
    assert lines[-1].startswith("dapo-train: stopped: reward.custom_reward_function (") and "returned nan" in lines[-1]


@pytest.mark.slow
def test_a_stalled_embedded_run_is_ended_by_its_watchdog_within_the_bound(tiny_run, tmp_path):
    """A reward function that never returns (its timeout off): the watchdog ends the run within its bound, with one
    line naming the step and the checkpoint to resume from, exit 75; the same command, with the reward fixed,
    resumes from that checkpoint."""
    hang = tmp_path / "hang"  # the reward function hangs while this file exists
    scorer = tmp_path / "scorer.py"
    scorer.write_text(
        "import os, time\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        f"    if os.path.exists({str(hang)!r}):\n"
        "        time.sleep(10_000)\n"
        "    return 1.0 if solution_str.strip() == 'Answer: ' + str(ground_truth) else -1.0\n"
    )
    run_dir = tmp_path / "run"
    extra = {
        "reward.custom_reward_function.path": str(scorer),
        "dapo.reward_timeout_s": "null",
        "trainer.val_before_train": False,
        "trainer.total_training_steps": 3,
        "trainer.save_freq": 1,
        "trainer.test_freq": -1,
        "dapo.watchdog.min_timeout_s": 4,
        "dapo.watchdog.step_multiple": 1,
        "dapo.watchdog.first_step_timeout_s": 120,
        "dapo.watchdog.probe_interval_s": 0.5,
    }
    command = [sys.executable, "-m", "recipe.cli", *tiny_run(run_dir, extra)]
    log = tmp_path / "first.log"
    first = _start(command[3:], log)
    _wait(_checkpointed(run_dir, 1), first, log, "the step-1 checkpoint")
    hang.touch()
    stalled_at = time.monotonic()
    code = first.wait(timeout=120)
    elapsed = time.monotonic() - stalled_at
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert code == 75, log.read_text()[-3000:]
    stopped = re.fullmatch(
        r"dapo-train: stopped: step (\d+): no progress for \d+ s in generation \(bound \d+ s, dapo.watchdog.\*\); "
        r"rerun the same command to resume from global_step_(\d+)",
        lines[-1],
    )
    assert stopped and int(stopped[2]) == int(stopped[1]) - 1, lines[-1]  # the step it hung in, the one before it
    assert elapsed < 60, elapsed  # the bound: max(4 s, 1 x the longest step), checked every 0.5 s
    hang.unlink()
    resumed = run_process(command, cwd=REPO, env=ENV, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    steps = [r["step"] for r in read_metrics(run_dir)]
    assert steps == sorted(set(steps)) and steps[-1] == 3
