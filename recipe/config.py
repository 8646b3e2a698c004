"""The layer below both engines: where the configs are, composing them, and how an entry point ends.

Both entry points (``dapo-train``, ``recipe/cli.py``; ``python -m recipe.dapo.main_dapo``) and every tool that
composes a config (the verl CPU launcher, the benches, the tests) use this module; it imports neither engine.

* :func:`config_dir`: ``$DAPO_CONFIG_DIR``, else the repository's ``configs/`` (a source checkout or an editable
  install), else the copy installed with the package (``dapo_verl_configs``, the same files as package data), so that
  both entry points work from any directory after a plain ``pip install``.
* :func:`compose`: Hydra in struct mode, so a misspelt key fails at once, naming it. verl's own configs
  (``ppo_trainer``) come onto the search path through ``hydra_plugins/dapo_verl``.
* :func:`finish`: every way a run ends becomes one line on stderr, printed last, and one exit code:

  ====  =====================================================================================================
  0     trained (or nothing left to train)
  1     stopped at run time by something outside the config (a failing reward function, a non-finite loss, a
        full disk); the checkpoints are kept
  2     the config or an input was refused, before anything was trained (a misspelt key, a bad value, a missing
        file); nothing was written
  75    the watchdog stopped a run that lost a worker or made no progress within its bound
        (``dapo.watchdog.*``); running the same command resumes from the latest checkpoint
  130   interrupted (Ctrl-C); running the same command resumes from the latest checkpoint
  ====  =====================================================================================================
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

INSTALLED_PACKAGE = "dapo_verl_configs"
DEFAULT_CONFIG = "embedded"  # what dapo-train composes without --config-name (its dapo.engine says which engine)
EXIT_OK, EXIT_STOPPED, EXIT_CONFIG, EXIT_WATCHDOG, EXIT_INTERRUPTED = 0, 1, 2, 75, 130


def config_dir() -> Path:
    if os.environ.get("DAPO_CONFIG_DIR"):
        return Path(os.environ["DAPO_CONFIG_DIR"]).expanduser().resolve()
    checkout = Path(__file__).resolve().parents[1] / "configs"
    if (checkout / "embedded.yaml").is_file():
        return checkout
    from importlib.util import find_spec

    spec = find_spec(INSTALLED_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).resolve()
    return checkout  # absent: compose says so, naming DAPO_CONFIG_DIR


def config_names() -> list[str]:
    """The configs ``--config-name`` accepts (the top level of :func:`config_dir`)."""
    return sorted(p.stem for p in config_dir().glob("*.yaml"))


def compose(overrides: list[str], config_name: str = DEFAULT_CONFIG):
    """The composed config (raises Hydra's errors on unknown keys or bad override syntax)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    directory = config_dir()
    if not (directory / f"{config_name}.yaml").is_file():
        raise FileNotFoundError(
            f"no config {config_name}.yaml in {directory} (there: {', '.join(config_names()) or 'none'}); set "
            "DAPO_CONFIG_DIR to the repository's configs directory"
        )
    quiet_verl_import()
    with initialize_config_dir(config_dir=str(directory), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)


def split_args(args: list[str], default_config: str) -> tuple[str, list[str]]:
    """``--config-name NAME`` / ``--config-name=NAME`` / ``-cn NAME`` and the ``key=value`` overrides."""
    config_name, overrides = default_config, []
    it = iter(args)
    for arg in it:
        if arg in ("--config-name", "-cn"):
            config_name = next(it, default_config)
        elif arg.startswith(("--config-name=", "-cn=")):
            config_name = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    return config_name.removesuffix(".yaml"), overrides


def quiet_verl_import() -> None:
    """Composing imports verl, which announces every optional engine it lacks and, without a GPU, that it falls
    back to CUDA; neither says anything about this run (the verl engine reports a missing GPU itself)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
    # a filter, not a level: verl sets this logger's level when it is imported
    logging.getLogger("verl.plugin.platform.platform_manager").addFilter(lambda record: record.levelno >= logging.ERROR)


def compose_error(err: BaseException) -> str:
    """One line of a Hydra / OmegaConf composition error (OmegaConf's first line names the key)."""
    message = str(err).strip()
    cause = str(err.__cause__ or "").strip().split("\n")[0]
    if cause and cause not in message:
        message = f"{message} ({cause})" if message else cause
    return message.replace("\n", " ")


def say_last(line: str) -> None:
    """``line`` on stderr after everything else this process printed (stdout's buffer flushed first)."""
    sys.stdout.flush()
    print(line, file=sys.stderr, flush=True)


def fail(prog: str, message: str, code: int = EXIT_CONFIG) -> int:
    say_last(f"{prog}: error: {message}")
    return code


def finish(
    prog: str, run: Callable[[], object], run_dir: str | None, before_line: Callable[[], None] | None = None
) -> int:
    """Run ``run()`` and turn how it ends into the exit code of the module docstring's table, with one line on
    stderr for anything but success: a :class:`~dapo.settings.ConfigError` or a
    :class:`~recipe.common.rundir.RunStopped` raised here or in a Ray worker of the verl engine (wrapped in Ray's
    error), a trainer process ended by its watchdog (its line is in the run directory), Ctrl-C. Anything else is a
    bug and keeps its traceback. ``before_line`` runs before the line is printed (the verl engine stops Ray there,
    whose shutdown would otherwise print its workers' last output after the line)."""
    from recipe.common.rundir import carried_error, read_stop

    try:
        run()
        return EXIT_OK
    except KeyboardInterrupt:
        where = run_dir or "the run directory"
        if before_line is not None:
            before_line()
        say_last(
            f"{prog}: interrupted; the checkpoints in {where} are kept: run the same command to resume from the latest"
        )
        return EXIT_INTERRUPTED
    except Exception as err:
        carried = carried_error(err)
        if carried is None:
            stopped = read_stop(run_dir) if _is_actor_died(err) else None
            if stopped is None:
                raise
            carried = ("watchdog", stopped)  # verl's trainer process was ended by its watchdog after recording why
        kind, message = carried
        label = "error" if kind == "error" else "stopped"
        if before_line is not None:
            before_line()
        say_last(f"{prog}: {label}: {message}")
        return {"error": EXIT_CONFIG, "stopped": EXIT_STOPPED, "watchdog": EXIT_WATCHDOG}[kind]


def _is_actor_died(err: BaseException) -> bool:
    try:
        from ray.exceptions import RayActorError
    except ImportError:
        return False
    return isinstance(err, RayActorError)
