"""The engines that drive the ``dapo`` algorithm: ``recipe.embedded`` (one process, Hugging Face ``generate``) and
``recipe.dapo`` (verl: Ray, vLLM, FSDP). ``recipe.cli`` (the ``dapo-train`` command) composes the config and picks one."""
