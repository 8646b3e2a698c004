"""Hydra search-path plugin: puts verl's packaged configs (``pkg://verl.trainer.config``) on every search path.

Hydra lets only the primary config set ``hydra.searchpath``, and ``configs/embedded.yaml`` composes
``configs/dapo_trainer.yaml``, which composes verl's ``ppo_trainer``; so the path is added here, once, for every
compose of this project's configs (``dapo-train``, ``python -m recipe.dapo.main_dapo``, the tests). Hydra finds
this module through the ``hydra_plugins`` namespace package.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

VERL_CONFIGS = "pkg://verl.trainer.config"


class VerlConfigSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="verl", path=VERL_CONFIGS)
