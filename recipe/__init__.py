"""The engines that drive the ``dapo`` algorithm: ``recipe.embedded`` (one process, its own decode loop) and
``recipe.dapo`` (verl: Ray, vLLM, FSDP), with ``recipe.common`` the plumbing both use. ``recipe.cli`` (the
``dapo-train`` command) composes the config and picks one."""
