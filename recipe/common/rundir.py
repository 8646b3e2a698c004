"""One run directory, one run, and how a run stops: the directory's lock, :class:`RunStopped` (a run ended by
something outside its config), the stop reason a verl worker leaves for the sampler (:func:`record_stop`), and
:func:`carried_error`, which finds an error of ours inside the one Ray hands back.

The lock: exclusive, held for the whole run, taken before anything is written.

Two processes training into one ``trainer.default_local_dir`` would both append to ``metrics.jsonl`` (steps 0, 1,
0, 2, 1, ...) and overwrite each other's checkpoints. :func:`lock_run_dir` takes ``<run_dir>/.run.lock`` with
``fcntl.flock``: the kernel drops the lock when the holder exits, however it exits (SIGKILL included), so a
crashed run never leaves a stale lock behind. The file records the holder's pid, host and command line, which the
second process names when it refuses. On a filesystem without ``flock`` support (some network filesystems) the
lock cannot be taken and the run says so and goes on unlocked.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
from pathlib import Path

from dapo.settings import ConfigError

LOCK_FILE = ".run.lock"


class RunStopped(RuntimeError):
    """A run stopped by something outside its config (a full disk, a reward function that fails or hangs): one
    line naming what failed and where; the entry points print it without a traceback and exit 1. The last
    checkpoint written before it is intact."""


class WatchdogStopped(RunStopped):
    """A run ended by its watchdog (``recipe.common.watchdog``): a worker died or nothing made progress within the
    bound. Exit code 75: running the same command resumes from the latest checkpoint."""


STOP_FILE = ".stopped"  # why a worker stopped the run, for the process that can end it (verl's sampler)


def record_stop(run_dir, message: str) -> None:
    """Leave ``message`` in ``run_dir`` for another process of the run: verl's agent loop turns an error in the
    reward worker into a failed rollout (logged, not raised), so the sampler reads the reason from here and stops
    the run with it. Best effort: a run directory this node cannot write (another node's disk) is skipped."""
    if not run_dir or "://" in str(run_dir):
        return
    try:
        path = Path(os.path.expanduser(str(run_dir))) / STOP_FILE
        if not path.exists():
            path.write_text(message)
    except OSError:
        pass


def read_stop(run_dir) -> str | None:
    path = Path(os.path.expanduser(str(run_dir))) / STOP_FILE if run_dir and "://" not in str(run_dir) else None
    return path.read_text() if path is not None and path.is_file() else None


def clear_stop(run_dir) -> None:
    if run_dir and "://" not in str(run_dir):
        (Path(os.path.expanduser(str(run_dir))) / STOP_FILE).unlink(missing_ok=True)


def carried_error(err: BaseException) -> tuple[str, str] | None:
    """``("watchdog", message)`` for a :class:`WatchdogStopped`, ``("stopped", message)`` for another
    :class:`RunStopped`, ``("error", message)`` for a :class:`~dapo.settings.ConfigError`, found in ``err``, its cause
    chain, or the text of an error that carried it across processes (Ray's ``RayTaskError`` holds the remote error as
    text); ``None`` for anything else."""
    seen = err
    while seen is not None:
        original = getattr(seen, "cause", None)  # Ray's RayTaskError(X) is also an X; its .cause is the X raised
        if isinstance(original, BaseException) and original is not seen:
            seen = original
            continue
        if isinstance(seen, WatchdogStopped):
            return "watchdog", str(seen)
        if isinstance(seen, RunStopped):
            return "stopped", str(seen)
        if isinstance(seen, ConfigError):
            return "error", str(seen)
        seen = seen.__cause__ or seen.__context__
    for line in reversed(str(err).splitlines()):
        for name, kind in (("WatchdogStopped: ", "watchdog"), ("RunStopped: ", "stopped"), ("ConfigError: ", "error")):
            if name in line:
                return kind, line.split(name, 1)[1].strip()
    return None


_held: dict[Path, tuple[int, bool]] = {}  # run directory -> (the lock file's descriptor, whether it made the directory)


def lock_run_dir(run_dir: Path, key: str = "trainer.default_local_dir") -> None:
    """Hold ``run_dir``'s lock until :func:`unlock_run_dir` or this process's exit; raise :class:`ConfigError`
    naming the other process when another one holds it. Taking it again in the same process is a no-op.

    :func:`unlock_run_dir` deletes the lock file (and the directory, if this lock made it and it is left empty), so a
    refused start leaves the directory as it found it. Safe because a lock is only trusted on the file that is still
    at the path: a process that locked a file another one deleted meanwhile lets go and takes the new one."""
    run_dir = Path(run_dir).resolve()
    if run_dir in _held:
        return
    made = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                print(f"warning: cannot lock {path} ({err}); nothing stops a second run from using {run_dir}")
                return
            holder = _describe(os.pread(fd, 4096, 0))
            os.close(fd)
            _remove_if_made(run_dir, made)
            raise ConfigError(
                f"{key}={str(run_dir)!r} is in use by another run ({holder}); two runs in one directory would "
                f"interleave their metrics and overwrite each other's checkpoints. Wait for it to finish (or stop "
                f"it), or set {key}=<another directory> / trainer.experiment_name=<another name>"
            ) from None
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break  # the file at the path: the lock is ours
        except FileNotFoundError:
            pass
        os.close(fd)  # locked a file its holder deleted on the way out: take the one at the path now
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv)[:500]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(record).encode(), 0)
    _held[run_dir] = (fd, made)


def unlock_run_dir(run_dir: Path) -> None:
    """Release the lock and delete its file; remove the directory too if this lock made it and it is empty (a run
    refused before it wrote anything). A process that exits without calling it releases the lock all the same."""
    run_dir = Path(run_dir).resolve()
    held = _held.pop(run_dir, None)
    if held is None:
        return
    fd, made = held
    (run_dir / LOCK_FILE).unlink(missing_ok=True)  # before the release: a waiter then finds the path changed
    os.close(fd)
    _remove_if_made(run_dir, made)


def _remove_if_made(run_dir: Path, made: bool) -> None:
    if made:
        try:
            run_dir.rmdir()  # only if empty
        except OSError:
            pass


def _describe(raw: bytes) -> str:
    try:
        record = json.loads(raw.decode())
        return f"process {record['pid']} on {record['host']}: {record['command']}"
    except (ValueError, KeyError, UnicodeDecodeError):
        return "a process that has not recorded itself yet"
