"""dapo.sampling: the group predicate and the BatchFiller, with the arithmetic worked by hand."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo.sampling import BatchFiller, GroupFilterStats, RoundStats, group_filter_stats, keep_groups

G = 4


def acc_rows(*num_correct: int, group_size: int = G) -> torch.Tensor:
    """[B, G] accuracies: row i has num_correct[i] ones, then zeros."""
    return torch.tensor([[1.0] * k + [0.0] * (group_size - k) for k in num_correct])


def payloads(tag: str, n: int) -> list[dict]:
    return [{"name": f"{tag}{i}", "x": torch.full((2,), float(i))} for i in range(n)]


def names(batch: list[dict]) -> list[str]:
    return [p["name"] for p in batch]


def run_round(filler: BatchFiller, tag: str, *num_correct: int) -> list[dict]:
    groups = payloads(tag, len(num_correct))
    filler.add_round(groups, acc_rows(*num_correct), [f"{tag}{i}" for i in range(len(num_correct))])
    return groups


# --------------------------------------------------------------------------- predicate


def test_keep_groups_hand_made_batch():
    # rows: 4/4 correct (constant), 0/4 (constant), 1/4 (mixed), 3/4 (mixed)
    acc = acc_rows(4, 0, 1, 3)
    assert keep_groups(acc).tolist() == [False, False, True, True]
    assert keep_groups(acc.bool()).tolist() == [False, False, True, True]
    # kept 2 (rows 2, 3), all-correct 1 (row 0), all-wrong 1 (row 1); 2 + 1 + 1 = B = 4
    assert group_filter_stats(acc) == GroupFilterStats(kept=2, all_correct=1, all_wrong=1)
    assert group_filter_stats(acc.bool()) == (2, 1, 1)


def test_score_metric_plus_minus_one():
    # verl's score: +1 correct, -1 wrong; a constant row of -1 is all-wrong (value not > 0)
    acc = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])
    assert group_filter_stats(acc) == (1, 1, 1)


def test_singleton_groups_are_always_dropped():
    # G = 1: every row is constant; two rows are correct, one wrong, none kept
    acc = torch.tensor([[1.0], [0.0], [1.0]])
    assert keep_groups(acc).tolist() == [False, False, False]
    assert group_filter_stats(acc) == (0, 2, 1)


def test_all_constant_and_all_mixed_batches():
    assert group_filter_stats(acc_rows(4, 4, 4)) == (0, 3, 0)
    assert group_filter_stats(acc_rows(0, 0)) == (0, 0, 2)
    assert group_filter_stats(acc_rows(1, 2, 3)) == (3, 0, 0)


def test_predicate_rejects_flat_input():
    with pytest.raises(ValueError, match=r"\[B, G\]"):
        keep_groups(torch.ones(8))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.booleans(), min_size=1, max_size=6), min_size=1, max_size=12).filter(
        lambda rows: len({len(r) for r in rows}) == 1
    )
)
def test_predicate_matches_set_definition(rows):
    # kept <=> the row holds more than one distinct value; the three counts partition the batch
    acc = torch.tensor(rows)
    expected = [len(set(r)) > 1 for r in rows]
    assert keep_groups(acc).tolist() == expected
    stats = group_filter_stats(acc)
    assert stats.kept == sum(expected)
    assert stats.kept + stats.all_correct + stats.all_wrong == len(rows)
    assert stats.all_correct == sum(1 for r in rows if all(r))


# --------------------------------------------------------------------------- verl's recipe (all options off)


def test_multi_round_accumulation_discards_surplus():
    filler = BatchFiller(train_batch_size=4, gen_batch_size=6)
    filler.begin_step(0)
    assert filler.next_round_size() == 6
    # round 1: correct counts 4,0,2,1,0,4 -> kept a2, a3 (2); all-correct a0, a5 (2); all-wrong a1, a4 (2)
    run_round(filler, "a", 4, 0, 2, 1, 0, 4)
    assert not filler.done
    assert filler.next_round_size() == 6  # not adaptive: always gen_batch_size
    # round 2: 1,4,3,0,2,0 -> kept b0, b2, b4 (3); all-correct b1; all-wrong b3, b5. Ready 2 + 3 = 5 >= 4.
    run_round(filler, "b", 1, 4, 3, 0, 2, 0)
    assert filler.done
    assert filler.next_round_size() == 0
    assert filler.rounds == [RoundStats(6, 2, 2, 2, 0), RoundStats(6, 1, 2, 3, 1)]

    batch, m = filler.end_step()
    assert names(batch) == ["a2", "a3", "b0", "b2"]  # generation order, truncated to 4; b4 is surplus
    assert filler.last_batch_versions == [0, 0, 0, 0]
    assert m["train/num_gen_batches"] == 2
    assert m["dapo/generated_prompts"] == 12
    assert m["dapo/generated_per_trained"] == 3.0  # 12 / 4
    assert m["dapo/kept_group_frac"] == pytest.approx(5 / 12)
    assert m["dapo/filtered_all_correct"] == 3  # 2 + 1
    assert m["dapo/filtered_all_wrong"] == 4  # 2 + 2
    assert m["dapo/surplus_groups"] == 1
    assert m["dapo/discarded_groups"] == 1
    assert m["dapo/carried_groups"] == 0

    # nothing carried without carry_over: the next step starts empty
    filler.begin_step(1)
    assert not filler.done and filler.num_carried == 0


# --------------------------------------------------------------------------- carry-over


def test_surplus_is_carried_first_and_tagged_with_its_version():
    filler = BatchFiller(train_batch_size=4, gen_batch_size=6, carry_over=True)
    filler.begin_step(0)
    run_round(filler, "a", 1, 2, 3, 1, 0, 4)  # kept a0..a3 (4): done, no surplus yet
    run_round(filler, "b", 2, 2, 4, 4, 4, 4)  # an extra round anyway: kept b0, b1 -> surplus 2
    batch, m = filler.end_step()
    assert names(batch) == ["a0", "a1", "a2", "a3"]
    assert m["dapo/surplus_groups"] == 2 and m["dapo/discarded_groups"] == 0
    assert filler.num_carried == 2

    filler.begin_step(1)  # age of b0, b1 = 1 - 0 = 1 <= max_carry_age=1: brought in
    run_round(filler, "c", 3, 3, 0, 0, 0, 0)  # kept c0, c1: 2 + 2 = 4
    batch, m = filler.end_step()
    assert names(batch) == ["b0", "b1", "c0", "c1"]  # carried first
    assert filler.last_batch_versions == [0, 0, 1, 1]
    assert m["dapo/carried_groups"] == 2
    assert m["dapo/generated_per_trained"] == 1.5  # 6 prompts generated this step / 4
    assert m["dapo/dropped_stale_groups"] == 0


def test_carried_groups_older_than_max_carry_age_are_dropped_and_counted():
    filler = BatchFiller(train_batch_size=2, gen_batch_size=4, carry_over=True, max_carry_age=1)
    filler.begin_step(0)
    run_round(filler, "a", 1, 2, 3, 1)  # 4 kept, batch 2, surplus a2, a3 generated under version 0
    filler.end_step()
    filler.begin_step(2)  # age 2 - 0 = 2 > 1: both dropped
    assert not filler.done
    run_round(filler, "b", 1, 1, 0, 0)
    batch, m = filler.end_step()
    assert names(batch) == ["b0", "b1"]
    assert m["dapo/dropped_stale_groups"] == 2
    assert m["dapo/carried_groups"] == 0
    assert filler.totals["dropped_stale"] == 2


def test_carried_groups_can_fill_a_step_with_zero_rounds():
    filler = BatchFiller(train_batch_size=2, gen_batch_size=6, carry_over=True, max_carry_age=1)
    filler.begin_step(5)
    run_round(filler, "a", 1, 1, 1, 1, 1, 0)  # 5 kept: batch a0, a1; surplus a2, a3, a4 (version 5)
    filler.end_step()
    filler.begin_step(6)
    assert filler.done  # 3 carried >= 2
    batch, m = filler.end_step()
    assert names(batch) == ["a2", "a3"]
    assert filler.last_batch_versions == [5, 5]
    assert m["train/num_gen_batches"] == 0
    assert m["dapo/generated_per_trained"] == 0.0
    assert math.isnan(m["dapo/kept_group_frac"])  # nothing generated this step
    assert m["dapo/carried_groups"] == 2 and m["dapo/surplus_groups"] == 1
    # a4 keeps its version 5: at version 7 its age is 2 > 1, so it is dropped
    filler.begin_step(7)
    assert not filler.done
    assert filler.rounds == []
    run_round(filler, "b", 2, 2)
    _, m = filler.end_step()
    assert m["dapo/dropped_stale_groups"] == 1


def test_carried_groups_are_ordered_oldest_first():
    filler = BatchFiller(train_batch_size=2, gen_batch_size=4, carry_over=True, max_carry_age=3)
    filler.begin_step(0)
    run_round(filler, "a", 1, 1, 1)  # batch a0, a1; carry a2 (v0)
    filler.end_step()
    filler.begin_step(1)  # a2 in, 1 missing
    run_round(filler, "b", 1, 1, 1)  # batch a2, b0; carry b1, b2 (v1)
    batch, _ = filler.end_step()
    assert names(batch) == ["a2", "b0"]
    filler.begin_step(2)
    batch, _ = filler.end_step()
    assert names(batch) == ["b1", "b2"] and filler.last_batch_versions == [1, 1]


# --------------------------------------------------------------------------- adaptive round size


def test_adaptive_round_sizes_by_hand():
    filler = BatchFiller(train_batch_size=8, gen_batch_size=24, adaptive=True, safety_margin=0.1)
    assert filler.min_gen_batch_size == 2  # ceil(8 / 4)
    filler.begin_step(0)
    # prior f = 8 / 24 = 1/3: ceil(8 / (1/3) * 1.1) = ceil(26.4) = 27, clamped to gen_batch_size 24
    assert filler.kept_frac_estimate == pytest.approx(1 / 3)
    assert filler.next_round_size() == 24
    run_round(filler, "a", *([2] * 12 + [0] * 12))  # 12 of 24 kept
    # K = 0.5*0 + 12 = 12, N = 0.5*0 + 24 = 24, f = 0.5
    assert filler.kept_frac_estimate == pytest.approx(0.5)
    filler.end_step()

    filler.begin_step(1)
    # needed 8: ceil(8 / 0.5 * 1.1) = ceil(17.6) = 18
    assert filler.next_round_size() == 18
    run_round(filler, "b", *([1] * 6 + [4] * 12))  # 6 of 18 kept
    # K = 0.5*12 + 6 = 12, N = 0.5*24 + 18 = 30, f = 0.4
    assert filler.kept_frac_estimate == pytest.approx(0.4)
    # needed 8 - 6 = 2: ceil(2 / 0.4 * 1.1) = ceil(5.5) = 6 (>= min 2)
    assert filler.next_round_size() == 6
    run_round(filler, "c", 1, 1, 1, 0, 0, 0)  # 3 kept: 6 + 3 = 9 >= 8, surplus 1
    # K = 0.5*12 + 3 = 9, N = 0.5*30 + 6 = 21, f = 9/21
    _, m = filler.end_step()
    assert m["dapo/kept_frac_estimate"] == pytest.approx(9 / 21)
    assert m["dapo/generated_per_trained"] == 3.0  # (18 + 6) / 8
    assert m["train/num_gen_batches"] == 2


def test_adaptive_floor_and_exact_products():
    filler = BatchFiller(train_batch_size=10, gen_batch_size=40, adaptive=True, min_gen_batch_size=5, safety_margin=0.1)
    filler.begin_step(0)
    run_round(filler, "a", *([1] * 9 + [0] * 9))  # 9 of 18 kept: f = 0.5, 1 missing
    # ceil(1 / 0.5 * 1.1) = ceil(2.2) = 3, raised to min_gen_batch_size 5
    assert filler.next_round_size() == 5
    run_round(filler, "b", 1, 1, 0, 0, 0, 0, 0, 0, 0, 0)  # 2 of 10 kept: done
    filler.end_step()
    # K = 0.5*9 + 2 = 6.5, N = 0.5*18 + 10 = 19
    assert filler.kept_frac_estimate == pytest.approx(6.5 / 19)

    exact = BatchFiller(train_batch_size=10, gen_batch_size=40, adaptive=True, min_gen_batch_size=1, safety_margin=0.1)
    exact.begin_step(0)
    run_round(exact, "a", 1, 1, 0, 0)  # f = 2/4 = 0.5, 8 missing
    # 8 / 0.5 * 1.1 = 17.6 -> 18; and for 10 missing 10 / 0.5 * 1.1 = 22.000000000000004 in floats -> 22, not 23
    assert exact.next_round_size() == 18
    exact2 = BatchFiller(train_batch_size=10, gen_batch_size=40, adaptive=True, safety_margin=0.1)
    exact2.begin_step(0)
    run_round(exact2, "a", 0, 0, 0, 0)  # f = 0 -> fall back to gen_batch_size
    assert exact2.next_round_size() == 40
    exact2._kept_num, exact2._kept_den = 1.0, 2.0  # f = 0.5 with 10 missing
    assert exact2.next_round_size() == 22


def test_adaptive_default_margin():
    filler = BatchFiller(train_batch_size=8, gen_batch_size=24, adaptive=True)
    assert filler.safety_margin == 0.25
    filler.begin_step(0)
    run_round(filler, "a", 1, 1, 0, 0)  # f = 2/4 = 0.5, 6 missing
    # ceil(6 / 0.5 * 1.25) = ceil(15.0) = 15
    assert filler.next_round_size() == 15


def test_not_adaptive_ignores_the_estimate():
    filler = BatchFiller(train_batch_size=4, gen_batch_size=12)
    filler.begin_step(0)
    run_round(filler, "a", 1, 1, 1, 0)  # f = 0.75 but round sizes stay 12
    assert filler.next_round_size() == 12


# --------------------------------------------------------------------------- saturation skip


def test_skip_saturated_then_reprobe():
    filler = BatchFiller(
        train_batch_size=1, gen_batch_size=3, skip_saturated=True, saturation_window=2, reprobe_after=2
    )
    filler.begin_step(0)
    assert filler.admit(["p", "q"]) == [True, True]  # no history
    filler.add_round([0, 1, 2], acc_rows(4, 0, 2), ["p", "q", "r"])  # p all-correct, q all-wrong, r mixed
    filler.end_step()
    filler.begin_step(1)
    assert filler.admit(["p", "q"]) == [True, True]  # streak 1 < window 2
    filler.add_round([0, 1, 2], acc_rows(4, 0, 3), ["p", "q", "r"])  # p: 2 all-correct, q: 2 all-wrong
    filler.end_step()
    assert filler.num_saturated_prompts == 2

    filler.begin_step(2)
    assert filler.admit(["p", "q", "r"]) == [False, False, True]  # skip 1 of 2
    assert filler.admit(["p", "q"]) == [False, False]  # skip 2 of 2
    assert filler.admit(["p", "q"]) == [True, True]  # re-probe
    # p's re-probe is all-correct again -> saturated, skip counter restarts; q's is mixed -> cleared
    filler.add_round([0, 1], acc_rows(4, 1), ["p", "q"])
    _, m = filler.end_step()
    assert m["dapo/skipped_prompts"] == 4
    assert m["dapo/saturated_prompts"] == 1

    filler.begin_step(3)
    assert filler.admit(["p", "q", "p", "p"]) == [False, True, False, True]
    assert filler.totals["skipped"] == 4


def test_streak_needs_the_same_kind_of_constant():
    filler = BatchFiller(train_batch_size=1, gen_batch_size=1, skip_saturated=True, saturation_window=2)
    filler.begin_step(0)
    filler.add_round([0], acc_rows(4), ["p"])  # all-correct
    filler.add_round([0], acc_rows(0), ["p"])  # all-wrong: a new streak of 1, not 2
    assert filler.admit(["p"]) == [True]
    filler.add_round([0], acc_rows(0), ["p"])  # all-wrong twice: saturated
    assert filler.admit(["p"]) == [False]


def test_skip_off_admits_everything():
    filler = BatchFiller(train_batch_size=1, gen_batch_size=1, saturation_window=1)
    filler.begin_step(0)
    filler.add_round([0], acc_rows(4), ["p"])
    assert filler.admit(["p", "p"]) == [True, True]
    assert filler.num_saturated_prompts == 0  # no history recorded when the skip is off


# --------------------------------------------------------------------------- max_num_gen_batches


def test_error_after_max_rounds_names_the_fix():
    filler = BatchFiller(train_batch_size=4, gen_batch_size=6, max_num_gen_batches=2)
    filler.begin_step(0)
    run_round(filler, "a", 1, 0, 0, 4, 4, 4)  # 1 kept of 6
    with pytest.raises(ValueError) as err:
        run_round(filler, "b", 0, 0, 0, 4, 4, 4)  # 0 kept: round 2 of 2 leaves 1 of 4
    msg = str(err.value)
    assert "1 of 4 groups" in msg
    assert "algorithm.filter_groups.max_num_gen_batches=2" in msg
    assert "[1/6=0.17, 0/6=0.00]" in msg  # kept fraction of each round
    assert "0 for unbounded" in msg
    # dropped: all-correct 3 + 3 = 6 > all-wrong 2 + 3 = 5, so the advice is to make the data harder
    assert "6 groups all correct, 5 all wrong" in msg and "too easy" in msg and "raise their difficulty" in msg

    hard = BatchFiller(train_batch_size=4, gen_batch_size=2, max_num_gen_batches=1)
    hard.begin_step(0)
    with pytest.raises(ValueError, match="too hard for the policy; lower the difficulty"):
        run_round(hard, "a", 0, 0)


def test_max_rounds_reached_exactly_when_full_is_fine():
    filler = BatchFiller(train_batch_size=2, gen_batch_size=4, max_num_gen_batches=2)
    filler.begin_step(0)
    run_round(filler, "a", 1, 0, 0, 0)
    run_round(filler, "b", 1, 0, 0, 0)  # round 2 of 2 fills the batch: no error
    assert filler.done


def test_zero_means_unbounded_rounds():
    filler = BatchFiller(train_batch_size=2, gen_batch_size=3, max_num_gen_batches=0)
    filler.begin_step(0)
    for r in range(20):
        run_round(filler, f"r{r}_", 0, 4, 0)
    run_round(filler, "z", 1, 2, 3)
    batch, m = filler.end_step()
    assert names(batch) == ["z0", "z1"]
    assert m["train/num_gen_batches"] == 21
    assert m["dapo/generated_per_trained"] == 31.5  # 21 rounds * 3 / 2


# --------------------------------------------------------------------------- misuse


def test_misuse_is_reported():
    filler = BatchFiller(train_batch_size=2, gen_batch_size=4)
    with pytest.raises(RuntimeError, match="begin_step"):
        filler.next_round_size()
    filler.begin_step(0)
    with pytest.raises(RuntimeError, match="end_step"):
        filler.begin_step(1)
    with pytest.raises(RuntimeError, match="add_round"):
        filler.end_step()
    with pytest.raises(ValueError, match="rollout.n >= 2"):
        filler.add_round([0], torch.ones(1, 1), ["p"])
    with pytest.raises(ValueError, match="one payload, one key"):
        filler.add_round([0, 1], acc_rows(1), ["p"])
    with pytest.raises(ValueError, match="min_gen_batch_size"):
        BatchFiller(train_batch_size=4, gen_batch_size=8, min_gen_batch_size=9)
    with pytest.raises(ValueError, match="max_num_gen_batches"):
        BatchFiller(train_batch_size=4, gen_batch_size=8, max_num_gen_batches=-1)


# --------------------------------------------------------------------------- checkpoint round trip


def _drive(filler: BatchFiller, step: int, outcomes: torch.Tensor) -> tuple[list, dict, list, list]:
    """One step against a fixed script of outcomes: `outcomes[j]` is the correct count of the j-th prompt."""
    filler.begin_step(step)
    admitted_log = []
    cursor = 0
    while not filler.done:
        n = filler.next_round_size()
        keys = []
        while len(keys) < n:
            key = f"k{cursor % 7}"  # 7 prompts revisited often, so the saturation history matters
            if filler.admit([key])[0]:
                keys.append(key)
            admitted_log.append(key)
            cursor += 1
        correct = [int(outcomes[(step * 31 + len(admitted_log) + j) % len(outcomes)]) for j in range(n)]
        groups = [{"key": k, "step": torch.tensor(step)} for k in keys]
        filler.add_round(groups, acc_rows(*correct), keys)
    batch, metrics = filler.end_step()
    return batch, metrics, list(filler.last_batch_versions), admitted_log


def _assert_same(a, b):
    batch_a, metrics_a, versions_a, log_a = a
    batch_b, metrics_b, versions_b, log_b = b
    assert [(p["key"], int(p["step"])) for p in batch_a] == [(p["key"], int(p["step"])) for p in batch_b]
    assert versions_a == versions_b and log_a == log_b
    assert metrics_a.keys() == metrics_b.keys()
    for key in metrics_a:
        assert metrics_a[key] == pytest.approx(metrics_b[key], nan_ok=True), key


@pytest.mark.parametrize("mid_step", [False, True])
def test_state_survives_torch_save_round_trip(tmp_path, mid_step):
    kwargs = dict(
        train_batch_size=3,
        gen_batch_size=9,
        adaptive=True,
        carry_over=True,
        skip_saturated=True,
        saturation_window=1,
        reprobe_after=2,
    )
    gen = torch.Generator().manual_seed(0)
    outcomes = torch.randint(0, G + 1, (97,), generator=gen)  # correct counts 0..4: many constant groups
    filler = BatchFiller(**kwargs)
    for step in range(4):
        _drive(filler, step, outcomes)
    assert filler.num_carried > 0 and filler.num_saturated_prompts > 0  # the state is not trivial
    if mid_step:  # checkpoint in the middle of a step, after one round
        filler.begin_step(4)
        filler.add_round([{"key": "m", "step": torch.tensor(4)}], acc_rows(2), ["m"])

    path = tmp_path / "filler.pt"
    torch.save(filler.state_dict(), path)
    resumed = BatchFiller(**kwargs)
    resumed.load_state_dict(torch.load(path))  # default weights_only=True: plain containers and tensors
    assert resumed.kept_frac_estimate == filler.kept_frac_estimate
    assert resumed.totals == filler.totals

    if mid_step:
        for f in (filler, resumed):
            while not f.done:
                n = f.next_round_size()
                f.add_round([{"key": "x", "step": torch.tensor(4)}] * n, acc_rows(*([1] * n)), ["x"] * n)
        a, b = filler.end_step(), resumed.end_step()
        assert [p["key"] for p in a[0]] == [p["key"] for p in b[0]] and a[1] == pytest.approx(b[1], nan_ok=True)
    for step in range(5, 12):
        _assert_same(_drive(filler, step, outcomes), _drive(resumed, step, outcomes))
    assert resumed.state_dict()["saturation_history"] == filler.state_dict()["saturation_history"]


def test_unknown_state_format_is_refused():
    with pytest.raises(ValueError, match="format"):
        BatchFiller(train_batch_size=1, gen_batch_size=1).load_state_dict({"format": 99})


# --------------------------------------------------------------------------- what add_round kept, read-only views


def test_add_round_returns_what_it_kept_and_builds_only_those_payloads():
    filler = BatchFiller(train_batch_size=2, gen_batch_size=4, carry_over=True)
    filler.begin_step(0)
    built = []

    def build(kept: list[int]) -> list[str]:
        built.append(list(kept))
        return [f"g{i}" for i in kept]

    # groups of 4 responses with 4, 1, 0, 2 correct: the mixed ones are 1 and 3
    kept = filler.add_round(build, acc_rows(4, 1, 0, 2), ["a", "b", "c", "d"])
    assert kept.tolist() == [False, True, False, True]
    assert built == [[1, 3]]  # payloads built for the kept groups only, once
    assert filler.ready_payloads == ("g1", "g3")
    batch, _ = filler.end_step()
    assert batch == ["g1", "g3"] and filler.carried_payloads == ()


def test_views_show_carried_groups_and_cannot_change_them():
    filler = BatchFiller(train_batch_size=1, gen_batch_size=3, carry_over=True)
    filler.begin_step(0)
    kept = filler.add_round(["x", "y", "z"], acc_rows(1, 3, 0), ["x", "y", "z"])  # x, y mixed; z all wrong
    assert kept.tolist() == [True, True, False]
    filler.end_step()
    assert filler.carried_payloads == ("y",)  # the surplus, for the next step
    with pytest.raises(AttributeError):
        filler.carried_payloads.append("w")  # a tuple: a view, not the filler's list
    filler.begin_step(1)
    assert filler.ready_payloads == ("y",)  # carried in
