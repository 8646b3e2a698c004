"""What both engines use and neither owns.

Run plumbing: ``checks`` (data files, reward functions, checked before any expensive work), ``identity`` (which run a
checkpoint belongs to), ``rundir`` (one run per directory, errors that stop a run), ``tracking`` (W&B with a bounded
wait), ``integrity`` (is a checkpoint's file whole), ``cache`` (content-keyed builds, renamed into place when
complete), ``cpu`` (does this CPU compute in bf16), ``metrics_file`` (``metrics.jsonl``, verl's line format, written
and read by both engines' tools).

Models and tasks: ``task`` / ``warmup`` (the tiny Qwen2, its synthetic arithmetic tasks and its cached supervised
warm-up: the embedded engine's default run and the verl engine's CPU run train it), ``log_probs`` (per-token
log-probabilities by one full forward), ``word_problems`` and ``gguf_model`` (the real model's task and its
conversion, ``recipe.smollm2``)."""
