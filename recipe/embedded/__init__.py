"""The embedded engine: DAPO in a single process (no Ray), on the CPU or one GPU, reading verl's config keys.

``trainer.run(cfg)`` is the entry point (``dapo-train`` calls it). Modules: ``config`` (the keys it reads, checked),
``data`` (verl-schema prompts), ``task`` / ``warmup`` (the default tiny model on synthetic addition), ``decode``
(the KV-cache sampling loop and the shared-prompt update forward), ``rollout`` (the ``generate`` reference the
tests compare ``decode`` with), ``checks`` (inputs checked before the warm-up, the reward guard, the update
guard), ``identity`` (which run a checkpoint belongs to), ``checkpoint``, ``monitor`` (metrics.jsonl, W&B, tqdm,
plots).
"""
