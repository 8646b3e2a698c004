"""A short run of the real entry point (``recipe.cli.main``, what ``dapo-train`` calls) on a tiny model."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from safetensors.torch import load_file

from dapo.metrics import METRIC_DOCS
from recipe import cli
from recipe.embedded.checkpoint import find_latest
from recipe.embedded.monitor import PLOTS, read_metrics


def _documented(name: str) -> bool:
    """``name`` is a key of METRIC_DOCS, or matches one of its ``{data_source}`` / ``{k}`` templates."""
    for doc in METRIC_DOCS:
        pattern = re.escape(doc).replace(r"\{data_source\}", "[^/]+").replace(r"\{k\}", r"\d+")
        if re.fullmatch(pattern, name):
            return True
    return False


def _without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith("timing_s/")}


@pytest.mark.slow
def test_short_run_trains_every_parameter_and_logs_documented_metrics(tiny_run, tiny_start_weights, tmp_path):
    run_dir = tmp_path / "run"
    extra = {
        "trainer.logger": "[console,wandb]",
        "actor_rollout_ref.actor.optim.weight_decay": 0.0,
        "trainer.validation_data_dir": str(tmp_path / "val"),
    }
    assert cli.main(tiny_run(run_dir, extra)) == 0

    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2]  # validation before training, then one record per step
    steps = records[1:]
    for record in steps:
        assert math.isfinite(record["actor/pg_loss"]) and math.isfinite(record["actor/grad_norm"])
    assert "val-core/synthetic_addition/acc/mean@2" in records[0]
    assert "val-core/synthetic_addition/acc/mean@2" in records[-1]

    # each validation's responses, as verl writes them: n consecutive lines a prompt, the logged accuracy their mean
    for record in (records[0], records[-1]):
        lines = [json.loads(line) for line in (tmp_path / "val" / f"{record['step']}.jsonl").read_text().splitlines()]
        assert {tuple(sorted(line)) for line in lines} == {("acc", "gts", "input", "output", "score", "step")}
        assert {line["step"] for line in lines} == {record["step"]}
        assert all(lines[i]["input"] == lines[i + 1]["input"] for i in range(0, len(lines), 2))
        assert len({line["input"] for line in lines}) == len(lines) // 2
        assert sum(line["acc"] for line in lines) / len(lines) == pytest.approx(
            record["val-core/synthetic_addition/acc/mean@2"], rel=0, abs=1e-9
        )

    logged = {key for record in records for key in record if key != "step"}
    undocumented = sorted(name for name in logged if not _documented(name))
    assert not undocumented, f"metrics missing from dapo.metrics.METRIC_DOCS: {undocumented}"
    for name in (
        "actor/entropy",
        "actor/pg_clipfrac",
        "actor/pg_clipfrac_lower",
        "actor/ppo_kl",
        "actor/grad_norm",
        "response_length/mean",
        "response_length/max",
        "response_length/clip_ratio",
        "critic/score/mean",
        "train/num_gen_batches",
        "timing_s/gen",
        "dapo/kept_group_frac",
        "dapo/overlong_frac",
        "response/repeat_ngram_frac",
    ):
        assert name in logged, name

    # every trained parameter moved away from the warmed-up start (weight decay is off: only gradients move them)
    before = tiny_start_weights
    after = load_file(find_latest(run_dir) / "actor" / "model.safetensors")
    assert before.keys() == after.keys()
    unchanged = [name for name in before if torch.equal(before[name], after[name])]
    assert not unchanged, f"parameters not updated: {unchanged}"

    # W&B ran offline and its run file holds every metric name
    (wandb_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    content = wandb_file.read_bytes()
    missing = sorted(name for name in logged if name.encode() not in content)
    assert not missing, f"not in the W&B run file: {missing}"

    for name in PLOTS:
        assert (run_dir / "plots" / name).stat().st_size > 1000


@pytest.mark.slow
def test_a_second_run_reuses_the_warm_up_and_trains_identically(tiny_run, tmp_path, capsys):
    # a cache of its own, so that the first run really builds the warm-up
    extra = {"trainer.total_training_steps": 1, "cache_dir": str(tmp_path / "cache")}
    assert cli.main(tiny_run(tmp_path / "a", extra)) == 0
    assert "warm-up: done" in capsys.readouterr().out
    assert cli.main(tiny_run(tmp_path / "b", extra)) == 0
    assert "warm-up: reusing" in capsys.readouterr().out
    first, second = ([_without_timing(r) for r in read_metrics(tmp_path / name)] for name in ("a", "b"))
    assert first == second


@pytest.mark.slow
def test_without_group_filter_every_group_is_trained(tiny_run, tmp_path):
    extra = {"trainer.total_training_steps": 1, "algorithm.filter_groups.enable": False}
    assert cli.main(tiny_run(tmp_path / "run", extra)) == 0
    (record,) = [r for r in read_metrics(tmp_path / "run") if r["step"] == 1]
    assert record["train/num_gen_batches"] == 1.0
    assert "dapo/kept_group_frac" not in record  # no filter, no filter metrics
    assert json.loads((tmp_path / "run" / "latest_checkpointed_iteration.txt").read_text()) == 1


@pytest.mark.slow
def test_tensorboard_through_verls_tracking_and_an_unknown_logger_refused(tiny_run, tmp_path, monkeypatch, capsys):
    """``trainer.logger=[console,tensorboard]``: the step metrics as TensorBoard scalars in ``<run dir>/tensorboard``
    (verl's Tracking writes them); a logger neither the engine nor verl has is refused at start, naming the ones
    there are."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    run_dir = tmp_path / "run"
    extra = {"trainer.logger": "[console,tensorboard]", "trainer.total_training_steps": 1, "trainer.test_freq": -1}
    assert cli.main(tiny_run(run_dir, extra)) == 0
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/acc/mean", "actor/pg_loss", "dapo/kept_group_frac"} <= scalars
    assert [e.step for e in events.Scalars("actor/pg_loss")] == [1]
    capsys.readouterr()
    assert cli.main(tiny_run(tmp_path / "other", {"trainer.logger": "[console,neptune]"})) == 2
    err = capsys.readouterr().err
    assert "trainer.logger has 'neptune'; the embedded engine logs to console, wandb, file, tensorboard" in err
    assert not (tmp_path / "other").exists()


@pytest.mark.slow
def test_the_entropy_collapse_warning_follows_the_logged_entropy(tiny_run, tmp_path, capsys):
    """A run pushed to lose entropy (8 passes over each batch at a high learning rate, a symmetric clip, no filter)
    crosses a 0.7 x threshold within 5 steps and is warned, naming the knobs; the same model at the default settings
    stays above the default 0.3 x and is not. Each run's warnings are what its logged actor/entropy says they should
    be (the dapo/entropy/* metrics are logged too)."""
    from dapo.metrics import EntropyWatch

    def run(name, extra):
        run_dir = tmp_path / name
        assert cli.main(tiny_run(run_dir, extra)) == 0
        out = capsys.readouterr().out
        records = [r for r in read_metrics(run_dir) if "actor/entropy" in r]
        assert {
            "dapo/entropy/logp_adv_cov",
            "dapo/entropy/clipped_high",
            "dapo/entropy/clipped_low",
            "dapo/adv/constant_acc_share",
        } <= set(records[-1])
        shares = [r["dapo/adv/constant_acc_share"] for r in records]
        if extra.get("algorithm.filter_groups.enable", True):  # dynamic sampling on accuracy keeps no constant group
            assert all(share == 0.0 for share in shares), shares
        else:
            assert all(share is None or 0.0 <= share <= 1.0 for share in shares), shares
        return out, records

    common = {"trainer.total_training_steps": 15, "trainer.test_freq": -1, "trainer.val_before_train": False}
    forced = {
        **common,
        "actor_rollout_ref.actor.optim.lr": 1e-3,
        "actor_rollout_ref.actor.ppo_epochs": 8,
        "actor_rollout_ref.actor.clip_ratio_high": 0.2,
        "algorithm.filter_groups.enable": False,
        "dapo.entropy_watch.fraction": 0.7,
        "dapo.entropy_watch.window": 5,
    }
    for extra, fraction, window, must_warn in ((forced, 0.7, 5, True), (common, 0.3, 20, False)):
        out, records = run("forced" if must_warn else "default", extra)
        watch = EntropyWatch(fraction, window)
        expected = [r["step"] for r in records if watch.update(r["step"], r["actor/entropy"], lr=1, clip_ratio_high=1)]
        warned = [int(s) for s in re.findall(r"to [\d.e-]+ at step (\d+) \(below", out)]
        assert warned == expected, (warned, expected)
        assert bool(warned) == must_warn
        if must_warn:
            assert "raise actor_rollout_ref.actor.clip_ratio_high, now 0.2" in out and "optim.lr, now 0.001" in out
