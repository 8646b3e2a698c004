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

Two runtime patches, because no extension point exists: :func:`patch_process_group_backend` (verl's process
group on CPU) and :func:`patch_vllm_pause_generation` (verl 0.9.1's call to pause vLLM, whose keyword vLLM 0.32
renamed; the asynchronous trainers make it).
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


VLLM_ASYNC_LLM = "vllm.v1.engine.async_llm"
_VERL_PAUSE_CALL = "pause_generation(\n                wait_for_inflight_requests=False,"


def accept_verl_pause_keyword(async_llm_module: types.ModuleType) -> None:
    """Runtime patch of vLLM 0.32.0's ``AsyncLLM.pause_generation`` (``vllm/v1/engine/async_llm.py``) for verl 0.9.1.

    verl's ``vLLMHttpServer.abort_all_requests`` (``verl/workers/rollout/vllm_rollout/vllm_async_server.py``), which
    the asynchronous trainers call to stop the rollout before every update (partial rollouts), pauses the engine
    with ``pause_generation(wait_for_inflight_requests=False, clear_cache=...)``: the keyword of vLLM 0.24, verl's
    pin. vLLM 0.32 (the CPU build this platform pins) names the same choice ``mode="abort"`` (``"wait"`` for
    ``True``) and refuses the old keyword with a ``TypeError``. The patch accepts both. Checked: the method must take
    ``mode`` and not the old keyword, else this raises naming what moved.
    """
    import inspect

    cls = async_llm_module.AsyncLLM
    original = cls.pause_generation
    if getattr(original, "_dapo_cpu_patched", False):
        return
    params = inspect.signature(original).parameters
    if "wait_for_inflight_requests" in params or "mode" not in params or "clear_cache" not in params:
        raise RuntimeError(
            f"{VLLM_ASYNC_LLM}.AsyncLLM.pause_generation no longer takes (mode, clear_cache) without "
            "wait_for_inflight_requests (the CPU platform adapts it for verl 0.9.1 on vLLM 0.32.0): check the "
            "installed vLLM against constraints/verl-cpu.txt and update recipe/dapo/cpu/platform.py"
        )

    async def pause_generation(self, *, wait_for_inflight_requests=None, mode=None, clear_cache=True):
        if wait_for_inflight_requests is not None:  # verl 0.9.1's call
            mode = "wait" if wait_for_inflight_requests else "abort"
        return await original(self, mode=mode or "abort", clear_cache=clear_cache)

    pause_generation._dapo_cpu_patched = True
    cls.pause_generation = pause_generation


class _PatchAfterImport:
    """A ``sys.meta_path`` finder that runs ``patch(module)`` once ``name`` is imported, wherever that happens: most
    of verl's processes never import vLLM, so the patch must not import it itself."""

    def __init__(self, name: str, patch) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                execute = spec.loader.exec_module

                def exec_module(module):
                    execute(module)
                    self.patch(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


def patch_vllm_pause_generation() -> None:
    """:func:`accept_verl_pause_keyword`, now if vLLM's ``AsyncLLM`` is imported, else when it is. Checked at start:
    verl's server must still make the call the patch adapts."""
    server = Path(sys.modules["verl"].__file__).parent / "workers" / "rollout" / "vllm_rollout" / "vllm_async_server.py"
    if not server.is_file() or _VERL_PAUSE_CALL not in server.read_text():
        raise RuntimeError(
            "verl/workers/rollout/vllm_rollout/vllm_async_server.py no longer calls "
            "pause_generation(wait_for_inflight_requests=False, ...) (the CPU platform adapts that call to vLLM "
            "0.32.0 for verl 0.9.1): update recipe/dapo/cpu/platform.py"
        )
    if VLLM_ASYNC_LLM in sys.modules:
        accept_verl_pause_keyword(sys.modules[VLLM_ASYNC_LLM])
    elif not any(isinstance(f, _PatchAfterImport) and f.name == VLLM_ASYNC_LLM for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport(VLLM_ASYNC_LLM, accept_verl_pause_keyword))


def activate() -> None:
    """Version checks and the patches, in processes that selected this platform (``VERL_PLATFORM=cpu``)."""
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != PLATFORM_NAME:
        return
    check_versions()
    patch_process_group_backend()
    patch_vllm_pause_generation()


activate()
