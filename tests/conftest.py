"""Shared fixtures: a tiny embedded run (1-digit addition, a few warm-up steps) and the AIME 2024 parquet."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
AIME_PARQUET = TESTS_DIR.parents[1] / "shared" / "data" / "aime-2024.parquet"


@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory) -> Path:
    """One cache (task files, warmed-up model) for every embedded test of the session."""
    return tmp_path_factory.mktemp("dapo-cache")


@pytest.fixture
def tiny_run(embedded_cache, tmp_path, monkeypatch):
    """``dapo-train`` overrides for a run of seconds: 1-digit addition (81 problems; 100 warm-up steps reach about
    20% accuracy, so groups are mixed), 4 prompts x 4 responses per step, 2 mini-batches of 2 prompts, no W&B."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")

    def overrides(run_dir: Path | None = None, extra: dict | None = None) -> list[str]:
        values = {
            "embedded.cache_dir": str(embedded_cache),
            "embedded.task.digits": 1,
            "embedded.task.val_size": 16,
            "embedded.warmup.steps": 100,
            "embedded.warmup.batch_size": 32,
            "embedded.num_threads": 1,
            "embedded.progress_bar": False,
            "data.train_batch_size": 4,
            "data.gen_batch_size": 6,
            "actor_rollout_ref.rollout.n": 4,
            "actor_rollout_ref.rollout.val_kwargs.n": 2,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.actor.optim.lr": 1e-4,
            "actor_rollout_ref.actor.optim.lr_warmup_steps": 0,
            "trainer.total_training_steps": 2,
            "trainer.test_freq": 2,
            "trainer.save_freq": 2,
            "trainer.logger": "[console]",
            "trainer.default_local_dir": str(run_dir or tmp_path / "run"),
        }
        values.update(extra or {})
        return [f"{key}={value}" for key, value in values.items()]

    return overrides


@pytest.fixture
def tiny_start_weights(tiny_run):
    """The warmed-up model a ``tiny_run`` starts from, found in the cache by its settings (as the engine finds it),
    whatever other warm-ups the session's cache holds."""
    from safetensors.torch import load_file

    from recipe.cli import compose
    from recipe.embedded.config import read_config
    from recipe.embedded.warmup import warm_model

    c = read_config(compose(tiny_run()))
    return load_file(warm_model(c.cache_dir, c.task, c.tiny_model, c.warmup, device="cpu") / "model.safetensors")


@pytest.fixture
def aime_parquet() -> Path:
    if not AIME_PARQUET.is_file():
        pytest.skip(f"{AIME_PARQUET} not present (the shared data folder sits beside the repository)")
    return AIME_PARQUET
