"""A verl platform named ``cpu``: verl 0.9.1's trainer on CPU processes, gloo collectives, logical Ray GPUs.

Loaded by verl in every process that imports it (driver, TaskRunner, actor and rollout workers) through
``VERL_USE_EXTERNAL_MODULES=recipe.dapo.cpu.platform,recipe.dapo.plugin`` (this module first: it must be registered
before anything asks verl for its platform), and selected by ``VERL_PLATFORM=cpu``. It registers
:class:`PlatformCPU` with verl's ``PlatformRegistry`` (``verl/plugin/platform/platform_manager.py``), the
extension point verl provides for new hardware. What it decides:

* device ``cpu``, collectives ``gloo``;
* the Ray resource stays ``"GPU"``: the config declares logical GPUs to Ray (``+ray_kwargs.ray_init.num_gpus``),
  one per FSDP rank or rollout replica, so verl's resource pools place workers exactly as on a GPU node;
* the device module is ``torch.cpu`` completed with the ``torch.cuda`` calls verl makes (memory statistics, RNG
  state, IPC), as no-ops or their host-memory meaning.

verl's FSDP engine is registered for ``cuda`` and ``npu`` only (``verl/workers/engine/base.py``), so the runs set
``VERL_ENGINE_DEVICE=cuda`` to pick it; every tensor still lives on the CPU, since the engine asks the platform.

One runtime patch of verl, because no extension point exists: see :func:`patch_process_group_backend`.
"""

from __future__ import annotations

import os
import sys
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import psutil
import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

from recipe.dapo.cpu.versions import check_versions

PLATFORM_NAME = "cpu"
_IMPORT_BY_NAME = "from verl.utils.distributed import initialize_global_process_group_ray"


def _cpu_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` functions verl 0.9.1 calls on ``get_torch_device()``."""
    module = types.ModuleType("verl_cpu_device")
    for name in (
        "synchronize",
        "is_available",
        "current_stream",
        "stream",
        "Stream",
        "Event",
        "device_count",
        "set_device",
    ):
        setattr(module, name, getattr(torch.cpu, name))

    def mem_get_info(device=None):  # (free, total) bytes of host memory
        memory = psutil.virtual_memory()
        return memory.available, memory.total

    def rss(device=None) -> int:
        return psutil.Process().memory_info().rss

    def noop(*args, **kwargs):
        return None

    module.current_device = lambda: torch.device("cpu")  # verl passes it to .to() (fsdp2_load_full_state_dict)
    module.mem_get_info = mem_get_info
    module.memory_allocated = module.memory_reserved = rss
    module.max_memory_allocated = module.max_memory_reserved = rss
    module.empty_cache = module.ipc_collect = module.set_per_process_memory_fraction = noop
    module.reset_peak_memory_stats = noop
    module.manual_seed = module.manual_seed_all = torch.manual_seed
    module.get_rng_state = lambda device=None: torch.get_rng_state()
    module.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    module.get_device_name = lambda device=None: "cpu"
    module.is_initialized = lambda: True
    return module


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl's platform interface on host CPUs (``VERL_PLATFORM=cpu``)."""

    _module = _cpu_device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return self._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check=False) -> bool:
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME  # never auto-detected

    def current_device(self):
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: Optional[int] = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[Optional[int], Optional[int]]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the logical GPUs; nothing reads it on a CPU

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def cudart(self) -> Any:
        return None


def patch_process_group_backend() -> None:
    """Runtime patch of ``verl/utils/distributed.py:initialize_global_process_group_ray`` (verl 0.9.1).

    verl builds the backend string ``f"cpu:gloo,{device}:{backend}"``, which on this platform is
    ``"cpu:gloo,cpu:gloo"``, and torch refuses it (``Duplicate device type cpu in backend string``). The patch
    passes ``backend="cpu:gloo"`` when the caller gave none; verl's workers import the function by name
    (``verl/workers/engine_workers.py``), so both bindings are replaced. Checked: the function must still take a
    ``backend`` keyword and build that string, else this raises naming what moved.
    """
    import inspect

    import verl.utils.distributed as distributed

    original = distributed.initialize_global_process_group_ray
    if getattr(original, "_dapo_cpu_patched", False):
        return
    source = inspect.getsource(original)
    if "backend" not in inspect.signature(original).parameters or 'f"cpu:gloo,{get_device_name()}' not in source:
        raise RuntimeError(
            "verl/utils/distributed.py:initialize_global_process_group_ray no longer takes `backend` or builds "
            "'cpu:gloo,{device}:{backend}' (the CPU platform patches it for verl 0.9.1): check the installed verl "
            "against constraints/verl-cpu.txt and update recipe/dapo/cpu/platform.py"
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


def activate() -> None:
    """Version checks and the verl patch, in processes that selected this platform (``VERL_PLATFORM=cpu``)."""
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != PLATFORM_NAME:
        return
    check_versions()
    patch_process_group_backend()


activate()
