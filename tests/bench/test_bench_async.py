"""``bench.compare.async_modes``'s figures from verl's per-step metrics, by hand; and its refusal of an unknown mode."""

from __future__ import annotations

import pytest

from bench.compare.async_modes import MODES, figures, main, mode_overrides

VAL = "val-core/synthetic_addition/acc/mean@2"


def records(**extra) -> dict[int, dict]:
    """Two training steps of 16 responses each, validation before and after."""
    step = {
        "timing_s/gen": 1.0,
        "dapo/generated_prompts": 6,
        "dapo/filtered_all_correct": 2,
        "dapo/filtered_all_wrong": 1,
        "training/off_policy/trajectory_staleness_worst/max": 1,
    }
    return {
        0: {VAL: 0.25},
        1: {**step, "timing_s/step": 4.0, "response_length/mean": 5.0, "timing_s/update_weights": 0.5, **extra},
        2: {**step, "timing_s/step": 6.0, "response_length/mean": 7.0, "timing_s/update_weights": 0.5, VAL: 0.5},
    }


def test_figures_by_hand():
    out = figures(records(), "colocate_async", steps=2, responses_per_step=16)
    assert out["trained_resp_per_s"] == pytest.approx(32 / 10)  # 2 x 16 responses in 4 + 6 s
    assert out["trained_tok_per_s"] == pytest.approx((5 + 7) * 16 / 10)
    assert out["trainer_wait_frac"] == pytest.approx(2 / 10)
    # colocated: the rollout is paused for everything but the sampling wait
    assert out["rollout_wait_frac"] == pytest.approx(8 / 10)
    assert out["staleness_max"] == 1 and out["kept_group_frac"] == 0.5
    assert (out["val_acc_before"], out["val_acc"]) == (0.25, 0.5)


def test_separate_rollout_waits_only_for_the_weight_update():
    out = figures(records(), "separate_async", steps=2, responses_per_step=16)
    assert out["rollout_wait_frac"] == pytest.approx(1 / 10)


def test_kept_fraction_is_pooled_over_steps_that_classified_groups():
    """An asynchronous step served by groups that finished before it classifies none (its fraction is NaN)."""
    data = records()
    data[2].update({"dapo/generated_prompts": 0, "dapo/filtered_all_correct": 0, "dapo/filtered_all_wrong": 0})
    data[2]["dapo/kept_group_frac"] = float("nan")
    assert figures(data, "separate_async", steps=2, responses_per_step=16)["kept_group_frac"] == pytest.approx(3 / 6)


def test_sync_has_no_staleness_metric():
    data = records()
    for step in (1, 2):
        del data[step]["training/off_policy/trajectory_staleness_worst/max"]
    assert figures(data, "sync", steps=2, responses_per_step=16)["staleness_max"] == 0


def test_each_mode_is_the_dapo_trainer_with_carry_over():
    assert [mode_overrides(m)[0] for m in MODES] == [
        "trainer.v1.trainer_mode=dapo",
        "trainer.v1.trainer_mode=dapo_colocate_async",
        "trainer.v1.trainer_mode=dapo_separate_async",
    ]
    assert all("dapo.sampling.carry_over=true" in mode_overrides(m) for m in MODES)


def test_an_unknown_mode_is_refused_naming_the_choices():
    with pytest.raises(SystemExit, match="unknown \\['fully_async'\\]; choose from sync, colocate_async"):
        main(["--modes", "sync,fully_async"])
