"""``dapo-train`` / ``python -m recipe.cli``: compose the Hydra config and run the chosen engine.

    dapo-train                                   # the embedded default (configs/embedded.yaml)
    dapo-train trainer.total_training_steps=20   # any key=value override, verl's names
    dapo-train dapo.engine=verl ...              # the verl engine (recipe.dapo.main_dapo.run_dapo)
    dapo-train --config-name dapo_trainer ...    # another config of the configs directory

The configs directory is ``$DAPO_CONFIG_DIR``, else the repository's ``configs/``, else the copy installed with the
package (``recipe.configs_dir``). Composition
runs in Hydra's struct mode, so a misspelt key fails at once, with the key named and no traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

USAGE = __doc__.split("\n\n")[1]
DEFAULT_CONFIG = "embedded"


def config_dir() -> Path:
    from recipe.configs_dir import config_dir as find

    return find()


def compose(overrides: list[str], config_name: str = DEFAULT_CONFIG):
    """The composed config (raises Hydra's errors on unknown keys or bad override syntax)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    directory = config_dir()
    if not (directory / f"{config_name}.yaml").is_file():
        raise FileNotFoundError(
            f"no config {config_name}.yaml in {directory}; set DAPO_CONFIG_DIR to the repository's configs directory"
        )
    # verl's own configs (ppo_trainer) come onto the search path through hydra_plugins/dapo_verl
    with initialize_config_dir(config_dir=str(directory), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)


def _split_args(args: list[str]) -> tuple[str, list[str]]:
    config_name, overrides = DEFAULT_CONFIG, []
    it = iter(args)
    for arg in it:
        if arg in ("--config-name", "-cn"):
            config_name = next(it, DEFAULT_CONFIG)
        elif arg.startswith("--config-name="):
            config_name = arg.split("=", 1)[1]
        else:
            overrides.append(arg)
    return config_name.removesuffix(".yaml"), overrides


def _quiet_verl_import() -> None:
    """Composing imports verl, which announces every optional engine it lacks and, without a GPU, that it falls
    back to CUDA; neither says anything about this run (the verl engine reports a missing GPU itself)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)
    # a filter, not a level: verl sets this logger's level when it is imported
    logging.getLogger("verl.plugin.platform.platform_manager").addFilter(lambda record: record.levelno >= logging.ERROR)


def _fail(message: str) -> int:
    print(f"dapo-train: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _quiet_verl_import()
    config_name, overrides = _split_args(args)

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from dapo.settings import select

    try:
        cfg = compose(overrides, config_name)
    except (HydraException, OmegaConfBaseException, FileNotFoundError) as err:
        message = str(err).strip()
        cause = str(err.__cause__ or "").strip().split("\n")[0]  # OmegaConf's first line names the key
        if cause and cause not in message:
            message = f"{message} ({cause})" if message else cause
        return _fail(message.replace("\n", "\n  "))

    engine = select(cfg, "dapo.engine", "verl")
    try:
        return _run_engine(cfg, engine)
    except Exception as err:  # bad input (ConfigError, exit 2) or a run stopped (RunStopped, exit 1), raised here or
        from recipe.common.rundir import carried_error  # in a Ray worker of the verl engine (wrapped in Ray's error)

        carried = carried_error(err)
        if carried is None:
            raise
        kind, message = carried
        print(f"dapo-train: {kind}: {message}", file=sys.stderr)
        return 1 if kind == "stopped" else 2
    except KeyboardInterrupt:
        run_dir = select(cfg, "trainer.default_local_dir", "the run directory")
        print(
            f"dapo-train: interrupted; the checkpoints in {run_dir} are kept: run the same command to resume from "
            "the latest",
            file=sys.stderr,
        )
        return 130


def _run_engine(cfg, engine: str) -> int:
    if engine == "embedded":
        from recipe.embedded.trainer import run

        run(cfg)
        return 0
    if engine == "verl":
        try:
            from recipe.dapo.main_dapo import run_dapo
        except ImportError as err:
            return _fail(
                f"dapo.engine=verl needs recipe.dapo.main_dapo.run_dapo, which cannot be imported ({err}); "
                "install the project with its verl recipe, or use dapo.engine=embedded"
            )
        run_dapo(cfg)
        return 0
    return _fail(f"dapo.engine={engine!r} is unknown; use embedded or verl")


if __name__ == "__main__":
    sys.exit(main())
