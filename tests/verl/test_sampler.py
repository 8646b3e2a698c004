"""The DAPO sampler's pure parts: reading ``[B, G]`` accuracies off verl's trajectory keys, and its settings.
(Its rounds against verl's TransferQueue are in tests/verl/test_ray.py.)"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")
from recipe.dapo.sampler import DynamicSamplingSettings, group_metric_matrix  # noqa: E402


def test_matrix_rows_follow_uids_columns_follow_sessions():
    # keys {uid}_{session}_{index}, in the arbitrary order the TransferQueue lists them
    keys = ["b_1_0", "a_0_0", "b_0_0", "a_1_0"]
    values = [0.0, 1.0, 1.0, 0.0]
    acc, positions = group_metric_matrix(keys, values, ["a", "b"])
    assert acc.tolist() == [[1.0, 0.0], [1.0, 0.0]]  # a: sessions 0, 1 -> 1, 0; b: sessions 0, 1 -> 1, 0
    assert positions == {"a": [1, 3], "b": [2, 0]}


def test_a_multi_output_session_is_read_at_its_last_output():
    # session 0 of "a" has outputs 0, 1, 2 (a multi-turn agent loop); output 2 stands for the session
    keys = ["a_0_0", "a_0_2", "a_0_1", "a_1_0"]
    values = [0, 1, 0, 0]
    acc, _ = group_metric_matrix(keys, values, ["a"])
    assert acc.tolist() == [[1.0, 0.0]]


def test_uneven_groups_are_refused():
    with pytest.raises(RuntimeError, match="actor_rollout_ref.rollout.n"):
        group_metric_matrix(["a_0_0", "a_1_0", "b_0_0"], [1, 0, 1], ["a", "b"])


def test_bool_values_and_other_groups_ignored():
    acc, _ = group_metric_matrix(["a_0_0", "a_1_0", "z_0_0"], [True, False, True], ["a"])
    assert acc.dtype == torch.float32 and acc.tolist() == [[1.0, 0.0]]


def kwargs(**changes):
    base = {
        "filter_groups": {"enable": True, "metric": "acc", "max_num_gen_batches": 10},
        "train_batch_size": 512,
        "gen_batch_size": 1536,
        "sampling": {"adaptive": True, "safety_margin": 0.2},
    }
    for key, value in changes.items():
        if key in ("enable", "metric", "max_num_gen_batches"):
            base["filter_groups"][key] = value
        elif key in ("skip_saturated", "carry_over"):
            base["sampling"][key] = value
        else:
            base[key] = value
    return base


def test_settings_build_the_filler():
    settings = DynamicSamplingSettings.from_kwargs(kwargs())
    filler = settings.make_filler()
    assert (filler.train_batch_size, filler.gen_batch_size, filler.max_num_gen_batches) == (512, 1536, 10)
    assert filler.adaptive and filler.safety_margin == 0.2
    assert DynamicSamplingSettings.from_kwargs(kwargs(gen_batch_size=None)).sampling.gen_batch_size == 512


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"metric": "reward"}, "metric=acc"),  # verl's default: the length-shaped reward
        ({"metric": "seq_reward"}, "metric=acc"),
        ({"gen_batch_size": 256}, "gen_batch_size >= 512"),
        ({"skip_saturated": True}, "skip_saturated=false"),
    ],
)
def test_settings_refuse_with_the_fix(changes, match):
    with pytest.raises(ValueError, match=match):
        DynamicSamplingSettings.from_kwargs(kwargs(**changes))


def test_settings_need_their_inputs():
    with pytest.raises(ValueError, match=r"sampler_kwargs lacks \['filter_groups'\]"):
        DynamicSamplingSettings.from_kwargs({"train_batch_size": 4})


def test_disabled_filter_accepts_anything():
    settings = DynamicSamplingSettings.from_kwargs(kwargs(enable=False, metric="reward", gen_batch_size=1))
    assert not settings.filter.enable
