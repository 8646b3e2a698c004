"""verl plugin: registers DAPO in every process that imports verl, Ray workers included.

verl's ``__init__`` imports this module in two ways (``verl/__init__.py``):

* the ``verl.plugins`` entry point ``dapo = "recipe.dapo.plugin"`` (pyproject.toml), live once the project is
  pip-installed on the machine (``pip install -e .``); ``VERL_USE_EXTERNAL_PLUGINS=none`` turns it off;
* ``VERL_USE_EXTERNAL_MODULES=recipe.dapo.plugin``, for a Ray job whose nodes do not have the project
  installed but receive it as the job's working directory (``scripts/train_dapo_qwen32b.sh`` sets it in the
  job's runtime environment).

It registers, each in verl's own registry:

* the policy loss ``dapo`` (``actor_rollout_ref.actor.policy_loss.loss_mode=dapo``), used by the actor workers;
* the reward-loop manager ``dapo_paper`` (``reward.reward_manager.name=dapo_paper``), used by the reward workers;
* the V1 trainers ``dapo``, ``dapo_colocate_async`` and ``dapo_separate_async`` (``trainer.v1.trainer_mode``), used
  by verl's TaskRunner;

and makes verl's ``file`` logger append to the records a resumed run keeps (a checked runtime patch of verl
0.9.1's ``FileLogger``, ``recipe.dapo.verl_patches``).

verl swallows exceptions from entry points (they are logged at DEBUG level), so a failure is logged here as a
warning that names the fix before it propagates.
"""

from __future__ import annotations

import logging

try:
    from recipe.dapo import policy_loss, reward_manager, trainer  # noqa: F401  (registration on import)
    from recipe.dapo.verl_patches import patch_file_logger_append

    patch_file_logger_append()
except Exception:
    logging.getLogger(__name__).warning(
        "the DAPO verl plugin (recipe.dapo.plugin) failed to import, so the 'dapo' policy loss, the 'dapo_paper' "
        "reward manager and the DAPO trainers are not registered in this process. Check that this process sees "
        "the project (pip install -e <repo>, or ship it as the Ray job's working_dir with "
        "VERL_USE_EXTERNAL_MODULES=recipe.dapo.plugin) and that verl==0.9.1 is installed.",
        exc_info=True,
    )
    raise
