"""The README is the user's manual: every metric and DAPO knob has its line, and CI runs its test command."""

import re
from pathlib import Path

import yaml

from dapo.metrics import METRIC_DOCS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _leaf_keys(tree, prefix=""):
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _leaf_keys(value, f"{path}.")
        else:
            yield path


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    commands = re.findall(r"```(?:bash|sh)?\n(.*?)```", README, flags=re.S)
    first_block = [line.split("#")[0].strip() for line in commands[0].strip().splitlines()]
    assert first_block == ["make train", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, flags=re.M)


def test_every_metric_has_a_line_in_the_readme():
    missing = [name for name in METRIC_DOCS if f"`{name}`" not in README]
    assert not missing, f"README lacks a line for metrics {missing}"


def test_every_dapo_knob_has_a_line_in_the_readme():
    config = yaml.safe_load((ROOT / "configs" / "dapo_trainer.yaml").read_text())
    knobs = [f"dapo.{key}" for key in _leaf_keys(config["dapo"])]
    missing = [knob for knob in knobs if f"`{knob}`" not in README]
    assert not missing, f"README lacks a line for config keys {missing}"
