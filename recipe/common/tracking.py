"""W&B without waiting on it: credentials, a bounded reachability probe, and the verl driver's fallback to
offline. The embedded engine's ``Monitor`` and the verl entry point decide the same way: online only with
credentials and a server that accepts a connection within :data:`WANDB_CONNECT_TIMEOUT_S`; otherwise offline, said
once, with the command that uploads the run later."""

from __future__ import annotations

import netrc
import os
import socket
import threading
from urllib.parse import urlparse

WANDB_CONNECT_TIMEOUT_S = 10  # name lookup + TCP connection to the W&B server
WANDB_INIT_TIMEOUT_S = 30  # wandb.init online, once the server answered


def has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_unreachable(timeout: float) -> str | None:
    """Why the W&B server cannot be reached within ``timeout`` seconds (``None``: it accepted a connection). The
    lookup and the connection run in a thread, since a name lookup does not honour socket timeouts."""
    url = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
    port = url.port or (443 if url.scheme == "https" else 80)
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((url.hostname, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(f"{type(err).__name__}: {err}")

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"no answer within {timeout:g} s"


def offline_reason(loggers, start_timeout_s: float | None = None) -> str | None:
    """Why a run that logs to ``wandb`` should log offline (``None``: go online, or W&B is not used or already
    offline/disabled): no credentials, or a server that does not answer within the bound, which is said before
    the probe (``start_timeout_s``: the further wait for ``wandb.init`` the caller grants, said too)."""
    loggers = [loggers] if isinstance(loggers, str) else list(loggers or [])
    mode = os.environ.get("WANDB_MODE")
    if "wandb" not in loggers or mode in ("offline", "disabled", "dryrun"):
        return None
    if not has_wandb_credentials() and mode is None:
        return "no credentials found"
    url = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    then = f", then {start_timeout_s:g} s to start the run" if start_timeout_s else ""
    print(f"W&B: connecting to {url} (at most {WANDB_CONNECT_TIMEOUT_S} s{then}; offline after that)")
    problem = wandb_unreachable(WANDB_CONNECT_TIMEOUT_S)
    return f"{url} unreachable: {problem}" if problem else None


def fall_back_to_offline(loggers, run_dir) -> str | None:
    """For the verl driver, before Ray starts (its workers inherit the environment): set ``WANDB_MODE=offline``
    when :func:`offline_reason` says so, and say it; return the reason."""
    reason = offline_reason(loggers)
    if reason is not None:
        os.environ["WANDB_MODE"] = "offline"
        print(
            f"W&B is offline ({reason}; the wait was at most {WANDB_CONNECT_TIMEOUT_S} s); training goes on, and "
            f"`wandb sync {run_dir}/wandb/offline-run-*` uploads the run later"
        )
    return reason
