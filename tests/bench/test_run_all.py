"""`make bench` runs every bench: the registry in bench.run_all names each measuring module under bench/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from bench.run_all import BENCHES, main

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
# modules that are not benches of their own: plumbing, peers run by a bench, readers of finished runs
NOT_BENCHES = {"__init__", "common", "run_all", "trl_peer", "vllm_peer", "paired_eval", "real_model"}


def test_every_bench_module_is_registered():
    packages = {p.parent.name for p in BENCH_DIR.glob("*/__main__.py")}  # a bench in several modules (ablation)
    modules = ({p.stem for p in BENCH_DIR.glob("*.py")} | packages) - NOT_BENCHES
    registered = {b.module.removeprefix("bench.") for b in BENCHES.values()}
    assert modules - registered == set(), "add these to bench.run_all.BENCHES (or to NOT_BENCHES with a reason)"
    assert registered <= modules | {"bench_trl"}
    for bench in BENCHES.values():
        assert importlib.util.find_spec(bench.module) is not None
        name = bench.module.removeprefix("bench.")
        files = [BENCH_DIR / f"{name}.py"] if name not in packages else sorted((BENCH_DIR / name).glob("*.py"))
        source = "".join(f.read_text() for f in files)
        assert '"--json"' in source or "write_json(" in source, f"{bench.module} takes no --json: run_all passes it"


def test_list_prints_every_bench(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name, bench in BENCHES.items():
        assert name in out and bench.module in out
