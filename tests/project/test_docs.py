"""The README is the front door: it opens with the two commands, CI runs its test command, it stays short, and its
links reach the docs pages; every DAPO knob has its line in the docs (metrics: the generated reference,
``tests/project/test_docs_site.py``)."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
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


def test_the_readme_reads_in_two_minutes_and_its_links_resolve():
    assert len(README.splitlines()) <= 150, "the README is the front door: keep reports in docs/"
    links = re.findall(r"\]\(((?!https?://)[^)#]+)\)", README)
    assert links, "the README links into docs/"
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, f"README links to missing files {missing}"


def test_every_dapo_knob_has_a_line_in_the_docs():
    config = yaml.safe_load((ROOT / "configs" / "dapo_trainer.yaml").read_text())
    knobs = [f"dapo.{key}" for key in _leaf_keys(config["dapo"])]
    algorithm = (ROOT / "docs" / "algorithm.md").read_text()
    missing = [knob for knob in knobs if f"`{knob}`" not in algorithm]
    assert not missing, f"docs/algorithm.md lacks a line for config keys {missing}"
