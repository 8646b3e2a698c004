"""A verl checkpoint engine through a file in shared memory: ``checkpoint_engine.backend=shm``.

verl 0.9.1's ``separate_async`` trainer moves the actor's weights to standalone rollout servers through a
checkpoint engine (``verl/checkpoint_engine/base.py``, ``CheckpointEngine``), and refuses ``naive``, which only
works inside one process. The engines verl ships (nccl, hccl, nixl, mooncake, kimi) need GPUs, RDMA or packages
this machine does not have. This one needs a directory that the actor's rank 0 and every rollout worker see:
``/dev/shm`` (host memory) on one machine, what the CPU route of ``separate_async`` runs on.

One weight sync, as verl's ``CheckpointEngineManager.update_weights`` drives it:

1. ``prepare`` on every actor rank and rollout worker: the actor's rank 0 names this sync's file (unique);
2. ``build_topology``: every worker gets that name;
3. ``send_weights`` on every actor rank (each must drain the generator: FSDP gathers each full tensor
   collectively) and ``receive_weights`` on every rollout worker, concurrently: rank 0 writes the tensors and the
   step they belong to to a temporary name and renames it (a reader never sees half a file); the receivers wait
   for the name, map the file (``torch.load(mmap=True)``), check the step and yield the tensors to verl's vLLM
   ``ServerAdapter``, which copies them into the server;
4. ``finalize`` once every side has finished: rank 0 removes the file.

Registered with verl's ``CheckpointEngineRegistry`` on import; verl imports this module in the actor workers, the
rollout's ``CheckpointEngineWorker`` processes and the manager through
``actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.dapo.cpu.checkpoint_engine``, the
extension point it provides for backends. Options (``checkpoint_engine.engine_kwargs.shm``): ``directory``
(default ``/dev/shm``) and ``timeout_s``, how long a receiver waits for the file (default 600).

Metrics each sync returns (verl logs them with the step): ``dapo/weight_transfer/bytes`` and
``dapo/weight_transfer/write_s``.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from verl.checkpoint_engine import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

BACKEND = "shm"
MODULE = "recipe.dapo.cpu.checkpoint_engine"


@CheckpointEngineRegistry.register(BACKEND)
class SharedMemoryCheckpointEngine(CheckpointEngine):
    """Weights from the actor's rank 0 to the rollout workers through one file per sync in ``directory``."""

    def __init__(
        self,
        bucket_size: int,
        is_master: bool = False,
        directory: str = "/dev/shm",
        timeout_s: float = 600.0,
        poll_s: float = 0.05,
    ) -> None:
        self.bucket_size = bucket_size  # verl's interface; a file has no buckets
        self.is_master = is_master  # the actor's rank 0 (verl passes it on the actor side only)
        self.directory = Path(directory)
        self.timeout_s, self.poll_s = float(timeout_s), float(poll_s)
        self.path: Path | None = None

    def prepare(self) -> dict[str, Any]:
        if not self.is_master:
            return {}
        if not self.directory.is_dir():
            raise FileNotFoundError(
                f"checkpoint_engine.backend={BACKEND}: the directory {self.directory} does not exist; set "
                f"actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.{BACKEND}.directory to a directory the "
                "actor and the rollout servers both see"
            )
        return {"path": str(self.directory / f"dapo-weights-{os.getpid()}-{uuid.uuid4().hex}.pt")}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        # metadata: the actor ranks' (rank 0 first), then the rollout workers'
        path = metadata[0].get("path")
        if path is None:
            raise RuntimeError(f"checkpoint_engine.backend={BACKEND}: the actor's rank 0 named no file in prepare()")
        return {"path": [path] * actor_wg_world_size}, {"path": [path] * rollout_world_size}

    def init_process_group(self, path: str) -> None:
        self.path = Path(path)

    def finalize(self) -> None:
        if self.is_master and self.path is not None:
            self.path.unlink(missing_ok=True)
        self.path = None

    async def send_weights(self, weights, global_steps: int | None = None) -> dict[str, float]:
        tensors: dict[str, torch.Tensor] = {}
        async for name, tensor in ensure_async_iterator(weights):  # every rank drains: the gathers are collective
            if self.is_master:
                # a copy: the generator may hand out views of the live parameters, or reuse one buffer
                tensors[name] = tensor.detach().to("cpu", copy=True)
        if not self.is_master:
            return {}
        start = time.perf_counter()
        partial = self.path.with_name(self.path.name + ".partial")
        torch.save({"global_steps": global_steps, "tensors": tensors}, partial)
        os.replace(partial, self.path)  # atomic: a receiver sees the whole file or none
        size = self.path.stat().st_size
        return {"dapo/weight_transfer/bytes": float(size), "dapo/weight_transfer/write_s": time.perf_counter() - start}

    async def receive_weights(self, global_steps: int | None = None):
        waited = 0.0
        while not self.path.exists():
            if waited > self.timeout_s:
                raise TimeoutError(
                    f"checkpoint_engine.backend={BACKEND}: no weights at {self.path} after {self.timeout_s:.0f} s "
                    "(the actor's rank 0 writes them; is the directory shared with this rollout server? raise "
                    f"checkpoint_engine.engine_kwargs.{BACKEND}.timeout_s for a slow actor)"
                )
            await asyncio.sleep(self.poll_s)
            waited += self.poll_s
        state = torch.load(self.path, mmap=True, weights_only=True)
        if state["global_steps"] != global_steps:
            raise RuntimeError(
                f"checkpoint_engine.backend={BACKEND}: {self.path} holds the weights of step {state['global_steps']}, "
                f"this sync is for step {global_steps}"
            )
        for name, tensor in state["tensors"].items():
            yield name, tensor
