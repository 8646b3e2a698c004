"""The layers of ``ARCHITECTURE.md``, checked on the code: arrows point down only.

``dapo/`` imports nothing of the project; ``recipe.config`` and ``recipe.common`` (the layer below both engines)
import neither engine nor the CLI; neither engine imports the other or the CLI; no module of ``recipe`` takes part in
an import cycle. Every import counts, a lazy one inside a function included: it runs when that function does.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("dapo", "recipe", "bench")


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The project modules ``path`` imports (``from a.b import c`` counts ``a.b`` and ``a.b.c`` when it is one)."""
    out = set()
    package = _module(path).rsplit(".", 1)[0] if path.name != "__init__.py" else _module(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in out if name.split(".")[0] in PACKAGES}


def _graph() -> dict[str, set[str]]:
    modules = {_module(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


def test_the_algorithm_imports_nothing_of_the_project():
    graph = _graph()
    bad = {m: sorted(d for d in deps if not d.startswith("dapo")) for m, deps in graph.items() if m.startswith("dapo")}
    assert not {m: d for m, d in bad.items() if d}


def test_the_layer_below_the_engines_imports_neither_engine_nor_the_cli():
    graph = _graph()
    below = [m for m in graph if m == "recipe.config" or m.startswith("recipe.common")]
    bad = {
        m: sorted(d for d in graph[m] if d.startswith(("recipe.embedded", "recipe.dapo", "recipe.cli"))) for m in below
    }
    assert not {m: d for m, d in bad.items() if d}


def test_neither_engine_imports_the_other_or_the_cli():
    graph = _graph()
    for engine, other in (("recipe.embedded", "recipe.dapo"), ("recipe.dapo", "recipe.embedded")):
        bad = {
            m: sorted(d for d in deps if d.startswith((other, "recipe.cli")))
            for m, deps in graph.items()
            if m.startswith(engine)
        }
        assert not {m: d for m, d in bad.items() if d}, engine
    text = "\n".join(p.read_text() for p in (REPO / "recipe" / "dapo").rglob("*.py"))
    assert "recipe.embedded" not in text and "recipe.cli" not in text  # not even named (the grep)


def test_no_import_cycle_in_the_project():
    graph = _graph()
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    # a package's __init__ re-exporting its modules is not a cycle of behaviour: only cycles between modules count
    cycles = [c for c in cycles if not all(m == c[0] or m.startswith(c[0] + ".") for m in c)]
    assert not cycles


def test_the_verl_engine_loads_without_the_embedded_engine_or_the_cli():
    code = (
        "import sys, recipe.dapo.main_dapo\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('recipe.embedded', 'recipe.cli')))\n"
        "print(loaded)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_the_tiny_model_is_one_config_both_engines_compose_and_the_cache_root_one_key(monkeypatch, tmp_path):
    # the tiny model and its task are configs/tiny.yaml, composed alike by the embedded default and the verl CPU
    # run (whose prepare step reads no embedded.* key); the cache root is written once, in configs/dapo_trainer.yaml
    from omegaconf import OmegaConf

    from recipe.common.cache import cache_root
    from recipe.config import compose

    def plain(overrides, name):
        return OmegaConf.to_container(compose(overrides, name), resolve=True)

    verl_cpu = plain(["+experiment=cpu_tiny"], "dapo_trainer")
    assert plain([], "embedded")["tiny"] == verl_cpu["tiny"] == OmegaConf.load(REPO / "configs/tiny.yaml")["tiny"]
    assert "embedded" not in verl_cpu
    assert "embedded." not in (REPO / "recipe/dapo/cpu/prepare.py").read_text()
    for env in (None, str(tmp_path / "cache")):
        if env is None:
            monkeypatch.delenv("DAPO_CACHE_DIR", raising=False)
        else:
            monkeypatch.setenv("DAPO_CACHE_DIR", env)
        root = str(cache_root())
        assert root == (env or str(Path.home() / ".cache" / "dapo-verl"))
        assert plain([], "embedded")["cache_dir"] == root
        assert plain(["+experiment=cpu_tiny"], "dapo_trainer")["verl_cpu"]["assets"] == f"{root}/verl-cpu"
        assert plain([], "embedded_smollm2")["smollm2"]["assets"] == f"{root}/smollm2/run"
    written = subprocess.run(
        [
            "git",
            "grep",
            "-l",
            ".cache/dapo-verl",
            "--",
            "*.py",
            "*.yaml",
            "*.sh",
            "Makefile",
            f":!{Path(__file__).relative_to(REPO)}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert written == ["configs/dapo_trainer.yaml"]
