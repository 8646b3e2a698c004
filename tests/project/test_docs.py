"""The README is the front door: it opens with the two commands, CI runs its test command, it stays short, and its
links reach the docs pages; every DAPO knob has its line in the docs (metrics: the generated reference,
``tests/project/test_docs_site.py``)."""

import re
import sys
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


def test_every_dapo_knob_is_declared_once_and_has_a_line_in_the_docs():
    """Each ``dapo.*`` key of the yaml has one declaration (``dapo.settings.setting``), which the generated
    configuration reference lists with the yaml's default; docs/algorithm.md points there instead of a copy."""
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    from references import knobs

    config = yaml.safe_load((ROOT / "configs" / "dapo_trainer.yaml").read_text())
    in_yaml = [f"dapo.{key}" for key in _leaf_keys(config["dapo"])]
    declared = [key for key, _, _ in knobs()]
    assert len(declared) == len(set(declared)), "a dapo.* knob declared twice"
    assert sorted(set(in_yaml) - set(declared)) == [], "dapo.* keys of the yaml without a declaration"
    page = (ROOT / "docs" / "reference" / "configuration.md").read_text()
    assert all(f"| `{key}` | " in page for key in declared)
    assert "reference/configuration.md" in (ROOT / "docs" / "algorithm.md").read_text()


def test_every_runtime_patch_lives_in_its_upstreams_module_and_has_a_row_in_the_docs():
    """verl's patches in recipe/dapo/verl_patches.py, vLLM's in recipe/dapo/cpu/vllm_patches.py, each a row of
    docs/verl.md's "Version workarounds" table: a function whose docstring says "Runtime patch of" anywhere else in
    the project fails here, and so does a patch the table does not name."""
    homes = {"recipe/dapo/verl_patches.py": "verl_patches", "recipe/dapo/cpu/vllm_patches.py": "cpu.vllm_patches"}
    docs = (ROOT / "docs" / "verl.md").read_text()
    table = docs[docs.index("## Version workarounds") :].split("\n## ")[0]
    found = {}
    for path in sorted((ROOT / "recipe").rglob("*.py")) + sorted((ROOT / "dapo").rglob("*.py")):
        text = path.read_text()
        for name in re.findall(r'\ndef (\w+)\([^)]*\)[^:]*:\n    """Runtime patch of', text):
            found.setdefault(str(path.relative_to(ROOT)), []).append(name)
    assert set(found) == set(homes), f"runtime patches outside their upstream's module: {found}"
    for path, names in found.items():
        for name in names:
            assert f"`{homes[path]}.{name}`" in table, f"{path}:{name} has no row in docs/verl.md's Version workarounds"
    assert len(re.findall(r"^\| `(?:verl_patches|cpu\.vllm_patches)\.", table, flags=re.M)) == 5


def test_metric_meanings_are_written_only_in_metric_docs():
    """``dapo.metrics.METRIC_DOCS`` is where a metric's meaning is written (the metrics reference is generated from
    it): a docstring bullet ``* ``name``: meaning`` for one of its metrics anywhere in the code fails here."""
    from dapo.metrics import METRIC_DOCS

    found = []
    for path in sorted((ROOT / "dapo").rglob("*.py")) + sorted((ROOT / "recipe").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            match = re.match(r"\s*[*-] ``([^`]+)``:", line)
            if match and match.group(1) in METRIC_DOCS:
                found.append(f"{path.relative_to(ROOT)}:{number} {match.group(1)}")
    assert not found, f"metric meanings written outside dapo.metrics.METRIC_DOCS: {found}"
