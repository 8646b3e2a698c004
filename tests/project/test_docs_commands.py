"""Every command the README and the docs show runs as written, or as its dry run where it needs a cluster or hours.

Commands are read from the pages' shell blocks (```bash) and from inline code that starts like a command
(`dapo-train ...`, `make ...`, `python -m ...`, `bash scripts/...`). Each is checked by what it is:

* ``dapo-train ARGS`` / ``python -m recipe.cli ARGS``: ``dapo-train --cfg job ARGS`` composes the config (a misspelt
  key, a key that needs ``+``, a missing config fail here);
* ``python -m recipe.dapo.main_dapo ARGS``: composed as ``configs/dapo_trainer.yaml`` with ARGS;
* ``make TARGET [ARGS="..."]``: ``make -n TARGET`` (the target exists and its recipe expands) and ARGS composed with
  the target's config;
* ``bash scripts/X.sh`` and ``sbatch scripts/slurm_dapo.sbatch``: run with ``DRY_RUN=1`` (they print what they would
  run; nothing is contacted);
* ``python -m bench.X ...``, ``python scripts/X.py ...``, ``python -m verl.model_merger ...``: every ``--flag`` the
  command uses is one its ``--help`` lists;
* ``ray``, ``wandb``, ``srun``, ``pip``, ``git``: programs of the cluster or the user's machine, listed in
  :data:`EXTERNAL`, not run.

Placeholders are filled before running: ``<...>`` and ``...`` arguments, ``$VAR`` from a small environment.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
EXTERNAL = {"ray", "wandb", "srun", "pip", "git", "cd", "source", "curl", "tensorboard", "nvidia-smi"}
ENV = {"HOME": "/home/user", "CKPT_DIR": "/shared/ckpts/run", "DATA_DIR": "/shared/data/dapo"}
# make targets -> the config their ARGS are composed with
MAKE_CONFIGS = {
    "train": ("embedded", []),
    "train-smollm2": ("embedded_smollm2", []),
    "verl-cpu": ("dapo_trainer", ["+experiment=cpu_tiny"]),
    "verl-cpu-smollm2": ("dapo_trainer", ["+experiment=cpu_smollm2"]),
    "test": (None, []),
    "bench": (None, []),
}
INLINE = re.compile(r"`((?:dapo-train(?=[ `])|make(?=[ `])|python -m |bash scripts/|DRY_RUN=1 bash)[^`]*)`")


def _commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    found.append((page.name, re.sub(r"\s+#\s.*$", "", line)))
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for match in INLINE.finditer(prose):
            found.append((page.name, match.group(1)))
    return found


def _words(line: str) -> tuple[dict, list[str]]:
    """The environment assignments and the command's words, placeholders filled."""
    for name, value in ENV.items():
        line = line.replace(f"${name}", value).replace(f"${{{name}}}", value)
    words = shlex.split(line)
    env = {}
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    words = [w for w in words if w not in ("...", "[...]", "[key=value ...]")]
    words = [re.sub(r"<[^>]*>", "x", w) for w in words]
    return env, words


def _compose_error(config_name: str, overrides: list[str]) -> str | None:
    from recipe.config import compose, compose_error

    try:
        compose(overrides, config_name)
    except Exception as err:  # noqa: BLE001 - any failure to compose is the finding
        return compose_error(err)
    return None


def _flags_in_help(argv: list[str], used: list[str]) -> str | None:
    result = subprocess.run(
        [*argv, "--help"], cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, **ENV}
    )
    if result.returncode != 0:
        return f"--help failed: {result.stderr[-500:]}"
    unknown = [f for f in used if f.split("=")[0] not in result.stdout]
    return f"flags not in --help: {unknown}" if unknown else None


def line_of(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


def check(words: list[str], env: dict) -> str | None:
    """None when the command (or its dry run) runs; else what failed."""
    program = words[0]
    if program in EXTERNAL:
        return None
    if program == "dapo-train" or words[:3] == ["python", "-m", "recipe.cli"]:
        args = words[1:] if program == "dapo-train" else words[3:]
        from recipe.cli import main

        if not {"--cfg", "--print-config", "--help", "-h"} & set(args):
            args = ["--cfg", "job", *args]  # composed, not run
        return None if main(args) == 0 else f"dapo-train {line_of(args)} failed"
    if words[:3] == ["python", "-m", "recipe.dapo.main_dapo"]:
        return _compose_error("dapo_trainer", words[3:])
    if program == "make":
        target = next((w for w in words[1:] if "=" not in w and not w.startswith("-")), "")
        args = next((w.split("=", 1)[1] for w in words[1:] if w.startswith("ARGS=")), "")
        dry = subprocess.run(["make", "-n", *([target] if target else [])], cwd=REPO, capture_output=True, text=True)
        if dry.returncode != 0:
            return f"make -n {target}: {dry.stderr[-300:]}"
        config, base = MAKE_CONFIGS.get(target, (None, []))
        if target not in MAKE_CONFIGS and args:
            return f"make {target} takes ARGS, but the test does not know its config: add it to MAKE_CONFIGS"
        return _compose_error(config, [*base, *shlex.split(args)]) if config and args else None
    if program in ("bash", "sbatch"):
        script = next(w for w in words[1:] if w.startswith("scripts/"))
        run_env = {**os.environ, **ENV, **env, "DRY_RUN": "1", "SLURM_JOB_NODELIST": "gpu[001-002]"}
        run_env.update(HEAD_WAIT_S="0", WORKERS_WAIT_S="0")
        result = subprocess.run(
            ["bash", script, *words[words.index(script) + 1 :]],
            cwd=REPO,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return None if result.returncode == 0 else f"DRY_RUN=1 {script}: {result.stderr[-500:]}"
    if program in ("python", "python3", ".venv/bin/python"):
        if words[1] == "-c":  # a one-liner: run it
            result = subprocess.run([sys.executable, *words[1:]], cwd=REPO, capture_output=True, text=True, timeout=300)
            return None if result.returncode == 0 else f"{line_of(words)}: {result.stderr[-300:]}"
        if words[1:3] == ["-m", "pytest"]:
            return None  # the suite itself
        if words[1] == "-m":
            argv, rest = [sys.executable, "-m", words[2]], words[3:]
            if words[2] == "verl.model_merger" and rest:  # its subcommand's flags
                argv, rest = [*argv, rest[0]], rest[1:]
        else:
            argv, rest = [sys.executable, words[1]], words[2:]
        return _flags_in_help(argv, [w for w in rest if w.startswith("--")])
    return f"no check for the program {program!r}: run it, dry-run it, or list it in EXTERNAL"


COMMANDS = _commands()


@pytest.mark.slow
def test_every_documented_command_runs_as_written():
    failures = []
    for page, line in COMMANDS:
        env, words = _words(line)
        if not words:
            continue
        try:
            problem = check(words, env)
        except Exception as err:  # noqa: BLE001
            problem = f"{type(err).__name__}: {err}"
        if problem:
            failures.append(f"{page}: {line}\n    -> {problem}")
    assert not failures, "\n".join(failures)


def test_the_docs_show_commands_to_check():
    """The reader above finds the commands (a change of the pages' format would silently check nothing)."""
    programs = {_words(line)[1][0] for _, line in COMMANDS if _words(line)[1]}
    assert {"dapo-train", "make", "bash", "python"} <= programs
    assert len(COMMANDS) > 40
