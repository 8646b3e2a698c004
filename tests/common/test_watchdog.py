"""The watchdog (``recipe.common.watchdog``): its bound, its probes, its line, its settings; and the exit-code table
(``recipe.config.finish``) both entry points end through."""

from __future__ import annotations

import threading

import pytest

from recipe.common.rundir import RunStopped, WatchdogStopped, carried_error, record_stop
from recipe.common.watchdog import Watchdog, WatchdogSettings, latest_checkpoint_step, resume_advice
from recipe.config import EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_OK, EXIT_STOPPED, EXIT_WATCHDOG, finish
from recipe.embedded.config import ConfigError
from tests.conftest import local_ray


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


# ---------------------------------------------------------------------------------------------------- the verl probes
class _Health:
    """A real HTTP server answering /health with ``status`` (vLLM's: 200, or 503 once its engine core is dead)."""

    def __init__(self, status: int) -> None:
        import http.server

        outer = self
        self.status = status

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                self.send_response(outer.status if self.path == "/health" else 404)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_health_probe_names_a_dead_engine_at_once_and_a_gone_server_on_the_second_miss():
    from recipe.dapo.watchdog import HealthProbe

    server = _Health(200)
    probe = HealthProbe([("rollout server 0", server.address)], timeout_s=2.0)
    assert probe() is None
    server.status = 503  # what vLLM's /health answers once its engine core is dead
    assert probe() == "the vLLM engine of rollout server 0 is dead (/health: 503)"
    server.status = 200
    assert probe() is None
    server.close()
    assert probe() is None  # one miss may be a busy server
    gone = probe()
    assert gone.startswith("rollout server 0 does not answer (") and gone.endswith("the vLLM server is gone")


@pytest.fixture(scope="module")
def in_process_ray():
    with local_ray(num_cpus=2) as ray:
        yield ray


def test_the_actor_probe_names_a_dead_worker_and_waits_on_a_busy_one(in_process_ray):
    import time

    from recipe.dapo.watchdog import ActorProbe

    @in_process_ray.remote(num_cpus=0)
    class Worker:
        def busy(self, seconds):
            time.sleep(seconds)

    alive, busy, doomed = Worker.remote(), Worker.options(max_concurrency=1).remote(), Worker.remote()
    in_process_ray.get([w.__ray_ready__.remote() for w in (alive, busy, doomed)])
    busy.busy.remote(30)  # its ping queues behind this call: busy, not dead
    probe = ActorProbe([("reward worker 0", alive), ("FSDP actor rank 0", busy), ("agent-loop worker 1", doomed)])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(probe.pending) < 3:
        assert probe() is None
    in_process_ray.kill(doomed)
    found = None
    while found is None and time.monotonic() < deadline:
        found = probe()
        time.sleep(0.2)
    assert found is not None and found.startswith("agent-loop worker 1 died (")
    assert 1 in probe.pending  # the busy worker's ping is still in flight, and no finding


def test_the_driver_ends_on_a_recorded_failure_and_on_a_heartbeat_that_stopped(in_process_ray, monkeypatch):
    """The driver's backstop (``recipe.dapo.watchdog._watch``) against a real ``Heartbeat`` actor: the line the
    trainer's watchdog recorded, or, when the trainer process stopped answering, a line saying so; and the trainer
    that never started. The process exit is replaced by recording the line (the one thing not run for real)."""
    from recipe.dapo import watchdog

    lines = []

    class Stop(Exception):
        pass

    def stop(prog, line):
        lines.append(f"{prog}: stopped: {line}")
        raise Stop

    monkeypatch.setattr(watchdog, "_stop_driver", stop)
    settings = WatchdogSettings(min_timeout_s=1.0, first_step_timeout_s=1.0, probe_interval_s=0.2)

    with pytest.raises(Stop):  # no heartbeat actor: the trainer never started
        watchdog._watch(settings, "main_dapo")
    assert "the trainer did not start within 1 s (dapo.watchdog.first_step_timeout_s)" in lines[-1]

    heartbeat = watchdog.Heartbeat.options(name=watchdog.HEARTBEAT).remote()
    heartbeat.put.remote(step=3, phase="generation", bound_s=1.0)
    with pytest.raises(Stop):  # the heartbeat never moves again: the trainer process stopped answering
        watchdog._watch(settings, "main_dapo")
    assert lines[-1].startswith("main_dapo: stopped: verl's trainer process stopped answering for ")
    assert "(step 3, generation); rerun the same command" in lines[-1]

    heartbeat.put.remote(failure="step 4: reward worker 0 died (ActorDiedError); rerun the same command")
    with pytest.raises(Stop):
        watchdog._watch(settings, "main_dapo")
    assert lines[-1] == "main_dapo: stopped: step 4: reward worker 0 died (ActorDiedError); rerun the same command"
    in_process_ray.kill(heartbeat)


def test_an_error_from_a_dead_worker_in_the_trainer_becomes_the_watchdogs_line():
    """A call into a dead FSDP rank raises Ray's actor-died error in verl's trainer, maybe before a probe ran: the
    trainer stops with the watchdog's line naming the worker, else one naming the actor's class; other errors keep
    their own report."""
    from recipe.dapo.watchdog import dead_worker_line

    settings = WatchdogSettings(probe_interval_s=0.05)
    dog = Watchdog(settings, on_stop=lambda line: None, advice=lambda step: "rerun")
    dog.begin_step(3)
    assert dead_worker_line(dog, ValueError("a bug")) is None
    died = RuntimeError(
        "ray::DAPOTaskRunner.run() ... ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing "
        "this task.\n\tclass_name: WorkerDict\n\tactor_id: 1f2e"
    )
    assert dead_worker_line(dog, died) == "step 3: a Ray worker (WorkerDict) died; rerun"
    dog.stopped = "step 3: FSDP actor rank 0 died (ActorDiedError: ...); rerun"  # the probe named it meanwhile
    assert dead_worker_line(dog, died) == dog.stopped


def test_the_driver_names_a_dead_trainer_process_with_its_last_step_and_the_checkpoint(tmp_path, monkeypatch):
    """verl's TaskRunner lost with its node: the driver's wait raises Ray's actor error, the line names the step the
    heartbeat last said and the newest checkpoint the same command resumes from."""
    pytest.importorskip("ray")
    from ray.exceptions import ActorUnavailableError

    from recipe.dapo import watchdog as dapo_watchdog

    err = ActorUnavailableError("The actor abc is unavailable: RpcError: Socket closed", None)
    monkeypatch.setattr(dapo_watchdog, "_driver_seen", {})
    line = dapo_watchdog.trainer_died_line(err, tmp_path)
    assert line.startswith("before the first step: verl's trainer process (its TaskRunner actor) died (")
    assert line.endswith("rerun the same command to resume from the start (no checkpoint yet)")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    monkeypatch.setattr(dapo_watchdog, "_driver_seen", {"step": 3, "phase": "generation"})
    line = dapo_watchdog.trainer_died_line(err, tmp_path)
    assert line.startswith("step 3: verl's trainer process") and "ActorUnavailableError" in line
    assert line.endswith("rerun the same command to resume from global_step_2") and "\n" not in line
