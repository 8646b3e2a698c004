"""Package layout that pyproject.toml cannot say alone: the repository's ``configs/`` ships inside the wheel as
the package ``dapo_verl_configs`` (its YAML files as package data), beside the packages found automatically, so
that an installed ``dapo-train`` / ``python -m recipe.dapo.main_dapo`` finds its configs from any directory
(``recipe/config.py``). Everything else is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

CONFIG_PACKAGES = ["dapo_verl_configs", "dapo_verl_configs.experiment"]

setup(
    packages=find_namespace_packages(include=["dapo*", "recipe*", "hydra_plugins*"]) + CONFIG_PACKAGES,
    package_dir={"dapo_verl_configs": "configs"},
    package_data={name: ["*.yaml"] for name in CONFIG_PACKAGES},
)
