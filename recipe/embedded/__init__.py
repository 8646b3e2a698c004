"""The embedded engine: DAPO in a single process (no Ray), on the CPU or one GPU, reading verl's config keys.

``trainer.run(cfg)`` is the entry point (``dapo-train`` calls it). Modules: ``config`` (the keys it reads, checked),
``data`` (verl-schema prompts), ``task`` / ``warmup`` (the default tiny model on synthetic addition), ``rollout``
(``generate`` and log-probs), ``checkpoint``, ``monitor`` (metrics.jsonl, W&B, tqdm, plots).
"""
