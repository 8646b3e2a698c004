"""The wheel, installed non-editable into a fresh venv, runs both entry points from a directory outside the
repository: ``configs/`` ships inside it as package data.

The fresh venv gets the project's dependencies (torch, verl, transformers, ...) from this venv's site-packages
through a ``.pth`` line, so nothing is downloaded; the project itself comes only from the wheel (a ``.pth`` line
adds a directory to ``sys.path`` without running the editable install's finder, and the repository is not on the
path of a process started elsewhere)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import run_process

REPO = Path(__file__).resolve().parents[2]
SKIP = shutil.ignore_patterns(
    ".venv",
    ".git",
    "runs",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "wandb",
    ".pytest_cache",
    ".hypothesis",
    "outputs",
    "bench",
    "docs",
)


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


@pytest.mark.slow
def test_wheel_installed_in_a_fresh_venv_runs_from_any_directory(tmp_path, embedded_cache):
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=SKIP)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    wheel = next((tmp_path / "dist").glob("dapo_verl-*.whl"))

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    (_site_packages(python) / "main_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DAPO_CONFIG_DIR", "PYTHONPATH")}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true")
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import recipe.cli, recipe.config as c; print(recipe.cli.__file__); print(c.config_dir())",
        ],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    module_file, configs = where.stdout.split()
    assert module_file.startswith(str(venv)) and configs.startswith(str(venv)), where.stdout  # the wheel's copy

    overrides = [
        f"cache_dir={embedded_cache}",
        "tiny.task.digits=1",
        "tiny.task.val_size=16",
        "tiny.warmup.steps=100",
        "tiny.warmup.batch_size=32",
        "embedded.progress_bar=false",
        "data.train_batch_size=4",
        "data.gen_batch_size=6",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.val_kwargs.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.logger=[console]",
        "trainer.default_local_dir=run",
    ]
    result = run_process([str(venv / "bin" / "dapo-train"), *overrides], cwd=elsewhere, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (elsewhere / "run" / "global_step_1" / "actor" / "model.safetensors").is_file()

    # the verl engine's entry point composes its config from the installed copy (--cfg job: print it, run nothing)
    result = run_process(
        [str(python), "-m", "recipe.dapo.main_dapo", "--cfg", "job"], cwd=elsewhere, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "clip_ratio_high: 0.28" in result.stdout and "trainer_mode: dapo" in result.stdout
