"""The verl engine never hangs: :class:`recipe.common.watchdog.Watchdog` in verl's trainer process, a backstop in the
driver, and the opt-in restart.

Where verl 0.9.1 waits without a bound (read off its source): the V1 trainer runs in a Ray actor (``TaskRunnerV1``,
``verl/trainer/main_ppo.py``) that the driver waits on with a bare ``ray.get``; the trainer waits for generation by
polling the TransferQueue in ``while True`` loops (``verl/trainer/ppo/v1/replay_buffer.py``, and the DAPO sampler's
rounds, ``recipe/dapo/sampler.py``). When a vLLM engine core dies, its server actor stays alive and answers
``EngineDeadError`` to new requests; the agent loop logs it and marks the prompt failed, or never answers at all
for a request that was already inside the engine, and the trainer polls forever. Ray reports nothing: no actor died.

1. :class:`DAPOTaskRunner` (verl's ``TaskRunnerV1``, passed to verl's ``run_ppo`` through its ``task_runner_class``
   argument) starts the watchdog before the trainer is built. Progress beats come from the sampler's polls (a group
   finished), the trainer's stages and its steps. Probes, every ``dapo.watchdog.probe_interval_s`` once training
   starts: each vLLM server's ``/health`` (503 when its engine core is dead, refused when the server is gone) and a
   ping of every Ray worker (rollout servers, agent-loop workers, the FSDP actor's ranks, the reward workers); a
   worker whose ping fails with Ray's actor-died error is dead (a busy one is not: it answers later).
2. On a finding it records the line for the driver (a Ray actor, :class:`Heartbeat`, and ``.stopped`` in the run
   directory), writes every thread's stack to ``watchdog-stacks.txt`` in the run directory, and lets the trainer stop
   at its next poll (:class:`~recipe.common.rundir.WatchdogStopped`); a trainer blocked elsewhere is ended after
   :data:`GRACE_S`.
3. The driver watches the heartbeat from a thread of its own (:func:`watch_from_driver`): a recorded failure, a
   heartbeat that stopped changing for the stall bound, or a trainer that never started within
   ``dapo.watchdog.first_step_timeout_s`` (Ray could not place it) ends the driver with the line and exit code
   :data:`EXIT_WATCHDOG`; the driver's exit ends the Ray job and its workers.
4. ``dapo.watchdog.max_restarts > 0``: :func:`supervise` runs the command again after such an exit, up to that many
   times, from the latest checkpoint, as long as each attempt checkpointed a newer step than the previous one.
"""

from __future__ import annotations

import faulthandler
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import ray

from recipe.common.rundir import WatchdogStopped, record_stop
from recipe.common.watchdog import Watchdog, WatchdogSettings, latest_checkpoint_step, resume_advice
from recipe.config import EXIT_WATCHDOG, say_last

HEARTBEAT = "dapo_watchdog_heartbeat"
GRACE_S = 30.0  # how long the trainer has to stop at its next poll before its process is ended
STACKS_FILE = "watchdog-stacks.txt"

_current: Watchdog | None = None  # the trainer process's watchdog


def current() -> Watchdog | None:
    """The watchdog of this process (verl's trainer process), or None elsewhere."""
    return _current


def beat(phase: str | None = None) -> None:
    if _current is not None:
        _current.beat(phase)


def raise_if_stopped() -> None:
    """Called where the trainer polls: stop the step with the watchdog's line once it has one."""
    if _current is not None and _current.stopped:
        raise WatchdogStopped(_current.stopped)


@ray.remote(num_cpus=0)
class Heartbeat:
    """What the trainer's watchdog last said, for the driver: a counter that moves while the watchdog runs, the
    step, the phase, the stall bound, and the failure line once there is one."""

    def __init__(self) -> None:
        self.state = {"ticks": 0, "step": 0, "phase": "start-up", "bound_s": None, "failure": None}

    def put(self, **state) -> None:
        self.state.update(state)
        self.state["ticks"] += 1

    def get(self) -> dict:
        return dict(self.state)


def start_in_trainer_process(config) -> Watchdog:
    """The trainer process's watchdog, started (no probes yet: :func:`add_worker_probes` once the workers exist)."""
    global _current
    settings = WatchdogSettings.from_config(config)
    run_dir = str(config.trainer.default_local_dir)
    heartbeat = Heartbeat.options(name=HEARTBEAT, get_if_exists=True).remote()

    def on_stop(line: str) -> None:
        record_stop(run_dir, line)
        heartbeat.put.remote(failure=line)
        try:
            with open(Path(os.path.expanduser(run_dir)) / STACKS_FILE, "w") as f:
                faulthandler.dump_traceback(f, all_threads=True)
        except OSError:
            pass
        # the trainer raises at its next poll; one blocked elsewhere (a call into a dead worker) is ended
        threading.Timer(GRACE_S, os._exit, args=(EXIT_WATCHDOG,)).start()

    def publish(watchdog: Watchdog) -> None:  # the driver's view, refreshed at every check
        heartbeat.put.remote(step=watchdog.step, phase=watchdog.phase, bound_s=watchdog.timeout_s())

    watchdog = Watchdog(settings, on_stop=on_stop, advice=resume_advice(run_dir), on_check=publish)
    _current = watchdog.start()
    return watchdog


def task_runner_class():
    """verl's ``TaskRunnerV1`` with the watchdog around its ``run`` (verl's ``run_ppo(..., task_runner_class=)``)."""
    from verl.trainer.main_ppo import TaskRunnerV1

    base = TaskRunnerV1.__ray_actor_class__

    class DAPOTaskRunner(base):
        def run(self, config):
            watchdog = start_in_trainer_process(config)
            try:
                return super().run(config)
            except Exception as err:
                line = dead_worker_line(watchdog, err)
                if line is None:
                    raise
                raise WatchdogStopped(line) from None
            finally:
                watchdog.close()

    DAPOTaskRunner.__name__ = DAPOTaskRunner.__qualname__ = "DAPOTaskRunner"
    return ray.remote(DAPOTaskRunner)


def dead_worker_line(watchdog: Watchdog, err: BaseException) -> str | None:
    """The line for an error that ended the trainer because a worker died (a call into a dead FSDP rank raises Ray's
    actor-died error in the trainer before a probe may have run): the watchdog's own line once its probes name the
    worker (waited for up to three probe intervals), else one naming the dead actor's class from Ray's error. None
    for any other error (it keeps its own report)."""
    if watchdog.stopped:
        return watchdog.stopped
    text = f"{type(err).__name__}: {err}"
    if not _actor_died(err) and "ActorDiedError" not in text and "RayActorError" not in text:
        return None
    deadline = time.monotonic() + 3 * watchdog.settings.probe_interval_s + 5
    while watchdog.stopped is None and time.monotonic() < deadline:
        time.sleep(0.5)
    if watchdog.stopped:
        return watchdog.stopped
    found = re.search(r"class_name: (\w+)", text)
    worker = f"a Ray worker ({found.group(1)})" if found else "a Ray worker"
    return f"step {watchdog.step}: {worker} died; {watchdog.advice(watchdog.step)}"


def _actor_died(err: BaseException | None) -> bool:
    from ray.exceptions import RayActorError

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, RayActorError):
            return True
        err = err.__cause__ or err.__context__
    return False


# ---------------------------------------------------------------------------------------------------- probes
def add_worker_probes(trainer, agent_loop_manager) -> None:
    """Probe the trainer's workers from now on: the vLLM servers' health, and every Ray worker's liveness."""
    watchdog = current()
    if watchdog is None:
        return
    servers = []
    for manager in (getattr(trainer, "llm_server_manager", None), getattr(trainer, "standalone_server_manager", None)):
        for index, address in enumerate(getattr(manager, "server_addresses", None) or []):
            servers.append((f"rollout server {index} ({address})", address))
    if servers:
        watchdog.add_probe(HealthProbe(servers))
    actors = []
    for index, handle in enumerate(getattr(getattr(trainer, "llm_server_manager", None), "server_handles", []) or []):
        actors.append((f"rollout server {index}", handle))
    for index, handle in enumerate(getattr(agent_loop_manager, "agent_loop_workers", []) or []):
        actors.append((f"agent-loop worker {index}", handle))
    for index, handle in enumerate(getattr(getattr(trainer, "actor_rollout_wg", None), "workers", []) or []):
        actors.append((f"FSDP actor rank {index}", handle))
    reward = getattr(trainer, "reward_loop_manager", None)
    for index, handle in enumerate(getattr(reward, "reward_loop_workers", []) or []):
        actors.append((f"reward worker {index}", handle))
    if actors:
        watchdog.add_probe(ActorProbe(actors))


class HealthProbe:
    """``GET http://<address>/health`` of each vLLM server: 200 alive; 503 its engine core is dead; no answer twice
    in a row, the server is gone."""

    def __init__(self, servers: list[tuple[str, str]], timeout_s: float = 5.0) -> None:
        self.servers, self.timeout_s = servers, timeout_s
        self.misses: dict[str, int] = {}

    def __call__(self) -> str | None:
        for name, address in self.servers:
            url = address if address.startswith("http") else f"http://{address}"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=self.timeout_s) as response:
                    status = response.status
            except urllib.error.HTTPError as err:
                status = err.code
            except OSError as err:  # refused, reset, timed out
                self.misses[name] = self.misses.get(name, 0) + 1
                if self.misses[name] >= 2:
                    return f"{name} does not answer ({err}): the vLLM server is gone"
                continue
            self.misses[name] = 0
            if status != 200:
                return f"the vLLM engine of {name} is dead (/health: {status})"
        return None


class ActorProbe:
    """One ``__ray_ready__`` ping in flight per Ray worker: a ping that fails with Ray's actor-died error names the
    worker; one still pending means a busy worker (an FSDP rank in its update), which is not a failure."""

    def __init__(self, actors: list[tuple[str, object]]) -> None:
        self.actors = actors
        self.pending: dict[int, object] = {}

    def __call__(self) -> str | None:
        from ray.exceptions import GetTimeoutError, RayActorError

        for index, (name, handle) in enumerate(self.actors):
            ref = self.pending.get(index)
            if ref is None:
                self.pending[index] = handle.__ray_ready__.remote()
                continue
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                continue  # busy
            del self.pending[index]
            try:
                ray.get(ref, timeout=1)
            except RayActorError as err:
                return f"{name} died ({type(err).__name__}: {str(err).splitlines()[0][:200]})"
            except GetTimeoutError:
                pass
        return None


# ---------------------------------------------------------------------------------------------------- the driver
def watch_from_driver(settings: WatchdogSettings, *, prog: str = "main_dapo") -> threading.Event:
    """A daemon thread in the driver: waits for Ray and the trainer's heartbeat, then ends the driver with the line
    (exit :data:`EXIT_WATCHDOG`) on a recorded failure, on a heartbeat that stopped moving, or when the trainer never
    started within ``first_step_timeout_s``. Returns the event that ends the thread (set it when the training call
    returns: a driver that goes on, as a test in one process does, must not be ended later by a watch it left)."""
    done = threading.Event()
    if settings.enable:
        thread = threading.Thread(target=_watch, args=(settings, prog, done), name="dapo-driver-watchdog", daemon=True)
        thread.start()
    return done


_driver_seen: dict = {}  # the trainer's last heartbeat the driver read (step, phase), for a line after it died


def trainer_died_line(err: BaseException, run_dir) -> str:
    """The line for verl's TaskRunner actor found dead by the driver's wait (its node lost, its process killed): the
    step it last reported, Ray's reason in a few words, and where the same command resumes from."""
    step = _driver_seen.get("step")
    where = f"step {step}" if step is not None else "before the first step"
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if len(reason) > 120:  # Ray's messages run on; the class and its first words say what happened
        reason = reason[:120].rsplit(" ", 1)[0] + " ..."
    return (
        f"{where}: verl's trainer process (its TaskRunner actor) died ({type(err).__name__}: {reason}): its node was "
        f"lost or the process killed; {resume_advice(run_dir)(step or 0)}"
    )


def _stop_driver(prog: str, line: str) -> None:
    say_last(f"{prog}: stopped: {line}")
    os._exit(EXIT_WATCHDOG)


def _watch(settings: WatchdogSettings, prog: str, done: threading.Event | None = None) -> None:
    from ray.exceptions import GetTimeoutError, RayActorError

    done = done or threading.Event()
    interval = settings.probe_interval_s
    start = time.monotonic()
    startup = settings.first_step_timeout_s
    heartbeat = None
    while heartbeat is None:
        if done.is_set():
            return
        if ray.is_initialized():
            try:
                heartbeat = ray.get_actor(HEARTBEAT)
                break
            except ValueError:  # not created yet
                pass
        if time.monotonic() - start > startup:
            _stop_driver(
                prog,
                f"the trainer did not start within {startup:.0f} s (dapo.watchdog.first_step_timeout_s): Ray could "
                "not place verl's TaskRunner or its workers (check ray_kwargs.ray_init.num_cpus / num_gpus against "
                "the cluster's resources, `ray status`), or it hung before training; rerun the same command once "
                "fixed",
            )
        done.wait(min(interval, 2.0))
    ticks, moved, bound, last = None, time.monotonic(), startup, None
    while True:
        if done.wait(interval):
            return
        try:
            state = ray.get(heartbeat.get.remote(), timeout=max(interval, 5.0))
        except GetTimeoutError:
            state = None
        except RayActorError:
            return  # the trainer's process ended: the driver's own wait reports how
        if state is not None:
            if state["failure"]:
                _stop_driver(prog, state["failure"])
            if state["ticks"] != ticks:
                ticks, moved = state["ticks"], time.monotonic()
            bound, last = state["bound_s"] or bound, state
            _driver_seen.update(step=state["step"], phase=state["phase"])
        if time.monotonic() - moved > bound + 4 * interval:
            phase = "before the first heartbeat" if last is None else f"step {last['step']}, {last['phase']}"
            _stop_driver(
                prog,
                f"verl's trainer process stopped answering for {time.monotonic() - moved:.0f} s ({phase}); "
                "rerun the same command to resume from the latest checkpoint",
            )


# ---------------------------------------------------------------------------------------------------- restarts
SUPERVISED = "DAPO_WATCHDOG_SUPERVISED"


def supervise(settings: WatchdogSettings, run_dir, *, prog: str) -> int | None:
    """With ``max_restarts > 0``, in the first process: run this same command as a child, again after each
    :data:`EXIT_WATCHDOG` exit, at most ``max_restarts`` times, while each attempt checkpointed a newer step; return
    the last exit code. ``None``: not supervising (this process trains)."""
    if settings.max_restarts <= 0 or os.environ.get(SUPERVISED):
        return None
    env = {**os.environ, SUPERVISED: "1"}
    code, last = 0, latest_checkpoint_step(run_dir)
    for attempt in range(settings.max_restarts + 1):
        code = subprocess.call(sys.orig_argv, env=env)
        if code != EXIT_WATCHDOG or attempt == settings.max_restarts:
            return code
        latest = latest_checkpoint_step(run_dir)
        if attempt > 0 and latest <= last:
            print(
                f"{prog}: not restarting: no newer checkpoint than global_step_{latest} since the last restart",
                file=sys.stderr,
                flush=True,
            )
            return code
        last = latest
        print(
            f"{prog}: restarting from global_step_{latest} (restart {attempt + 1} of {settings.max_restarts}, "
            "dapo.watchdog.max_restarts)",
            file=sys.stderr,
            flush=True,
        )
    return code
