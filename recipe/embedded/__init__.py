"""The embedded engine: DAPO in a single process (no Ray), on the CPU or one GPU, reading verl's config keys.

``trainer.run(cfg)`` is the entry point (``dapo-train`` calls it); ``trainer.EmbeddedTrainer`` is its
setup / train / cleanup. Modules: ``config`` (the keys it reads, as typed sections, checked), ``policy`` (the model,
its precision and its sampling copy), ``data`` (verl-schema prompts), ``decode`` (the KV-cache sampling loop and the
shared-prompt update forward), ``rollout`` (sampling parameters, padding, the response mask and batched
log-probabilities), ``evaluation`` (scoring and validation), ``guard`` (stops a run whose updates are all
skipped), ``checkpoint`` (checkpoints and resume), ``monitor`` (metrics.jsonl, W&B, tqdm, plots). The input checks,
the reward guard, the run identity and the default tiny model with its tasks and warm-up (``recipe.common.task`` /
``warmup``) it shares with the verl engine are in ``recipe.common``.
"""
