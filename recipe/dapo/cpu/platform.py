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

:func:`activate` checks the versions and applies the two runtime patches this platform needs, because no
extension point exists: :func:`recipe.dapo.verl_patches.patch_process_group_backend` (verl's process group on CPU)
and :func:`recipe.dapo.cpu.vllm_patches.patch_vllm_pause_generation` (verl 0.9.1's call to pause vLLM, whose
keyword vLLM 0.32 renamed; the asynchronous trainers make it).
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Any, Optional

import psutil
import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

from recipe.dapo.cpu.versions import check_versions
from recipe.dapo.cpu.vllm_patches import patch_vllm_pause_generation
from recipe.dapo.verl_patches import patch_process_group_backend

PLATFORM_NAME = "cpu"


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


def activate() -> None:
    """Version checks and the patches, in processes that selected this platform (``VERL_PLATFORM=cpu``)."""
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != PLATFORM_NAME:
        return
    check_versions()
    patch_process_group_backend()
    patch_vllm_pause_generation()


activate()
