"""A run that stops making progress, or loses a worker, ends within a bound, with one line, and resumes.

A hung run is the expensive failure: a killed vLLM engine core leaves verl's trainer polling a queue that will never
fill, and a scheduler sees a healthy process burning its GPUs. :class:`Watchdog` is a daemon thread that ends the
run when either

* nothing has made progress for the stall bound: every stage of a step, and every generated group, calls
  :meth:`Watchdog.beat`; the bound is ``max(dapo.watchdog.min_timeout_s, dapo.watchdog.step_multiple x the longest
  step so far)``, and ``dapo.watchdog.first_step_timeout_s`` until a step has finished (start-up included); or
* a probe reports a dead worker (the verl engine probes its vLLM servers' ``/health`` and pings its Ray workers
  every ``dapo.watchdog.probe_interval_s``, ``recipe.dapo.watchdog``).

It then calls ``on_stop`` with one line that names what failed, the step and what to do (``step 4: the vLLM engine of
rollout server 0 (10.0.0.1:8000) is dead (/health: 503); rerun the same command to resume from global_step_3``); the
engine records it, stops, and its entry point prints it last and exits 75 (``recipe.config.EXIT_WATCHDOG``).
:class:`WatchdogSettings` reads the keys; ``dapo.watchdog.enable=false`` turns it off (never the default: every wait
then has this bound).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from dapo.settings import ConfigError, check_bool, check_float, check_int, select, setting

KEY = "dapo.watchdog"


@dataclass(frozen=True)
class WatchdogSettings:
    """``dapo.watchdog.*``: the bounds on how long a run may make no progress."""

    enable: bool = setting(
        f"{KEY}.enable",
        "end a run that makes no progress or loses a worker, in one line, exit 75 (docs/testing.md, 'A dead worker')",
        True,
    )
    min_timeout_s: float = setting(f"{KEY}.min_timeout_s", "the stall bound's floor, seconds", 600.0)
    step_multiple: float = setting(
        f"{KEY}.step_multiple", "the stall bound: this many times the longest step so far (at least min_timeout_s)", 4.0
    )
    first_step_timeout_s: float = setting(
        f"{KEY}.first_step_timeout_s",
        "the stall bound until a step has finished (start-up: Ray, model load, the first step)",
        3600.0,
    )
    probe_interval_s: float = setting(
        f"{KEY}.probe_interval_s",
        "verl engine: seconds between liveness probes of the vLLM servers (/health) and the Ray workers",
        15.0,
    )
    max_restarts: int = setting(
        f"{KEY}.max_restarts",
        "verl engine: rerun the same command after a watchdog stop, from the newest checkpoint, at most this many "
        "times (only while each attempt checkpointed a newer step)",
        0,
    )

    def __post_init__(self) -> None:
        for name in ("min_timeout_s", "first_step_timeout_s", "probe_interval_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{KEY}.{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if not self.step_multiple >= 1:
            raise ConfigError(f"{KEY}.step_multiple must be >= 1 (times the longest step), got {self.step_multiple!r}")

    @classmethod
    def from_config(cls, config: Mapping) -> WatchdogSettings:
        section = select(config, KEY, {})
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(section) - set(known))
        if unknown:
            raise ConfigError(f"unknown key(s) {unknown} under {KEY}; known: {', '.join(known)}")
        d = {f.name: f.default for f in fields(cls)}
        value = {name: d[name] if section.get(name) is None else section[name] for name in known}
        return cls(
            enable=check_bool(f"{KEY}.enable", value["enable"]),
            min_timeout_s=check_float(f"{KEY}.min_timeout_s", value["min_timeout_s"]),
            step_multiple=check_float(f"{KEY}.step_multiple", value["step_multiple"]),
            first_step_timeout_s=check_float(f"{KEY}.first_step_timeout_s", value["first_step_timeout_s"]),
            probe_interval_s=check_float(f"{KEY}.probe_interval_s", value["probe_interval_s"]),
            max_restarts=check_int(f"{KEY}.max_restarts", value["max_restarts"], minimum=0),
        )


def latest_checkpoint_step(run_dir) -> int:
    """The run directory's ``latest_checkpointed_iteration.txt`` (both engines write it; 0: none, or not readable
    from this node)."""
    try:
        return int((Path(os.path.expanduser(str(run_dir))) / "latest_checkpointed_iteration.txt").read_text())
    except (OSError, ValueError):
        return 0


def resume_advice(run_dir) -> Callable[[int], str]:
    """The end of a watchdog's line: what to do (rerun, and from which checkpoint)."""

    def advice(step: int) -> str:
        latest = latest_checkpoint_step(run_dir)
        where = f"global_step_{latest}" if latest else "the start (no checkpoint yet)"
        return f"rerun the same command to resume from {where}"

    return advice


Probe = Callable[[], str | None]  # None: healthy; else what is dead, in a few words ("rollout server 0 ...")


class Watchdog:
    """The thread (see the module docstring). ``probes`` are called every ``probe_interval_s`` from the thread;
    ``advice(step)`` is the line's ending (what to do); ``on_stop(line)`` is called once, from the thread;
    ``on_check(watchdog)`` after every check that found nothing (a heartbeat for another process)."""

    def __init__(
        self,
        settings: WatchdogSettings,
        *,
        on_stop: Callable[[str], None],
        advice: Callable[[int], str],
        probes: Sequence[Probe] = (),
        on_check: Callable[[Watchdog], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self.on_stop, self.advice, self.clock = settings, on_stop, advice, clock
        self.on_check = on_check
        self.probes = list(probes)
        self.step, self.phase = 0, "start-up"
        self.longest_step = 0.0
        self._last_beat = self._step_start = clock()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.stopped: str | None = None  # the line, once stopped
        self._thread = threading.Thread(target=self._run, name="dapo-watchdog", daemon=True)

    # ---- what the run calls
    def start(self) -> Watchdog:
        if self.settings.enable:
            self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()

    def beat(self, phase: str | None = None) -> None:
        """Progress: something finished (a stage, a generated group, a micro-batch)."""
        with self._lock:
            self._last_beat = self.clock()
            if phase is not None:
                self.phase = phase

    def begin_step(self, step: int) -> None:
        with self._lock:
            self.step, self._step_start = step, self.clock()
            self._last_beat = self._step_start
            self.phase = "generation"

    def end_step(self, step: int) -> None:
        """A step finished (its validation and checkpoint included): its time counts toward the stall bound."""
        with self._lock:
            now = self.clock()
            self.longest_step = max(self.longest_step, now - self._step_start)
            self._last_beat = now
            self.phase = "between steps"

    def add_probe(self, probe: Probe) -> None:
        with self._lock:
            self.probes.append(probe)

    # ---- the bound
    def timeout_s(self) -> float:
        if self.longest_step == 0.0:
            return self.settings.first_step_timeout_s
        return max(self.settings.min_timeout_s, self.settings.step_multiple * self.longest_step)

    def check(self) -> str | None:
        """The line to stop with, or None: probes first (a dead worker is named), then the stall bound."""
        for probe in list(self.probes):
            try:
                dead = probe()
            except Exception as err:  # noqa: BLE001 - a probe that fails is itself a finding
                dead = f"a liveness probe failed ({type(err).__name__}: {err})"
            if dead:
                return f"step {self.step}: {dead}; {self.advice(self.step)}"
        with self._lock:
            idle, bound, phase = self.clock() - self._last_beat, self.timeout_s(), self.phase
        if idle > bound:
            return (
                f"step {self.step}: no progress for {idle:.0f} s in {phase} (bound {bound:.0f} s, "
                f"{KEY}.*); {self.advice(self.step)}"
            )
        return None

    def _run(self) -> None:
        while not self._closed.wait(min(self.settings.probe_interval_s, self.timeout_s() / 4)):
            line = self.check()
            if line is not None:
                self.stopped = line
                self.on_stop(line)
                return
            if self.on_check is not None:
                self.on_check(self)
