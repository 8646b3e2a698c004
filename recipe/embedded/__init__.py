"""The embedded engine: DAPO in a single process (no Ray), on the CPU or one GPU, reading verl's config keys.

``trainer.run(cfg)`` is the entry point (``dapo-train`` calls it). Modules: ``config`` (the keys it reads, checked),
``data`` (verl-schema prompts), ``task`` / ``warmup`` (the default tiny model on synthetic addition), ``decode``
(the KV-cache sampling loop and the shared-prompt update forward), ``rollout`` (the ``generate`` reference the
tests compare ``decode`` with), ``guard`` (stops a run whose updates are all skipped), ``checkpoint``, ``monitor``
(metrics.jsonl, W&B, tqdm, plots). The input checks, the reward guard and the run identity it shares with the verl
engine are in ``recipe.common``.
"""
