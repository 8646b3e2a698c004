"""DAPO on verl 0.9.1's V1 trainer (Ray workers, vLLM rollout, FSDP actors).

Everything plugs into verl through its own extension points:

==========================  ==========================================  ==============================================
module                      verl extension point                        config key
==========================  ==========================================  ==============================================
``policy_loss``             ``core_algos.register_policy_loss``         ``actor.policy_loss.loss_mode=dapo``
``reward_manager``          reward-loop ``reward_manager.register``     ``reward.reward_manager.name=dapo_paper``
``sampler``                 V1 replay-buffer hook                       ``trainer.v1.sampler.custom_sampler``
``trainer``                 ``trainer.ppo.v1.register_trainer``         ``trainer.v1.trainer_mode=dapo`` (sync),
                                                                        ``dapo_colocate_async`` or
                                                                        ``dapo_separate_async``
``cpu.checkpoint_engine``   ``CheckpointEngineRegistry``                ``rollout.checkpoint_engine.backend=shm``
                            (``custom_backend_module``)                 (separate_async on one CPU machine)
``plugin``                  ``verl.plugins`` entry point /              (loaded by ``import verl`` in every process)
                            ``VERL_USE_EXTERNAL_MODULES``
``main_dapo``               verl's ``run_ppo`` + V1 ``TaskRunnerV1``    ``python -m recipe.dapo.main_dapo``
==========================  ==========================================  ==============================================

Where no extension point exists, a checked runtime patch: all of verl's are in ``verl_patches``, all of vLLM's in
``cpu.vllm_patches`` (each names its upstream target and version and checks it at start-up); one method,
``DAPOTrainer._init_tokenizer``, overrides verl's with a copy of its body plus one line, and says so.

The math lives in ``dapo/`` (pure torch); these modules only translate between verl's objects and it.
Importing this package imports nothing of verl.
"""
