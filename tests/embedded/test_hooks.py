"""The embedded engine's public surface: a per-step callback (what the TRL bench uses), and a warning for the verl
keys it does not act on instead of ignoring them silently."""

from __future__ import annotations

import logging

from recipe.config import compose
from recipe.embedded import trainer
from recipe.embedded.config import IGNORED_VERL_KEYS, ignored_verl_keys
from recipe.embedded.monitor import read_metrics


class Recorder(trainer.Callback):
    def __init__(self):
        self.events = []

    def on_step_begin(self, step):
        self.events.append(("begin", step))

    def on_step_end(self, step, metrics):
        self.events.append(("end", step, metrics["actor/pg_loss"]))


def test_callbacks_see_every_step_with_its_metrics(tiny_run, tmp_path):
    recorder = Recorder()
    run_dir = trainer.run(compose(tiny_run(tmp_path / "run")), callbacks=[recorder])
    logged = read_metrics(run_dir)
    losses = [r["actor/pg_loss"] for r in logged if "actor/pg_loss" in r]
    # two steps (tiny_run), each begun then ended, with the loss that metrics.jsonl records
    assert recorder.events == [("begin", 1), ("end", 1, losses[0]), ("begin", 2), ("end", 2, losses[1])]


def test_default_config_sets_no_ignored_key():
    assert ignored_verl_keys(compose([])) == []


def test_ignored_verl_keys_are_named_with_the_reason(tiny_run, tmp_path, caplog):
    overrides = ["actor_rollout_ref.actor.use_dynamic_bsz=true", "data.dataloader_num_workers=2"]
    assert ignored_verl_keys(compose(overrides)) == [
        f"actor_rollout_ref.actor.use_dynamic_bsz=True (verl's default False; "
        f"{IGNORED_VERL_KEYS['actor_rollout_ref.actor.use_dynamic_bsz']})",
        f"data.dataloader_num_workers=2 (verl's default 8; {IGNORED_VERL_KEYS['data.dataloader_num_workers']})",
    ]
    with caplog.at_level(logging.WARNING, logger="recipe.embedded.trainer"):
        trainer.run(compose([*tiny_run(tmp_path / "run"), "trainer.total_training_steps=1", *overrides]))
    warned = [r.getMessage() for r in caplog.records if "ignores" in r.getMessage()]
    assert len(warned) == 2 and "use_dynamic_bsz=True" in warned[0] and "dataloader_num_workers=2" in warned[1]
