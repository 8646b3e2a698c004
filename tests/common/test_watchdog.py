"""The watchdog (``recipe.common.watchdog``): its bound, its probes, its line, its settings; and the exit-code table
(``recipe.config.finish``) both entry points end through."""

from __future__ import annotations

import threading

import pytest

from recipe.common.rundir import RunStopped, WatchdogStopped, carried_error, record_stop
from recipe.common.watchdog import Watchdog, WatchdogSettings, latest_checkpoint_step, resume_advice
from recipe.config import EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_OK, EXIT_STOPPED, EXIT_WATCHDOG, finish
from recipe.embedded.config import ConfigError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _watchdog(clock, probes=(), **settings) -> Watchdog:
    values = dict(min_timeout_s=10.0, step_multiple=3.0, first_step_timeout_s=100.0, probe_interval_s=1.0)
    values.update(settings)
    return Watchdog(
        WatchdogSettings(**values), on_stop=lambda line: None, advice=lambda step: "rerun", probes=probes, clock=clock
    )


def test_the_stall_bound_is_the_first_step_timeout_then_a_multiple_of_the_longest_step():
    clock = Clock()
    dog = _watchdog(clock)
    assert dog.timeout_s() == 100.0  # no step finished yet
    dog.begin_step(1)
    clock.now = 99.0
    assert dog.check() is None
    clock.now = 101.0  # 101 s without a beat during step 1
    assert dog.check() == "step 1: no progress for 101 s in generation (bound 100 s, dapo.watchdog.*); rerun"
    dog.beat("actor update")
    assert dog.check() is None
    clock.now = 105.0
    dog.end_step(1)  # step 1 took 105 s: bound max(10, 3 x 105)
    assert dog.timeout_s() == 315.0
    dog.begin_step(2)
    clock.now = 105.0 + 2.0
    dog.end_step(2)  # a shorter step does not lower it
    assert dog.timeout_s() == 315.0


def test_the_floor_holds_for_short_steps():
    clock = Clock()
    dog = _watchdog(clock)
    dog.begin_step(1)
    clock.now = 1.0
    dog.end_step(1)
    assert dog.timeout_s() == 10.0  # max(10, 3 x 1)
    clock.now = 11.5
    assert "no progress for 10 s in between steps (bound 10 s" in dog.check()


def test_a_probe_that_finds_a_dead_worker_is_named_before_the_bound():
    clock = Clock()
    dead = {"now": None}
    dog = _watchdog(clock, probes=[lambda: dead["now"]])
    dog.begin_step(4)
    assert dog.check() is None
    dead["now"] = "the vLLM engine of rollout server 0 (10.0.0.1:8000) is dead (/health: 503)"
    assert dog.check() == ("step 4: the vLLM engine of rollout server 0 (10.0.0.1:8000) is dead (/health: 503); rerun")

    def broken():
        raise ConnectionError("reset")

    dog.probes = [broken]
    assert dog.check() == "step 4: a liveness probe failed (ConnectionError: reset); rerun"


def test_the_thread_calls_on_stop_once_with_the_line():
    stopped = []
    done = threading.Event()

    def on_stop(line):
        stopped.append(line)
        done.set()

    settings = WatchdogSettings(min_timeout_s=0.2, first_step_timeout_s=0.2, probe_interval_s=0.05)
    dog = Watchdog(settings, on_stop=on_stop, advice=lambda step: "rerun").start()
    assert done.wait(5), "the watchdog never fired"
    dog.close()
    assert len(stopped) == 1 and stopped[0].startswith("step 0: no progress for") and dog.stopped == stopped[0]


def test_disabled_it_never_starts():
    settings = WatchdogSettings(enable=False, min_timeout_s=0.01, first_step_timeout_s=0.01, probe_interval_s=0.01)
    dog = Watchdog(settings, on_stop=lambda line: pytest.fail(line), advice=lambda step: "").start()
    assert not dog._thread.is_alive()


def test_settings_from_the_config_and_their_errors():
    assert WatchdogSettings.from_config({}) == WatchdogSettings()
    s = WatchdogSettings.from_config({"dapo": {"watchdog": {"min_timeout_s": 30, "max_restarts": 2}}})
    assert (s.min_timeout_s, s.max_restarts) == (30.0, 2)
    with pytest.raises(ConfigError, match=r"dapo.watchdog.min_timeout_s must be > 0 seconds, got -1"):
        WatchdogSettings.from_config({"dapo": {"watchdog": {"min_timeout_s": -1}}})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['timeout'\] under dapo.watchdog"):
        WatchdogSettings.from_config({"dapo": {"watchdog": {"timeout": 5}}})
    with pytest.raises(ConfigError, match=r"dapo.watchdog.step_multiple must be >= 1"):
        WatchdogSettings.from_config({"dapo": {"watchdog": {"step_multiple": 0.5}}})


def test_the_advice_names_the_checkpoint_to_resume_from(tmp_path):
    assert resume_advice(tmp_path)(3) == "rerun the same command to resume from the start (no checkpoint yet)"
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("12")
    assert latest_checkpoint_step(tmp_path) == 12
    assert resume_advice(tmp_path)(14) == "rerun the same command to resume from global_step_12"


def test_the_exit_code_table(tmp_path, capsys):
    """One line on stderr, last, and the documented code for each way a run ends."""

    def raising(err):
        def run():
            raise err

        return run

    assert finish("prog", lambda: None, str(tmp_path)) == EXIT_OK
    assert finish("prog", raising(ConfigError("data.x must be > 0")), str(tmp_path)) == EXIT_CONFIG
    assert capsys.readouterr().err == "prog: error: data.x must be > 0\n"
    assert finish("prog", raising(RunStopped("the reward returned NaN")), str(tmp_path)) == EXIT_STOPPED
    assert capsys.readouterr().err == "prog: stopped: the reward returned NaN\n"
    assert finish("prog", raising(WatchdogStopped("step 3: x died; rerun")), str(tmp_path)) == EXIT_WATCHDOG
    assert capsys.readouterr().err == "prog: stopped: step 3: x died; rerun\n"
    assert finish("prog", raising(KeyboardInterrupt()), str(tmp_path)) == EXIT_INTERRUPTED
    assert "prog: interrupted; the checkpoints in" in capsys.readouterr().err
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        finish("prog", raising(ZeroDivisionError()), str(tmp_path))


def test_a_watchdog_stop_carried_across_processes_keeps_its_kind(tmp_path):
    """Ray hands the driver the remote error as text; the kind survives (exit 75, not 1)."""
    text = RuntimeError("ray::TaskRunner.run()\n  ...\nrecipe.common.rundir.WatchdogStopped: step 2: y died; rerun")
    assert carried_error(text) == ("watchdog", "step 2: y died; rerun")
    assert carried_error(RuntimeError("...\nRunStopped: the disk is full")) == ("stopped", "the disk is full")


def test_a_trainer_process_that_died_after_recording_its_line_ends_with_that_line(tmp_path, capsys):
    """The watchdog ends verl's trainer process when its main thread is blocked; the driver gets Ray's actor-died
    error, and the line the watchdog recorded in the run directory is what it prints (exit 75)."""
    from ray.exceptions import RayActorError

    record_stop(tmp_path, "step 5: FSDP actor rank 0 died; rerun the same command to resume from global_step_4")

    def run():
        raise RayActorError()

    assert finish("main_dapo", run, str(tmp_path)) == EXIT_WATCHDOG
    assert capsys.readouterr().err == (
        "main_dapo: stopped: step 5: FSDP actor rank 0 died; rerun the same command to resume from global_step_4\n"
    )
