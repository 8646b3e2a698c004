"""Every runtime patch of verl the recipe applies, for verl 0.9.1 (the pin): each replaces one upstream function or
attribute in memory (nothing on disk), is idempotent, and checks at start-up that the code it adapts is still the
code it was written for, raising an error that names what moved. The table is ``docs/verl.md`` ("Version
workarounds"); vLLM's are in :mod:`recipe.dapo.cpu.vllm_patches`.

* :func:`patch_file_logger_append`: ``verl/utils/tracking.py:FileLogger.__init__`` opens ``metrics.jsonl`` with
  ``"wb"``, so a resumed run would lose its earlier records; applied by ``recipe.dapo.plugin`` in every process.
* :func:`accept_flush_in_separate_async_log`: ``verl/trainer/ppo/v1/trainer_separate_async.py`` logs with
  ``flush=True``, which ``logging`` refuses; applied by the ``dapo_separate_async`` trainer.
* :func:`patch_process_group_backend`: ``verl/utils/distributed.py:initialize_global_process_group_ray`` builds a
  backend string torch refuses on a CPU; applied by the CPU platform (``recipe.dapo.cpu.platform.activate``).

Where the recipe overrides a verl method with a copy of verl's body, the override says so and names the upstream
function (``DAPOTrainer._init_tokenizer``).
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from pathlib import Path

_IMPORT_BY_NAME = "from verl.utils.distributed import initialize_global_process_group_ray"


def patch_file_logger_append() -> None:
    """Runtime patch of ``verl/utils/tracking.py:FileLogger.__init__`` (verl 0.9.1): open the metrics file with
    ``"ab"`` instead of ``"wb"``, so that the records :func:`recipe.dapo.resume.prepare_metrics` kept survive the
    restart. The replacement is verl's ``__init__`` with that one change; checked: verl's must still open the file
    with ``"wb"`` at ``self.filepath``, else this raises naming what moved."""
    from verl.utils import tracking

    logger_cls = tracking.FileLogger
    if getattr(logger_cls.__init__, "_dapo_append", False):
        return
    source = inspect.getsource(logger_cls.__init__)
    if 'open(self.filepath, "wb", buffering=0)' not in source or "VERL_FILE_LOGGER_PATH" not in source:
        raise RuntimeError(
            "verl/utils/tracking.py:FileLogger.__init__ no longer opens VERL_FILE_LOGGER_PATH with 'wb' (the DAPO "
            "recipe patches it to append for verl 0.9.1, so a resumed run keeps its earlier records): check the "
            "installed verl against the pinned 0.9.1 and update recipe/dapo/verl_patches.py"
        )

    def __init__(self, project_name: str, experiment_name: str):  # verl 0.9.1's, appending
        self.project_name, self.experiment_name = project_name, experiment_name
        self.filepath = os.getenv("VERL_FILE_LOGGER_PATH", None)
        if self.filepath is None:
            directory = os.path.join(os.path.expanduser(os.getenv("VERL_FILE_LOGGER_ROOT", ".")), project_name)
            os.makedirs(directory, exist_ok=True)
            self.filepath = os.path.join(directory, f"{experiment_name}.jsonl")
            mode = "wb"  # verl's default path, which prepare_metrics does not trim: verl's behaviour
        else:
            mode = "ab"  # VERL_FILE_LOGGER_PATH: trimmed to the resumed step by prepare_metrics, before Ray
        print(f"Creating file logger at {os.path.abspath(self.filepath)}")
        self.fp = open(self.filepath, mode, buffering=0)

    __init__._dapo_append = True
    logger_cls.__init__ = __init__


class _DropFlush(logging.LoggerAdapter):
    """A logger that accepts, and drops, ``print``'s ``flush`` keyword."""

    def process(self, msg, kwargs):
        kwargs.pop("flush", None)
        return msg, kwargs


def accept_flush_in_separate_async_log() -> None:
    """Runtime patch of verl 0.9.1's ``verl/trainer/ppo/v1/trainer_separate_async.py``: its module ``logger``.

    ``PPOTrainerSeparateAsync._setup`` logs ``logger.info(..., flush=True)`` when
    ``actor_rollout_ref.hybrid_engine=false`` (the rollout on its own devices only), and ``logging.Logger`` takes no
    ``flush`` keyword: the trainer raises ``TypeError`` before its first step. The module's logger is wrapped in an
    adapter that drops the keyword. Checked: applied only while ``_setup`` still passes ``flush=True``, and the
    module must still have its ``logger``, else this raises naming what moved."""

    from verl.trainer.ppo.v1 import trainer_separate_async as module

    if "flush=True" not in inspect.getsource(module.PPOTrainerSeparateAsync._setup):
        return  # fixed upstream: nothing to adapt
    if not isinstance(getattr(module, "logger", None), logging.Logger | _DropFlush):
        raise RuntimeError(
            "verl/trainer/ppo/v1/trainer_separate_async.py has no module `logger` any more (the recipe adapts its "
            "logger.info(..., flush=True) for verl 0.9.1): update recipe/dapo/verl_patches.py"
        )
    if not isinstance(module.logger, _DropFlush):
        module.logger = _DropFlush(module.logger, {})


def patch_process_group_backend() -> None:
    """Runtime patch of ``verl/utils/distributed.py:initialize_global_process_group_ray`` (verl 0.9.1).

    verl builds the backend string ``f"cpu:gloo,{device}:{backend}"``, which on this platform is
    ``"cpu:gloo,cpu:gloo"``, and torch refuses it (``Duplicate device type cpu in backend string``). The patch
    passes ``backend="cpu:gloo"`` when the caller gave none; verl's workers import the function by name
    (``verl/workers/engine_workers.py``), so both bindings are replaced. Checked: the function must still take a
    ``backend`` keyword and build that string, else this raises naming what moved.
    """

    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_dapo_cpu_patched", False):
        return
    source = inspect.getsource(original)
    if "backend" not in inspect.signature(original).parameters or 'f"cpu:gloo,{get_device_name()}' not in source:
        raise RuntimeError(
            "verl/utils/distributed.py:initialize_global_process_group_ray no longer takes `backend` or builds "
            "'cpu:gloo,{device}:{backend}' (the CPU platform patches it for verl 0.9.1): check the installed verl "
            "against constraints/verl-cpu.txt and update recipe/dapo/verl_patches.py"
        )

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "cpu:gloo")

    initialize_global_process_group_ray._dapo_cpu_patched = True
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
    # verl's workers bind the name at import: imported later, they get the patched function; imported already
    # (not the case when verl loads this module first), their binding is replaced here
    workers_file = Path(distributed.__file__).parents[1] / "workers" / "engine_workers.py"  # not imported here
    if not workers_file.is_file() or _IMPORT_BY_NAME not in workers_file.read_text():
        raise RuntimeError(
            "verl/workers/engine_workers.py no longer imports initialize_global_process_group_ray from "
            "verl.utils.distributed (the CPU platform patches that function for verl 0.9.1): update "
            "recipe/dapo/cpu/platform.py"
        )
    workers = sys.modules.get("verl.workers.engine_workers")
    if workers is not None:
        workers.initialize_global_process_group_ray = initialize_global_process_group_ray
