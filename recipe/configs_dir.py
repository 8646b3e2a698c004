"""Where the Hydra configs are: ``$DAPO_CONFIG_DIR``, else the repository's ``configs/`` (a source checkout or an
editable install), else the copy installed with the package (``dapo_verl_configs``, the same files as package
data), so that both entry points work from any directory after a plain ``pip install``."""

from __future__ import annotations

import os
from pathlib import Path

INSTALLED_PACKAGE = "dapo_verl_configs"


def config_dir() -> Path:
    if os.environ.get("DAPO_CONFIG_DIR"):
        return Path(os.environ["DAPO_CONFIG_DIR"]).expanduser().resolve()
    checkout = Path(__file__).resolve().parents[1] / "configs"
    if (checkout / "embedded.yaml").is_file():
        return checkout
    from importlib.util import find_spec

    spec = find_spec(INSTALLED_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]).resolve()
    return checkout  # absent: the caller says so, naming DAPO_CONFIG_DIR
