"""``dapo-train`` / ``python -m recipe.cli``: compose the Hydra config and run the engine it names.

    dapo-train                                   # the embedded default (configs/embedded.yaml)
    dapo-train trainer.total_training_steps=20   # any key=value override, verl's names
    dapo-train --config-name embedded_smollm2    # another config of the configs directory (--help lists them)
    dapo-train dapo.engine=verl ...              # the verl engine (recipe.dapo.main_dapo.run_dapo)
    dapo-train --cfg job [...]                   # print the composed config and exit

Composing, the configs directory and the exit codes are ``recipe.config``'s (one table for both entry points).
"""

from __future__ import annotations

import importlib
import os
import sys

from recipe.config import (
    DEFAULT_CONFIG,
    EXIT_CONFIG,
    compose,
    compose_error,
    config_dir,
    config_names,
    fail,
    finish,
    split_args,
)

PROG = "dapo-train"
#: dapo.engine -> the function that trains a composed config (module:function), imported only when chosen
ENGINES = {
    "embedded": "recipe.embedded.trainer:run",
    "verl": "recipe.dapo.main_dapo:run_dapo",
}
#: the keys most runs set, for --help
COMMON_KEYS = (
    ("trainer.total_training_steps", "rollout steps"),
    ("trainer.default_local_dir", "the run directory: metrics.jsonl, plots, W&B, checkpoints (resumed from)"),
    ("trainer.logger", "[console,wandb] (W&B offline without credentials), tensorboard"),
    ("actor_rollout_ref.model.path", "a local Hugging Face model folder (null: the tiny model)"),
    ("data.train_files / data.val_files", "parquet in verl's schema"),
    ("data.max_prompt_length / data.max_response_length", "token budgets"),
    ("data.train_batch_size", "prompts per step (kept groups)"),
    ("actor_rollout_ref.rollout.n", "responses per prompt"),
    ("actor_rollout_ref.actor.optim.lr", "learning rate"),
    ("dapo.engine", "embedded | verl"),
)


def usage() -> str:
    keys = "\n".join(f"  {key:<52} {meaning}" for key, meaning in COMMON_KEYS)
    return (
        f"{__doc__.split(chr(10) * 2)[1]}\n\nconfigs ({config_dir()}): {', '.join(config_names())}\n\n"
        f"common keys (every key: docs/reference/configuration.md):\n{keys}\n\n"
        "exit codes: 0 trained, 1 stopped at run time, 2 config refused, 75 stopped by the watchdog (resume with the "
        "same command), 130 interrupted"
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in args):
        print(usage())
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print_config = _take_cfg_flag(args)
    config_name, overrides = split_args(args, DEFAULT_CONFIG)

    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from dapo.settings import select

    try:
        cfg = compose(overrides, config_name)
    except (HydraException, OmegaConfBaseException, FileNotFoundError) as err:
        return fail(PROG, compose_error(err))
    if print_config:
        print(OmegaConf.to_yaml(cfg))
        return 0
    engine = select(cfg, "dapo.engine", required=True)
    if engine not in ENGINES:
        return fail(PROG, f"dapo.engine={engine!r} is unknown; use one of {', '.join(ENGINES)}")
    module, function = ENGINES[engine].split(":")
    try:
        train = getattr(importlib.import_module(module), function)
    except ImportError as err:
        return fail(
            PROG,
            f"dapo.engine={engine} needs {module}, which cannot be imported ({err}); install the project with its "
            f"dependencies for that engine (the verl engine: verl and vLLM), or set dapo.engine to another one "
            f"({', '.join(name for name in ENGINES if name != engine)})",
            EXIT_CONFIG,
        )
    run_dir = select(cfg, "trainer.default_local_dir")
    if engine == "verl":  # dapo.watchdog.max_restarts > 0: this process reruns the command after a watchdog stop
        from omegaconf import OmegaConf as _OmegaConf

        from recipe.common.watchdog import WatchdogSettings
        from recipe.dapo.watchdog import supervise

        code = supervise(WatchdogSettings.from_config(_OmegaConf.to_container(cfg, resolve=True)), run_dir, prog=PROG)
        if code is not None:
            return code
    return finish(PROG, lambda: train(cfg), run_dir)


def _take_cfg_flag(args: list[str]) -> bool:
    """Hydra's ``--cfg job`` (and ``--cfg all``, ``-c job``), or ``--print-config``: removed from ``args``."""
    for i, arg in enumerate(args):
        if arg == "--print-config":
            del args[i]
            return True
        if arg in ("--cfg", "-c") and i + 1 < len(args) and args[i + 1] in ("job", "all"):
            del args[i : i + 2]
            return True
    return False


if __name__ == "__main__":
    sys.exit(main())
