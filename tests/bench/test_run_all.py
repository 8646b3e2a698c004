"""`make bench` runs every bench: the registry in bench.run_all names each measuring module under bench/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bench.run_all import BENCHES, main

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
KINDS = ("micro", "sim", "compare", "experiments")  # bench/'s subpackages, one per kind (bench/__init__.py)
# modules that are not benches of their own: peers run by a bench, readers of finished runs
NOT_BENCHES = {"compare.trl_peer", "micro.vllm_peer", "experiments.paired_eval", "experiments.real_model"}


def _modules() -> set[str]:
    """Every module under the kinds' folders as ``kind.name``; a bench in several modules (a package with a
    ``__main__``, the ablation) counts once."""
    out = set()
    for kind in KINDS:
        out |= {f"{kind}.{p.stem}" for p in (BENCH_DIR / kind).glob("*.py") if p.stem != "__init__"}
        out |= {f"{kind}.{p.parent.name}" for p in (BENCH_DIR / kind).glob("*/__main__.py")}
    return out


def test_bench_is_organised_by_kind():
    """bench/ holds the library and the registry at its top, every bench in the folder of its kind."""
    assert {p.name for p in BENCH_DIR.glob("*.py")} == {"__init__.py", "common.py", "run_all.py"}
    folders = {p.name for p in BENCH_DIR.iterdir() if p.is_dir() and p.name not in ("__pycache__", "results")}
    assert folders == set(KINDS)
    for kind in KINDS:
        assert (BENCH_DIR / kind / "__init__.py").read_text().strip(), f"bench/{kind}/__init__.py says what it holds"


def test_every_bench_module_is_registered():
    modules = _modules() - NOT_BENCHES
    registered = {b.module.removeprefix("bench.") for b in BENCHES.values()}
    assert modules - registered == set(), "add these to bench.run_all.BENCHES (or to NOT_BENCHES with a reason)"
    assert registered <= modules
    for bench in BENCHES.values():
        assert importlib.util.find_spec(bench.module) is not None
        folder = BENCH_DIR / bench.module.removeprefix("bench.").replace(".", "/")
        files = sorted(folder.glob("*.py")) if folder.is_dir() else [folder.with_suffix(".py")]
        source = "".join(f.read_text() for f in files)
        assert '"--json"' in source or "write_json(" in source, f"{bench.module} takes no --json: run_all passes it"


def test_list_prints_every_bench(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name, bench in BENCHES.items():
        assert name in out and bench.module in out


def test_every_registered_bench_has_its_command_in_the_docs():
    """The registry and the docs name the same benches: each one's ``python -m`` command is on a docs page (its
    figures), and the benchmarks page says where the list is."""
    docs_dir = BENCH_DIR.parent / "docs"
    docs = "".join(p.read_text() for p in docs_dir.glob("*.md"))
    missing = sorted({b.module for b in BENCHES.values() if f"python -m {b.module}" not in docs})
    assert missing == [], f"benches registered in bench.run_all with no page in docs/: {missing}"
    assert "python -m bench.run_all --list" in (docs_dir / "benchmarks.md").read_text()
