"""The docs site builds with no warnings (``make docs``), and its references are generated from the declarations:
every settings field's ``help`` and every metric of ``METRIC_DOCS`` is on its page, and nothing else writes them."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from tests.conftest import run_process

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))  # the extension that writes the reference pages
pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = run_process(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"), str(out)],
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]  # -W: a warning fails the build
    return out


def test_the_site_builds_with_every_page_reachable(site):
    pages = (
        "index",
        "install",
        "embedded",
        "verl",
        "cluster",
        "real-model",
        "algorithm",
        "benchmarks",
        "ablation",
        "testing",
        "reference/configuration",
        "reference/metrics",
    )
    for page in pages:
        assert (site / f"{page}.html").is_file(), page


def test_the_references_are_the_declarations(site):
    from references import SETTINGS, _cell, configuration_page, metrics_page  # docs/_ext

    import dapo.settings as settings
    from dapo.metrics import METRIC_DOCS

    configuration, metrics = configuration_page(), metrics_page()
    for name in SETTINGS:
        for field in dataclasses.fields(getattr(settings, name)):
            assert _cell(field.metadata["help"]) in configuration, (name, field.name)
    for name, text in METRIC_DOCS.items():
        assert f"| `{name}` | {_cell(text)} |" in metrics, name
    # the built pages are these texts rendered: a metric and a help string reach the HTML
    html = (site / "reference" / "metrics.html").read_text()
    assert "dapo/kept_group_frac" in html and "actor/pg_clipfrac" in html
    assert "responses per prompt" in (site / "reference" / "configuration.html").read_text()
    # a help text's <word> is shown as written, not read as an HTML tag (trainer.validation_data_dir's <step>.jsonl)
    assert "&lt;step&gt;.jsonl" in (site / "reference" / "configuration.html").read_text()


def test_make_docs_names_a_real_target():
    makefile = (ROOT / "Makefile").read_text()
    assert "\ndocs: setup\n" in makefile and "\ndocs-serve: docs\n" in makefile


def test_the_committed_references_are_current():
    """The reference pages are committed, so that they read on the repository without a build; regenerated from the
    declarations they must come out the same, else this fails naming the command that refreshes them."""
    from references import PAGES  # docs/_ext

    stale = [name for name, page in PAGES.items() if (ROOT / "docs" / "reference" / name).read_text() != page()]
    assert not stale, f"docs/reference/{stale} are stale: run `python docs/_ext/references.py` and commit them"
