"""bench.sim.async_loops: the three trainer modes on paper, checked against hand-worked cases and its own invariants."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from bench.sim import async_loops
from bench.sim.async_loops import Group, Rollout, Setup, Simulation, simulate

# a small cluster: 2 replicas of 4 slots, 8 prompts x 4 responses, 2 updates a step, 200-token budget
SMALL = Setup(
    gpus=8,
    gpus_per_replica=4,
    slots=4,
    rollout_gpus=4,
    train_batch_size=8,
    gen_batch_size=8,
    ppo_mini_batch_size=4,
    n=4,
    max_response_length=200,
    prompt_tokens=0,
    median_length=50.0,
    params=1e6,
    num_warmup_batches=1,
    sync_colocated_s=1.0,
    sync_separate_s=1.0,
)


def test_a_round_of_equal_responses_takes_their_length_and_leaves_no_slot_idle():
    # 8 slots, 16 responses of 10 tokens at 0.5 s a token: two waves of 5 s; busy the whole time
    rollout = Rollout(slots=8, token_s=0.5)
    for gid in range(4):
        rollout.submit(Group(gid, 0, [10] * 4, keep=True))
    assert rollout.run() == pytest.approx(10.0)
    assert rollout.busy == pytest.approx(rollout.capacity) == pytest.approx(80.0)
    assert len(rollout.done) == 4 and rollout.generated == pytest.approx(160)


def test_a_long_response_holds_the_round_and_the_other_slots_idle():
    # 2 slots: one response of 100 tokens, one of 10: the round takes 100 steps, the second slot works 10 of them
    rollout = Rollout(slots=2, token_s=1.0)
    rollout.submit(Group(1, 0, [100, 10], keep=True))
    assert rollout.run() == 100.0
    assert rollout.busy / rollout.capacity == pytest.approx(110 / 200)


def test_an_aborted_response_keeps_its_tokens_and_pays_its_prefill_again():
    # 1 slot, a 100-token response, prompt of 20 tokens, prefill 0.1 decoding steps a token: 2 steps at start
    rollout = Rollout(slots=1, token_s=1.0, prefill=0.1, prompt_tokens=20)
    rollout.submit(Group(1, 0, [100], keep=True))
    rollout.run(until=52.0)  # 2 steps of prefill + 50 tokens
    rollout.abort()
    rollout.wait(10.0, idle=False)
    # 50 tokens left, plus prefilling the prompt and the 50 tokens so far again: 7 steps
    assert rollout.run() == pytest.approx(62.0 + 50 + 7)


def test_sync_with_equal_lengths_matches_the_arithmetic():
    # every group kept, one round of 8 prompts x 4 = 32 responses of 50 tokens on 8 slots: 4 waves of 50 steps
    s = replace(SMALL, sigma_prompt=0.0, sigma_response=0.0, keep_frac=1.0, adaptive_rounds=False)
    sim = Simulation(s, "sync", seed=0)
    record = sim.run(1)[0]
    decode_s = 4 * 50 * s.decode_step_s
    train_s = 32 * 50 * s.train_token_s / s.gpus
    assert record.train_s == pytest.approx(train_s)
    assert record.time == pytest.approx(decode_s + train_s + s.sync_colocated_s)
    assert sim.summary(0)["rollout_idle_frac"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("mode", async_loops.MODES)
def test_every_mode_trains_the_batch_each_step_within_the_staleness_bound(mode):
    s = replace(SMALL, max_off_policy_threshold=2, keep_frac=0.5)
    sim = Simulation(s, mode, seed=1)
    records = sim.run(10)
    assert all(len(r.spans) == s.train_batch_size for r in records)
    assert max(x for r in records for x in r.spans) <= (2 if mode == "sync" else s.max_off_policy_threshold)
    summary = sim.summary(2)
    assert 0.0 <= summary["gpu_idle_frac"] <= 1.0 and 0.0 <= summary["rollout_idle_frac"] <= 1.0
    assert summary["trained_responses_per_s"] == pytest.approx(s.train_batch_size * s.n / summary["step_s"])


def test_a_tight_staleness_bound_drops_groups_in_async_training():
    # one step of staleness with a long tail and slow training: finished groups older than the bound are dropped
    s = replace(SMALL, max_off_policy_threshold=1, sigma_prompt=1.0, sigma_response=1.0, num_warmup_batches=2)
    sim = Simulation(s, "colocate_async", seed=2)
    records = sim.run(12)
    assert sum(r.dropped_stale for r in records) > 0
    assert all(x == 1 for r in records for x in r.spans)
    assert sim.wasted_tokens > 0


def test_with_a_long_tail_the_async_modes_leave_less_of_the_cluster_idle():
    s = replace(Setup(), gpus=32, rollout_gpus=24, train_batch_size=64, gen_batch_size=192, ppo_mini_batch_size=8)
    results = simulate(s, steps=6, seed=0)
    sync, colocate = results["sync"], results["colocate_async"]
    assert sync["rollout_idle_frac"] > 0.2  # the tail: slots wait for the longest responses of each round
    assert colocate["gpu_idle_frac"] < sync["gpu_idle_frac"] and colocate["step_s"] < sync["step_s"]
    best = results["separate_async (best split)"]
    assert best["trained_responses_per_s"] >= results["separate_async"]["trained_responses_per_s"]
    assert best["rollout_gpus"] % s.gpus_per_replica == 0


def test_measured_lengths_are_read_by_prompt_and_scaled_to_the_budget(tmp_path):
    path = tmp_path / "start.json"
    path.write_text(json.dumps({"budget": 100, "n": 2, "lengths": [10, 20, 100, 50]}))
    groups = async_loops.read_lengths(path)
    assert groups == [[0.1, 0.2], [1.0, 0.5]]
    s = replace(SMALL, max_response_length=1000)
    lengths = async_loops.Lengths(s, __import__("random").Random(0), groups)
    drawn = [lengths.group() for _ in range(50)]
    assert all(len(g) == s.n for g in drawn)
    assert {x for g in drawn for x in g} <= {100, 200, 1000, 500}
    assert all(set(g) <= {100, 200} or set(g) <= {1000, 500} for g in drawn)  # one prompt's lengths per group
    path.write_text(json.dumps({"budget": 100, "n": 3, "lengths": [10, 20, 100, 50]}))
    with pytest.raises(ValueError, match="not groups of n=3"):
        async_loops.read_lengths(path)


def test_the_command_line_prints_every_mode_and_writes_the_figures(tmp_path, capsys):
    out = tmp_path / "sim.json"
    sets = ["gpus=16", "rollout_gpus=8", "train_batch_size=32", "gen_batch_size=96", "ppo_mini_batch_size=8"]
    assert async_loops.main(["--steps", "4", "--json", str(out), "--set", *sets]) == 0
    text = capsys.readouterr().out
    for mode in (*async_loops.MODES, "separate_async (best split)"):
        assert f"\n{mode} " in text
    figures = json.loads(out.read_text())
    assert figures["setup"]["gpus"] == 16 and set(figures["results"]) >= set(async_loops.MODES)
    assert math.isfinite(figures["results"]["sync"]["step_s"])
    with pytest.raises(SystemExit):
        async_loops.main(["--set", "gpu=8"])
    assert "unknown field 'gpu'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        async_loops.main(["--set", "carry_over=no"])
    assert "carry_over is true or false" in capsys.readouterr().err
    assert async_loops.main(["--steps", "3", "--json", str(out), "--set", *sets, "carry_over=False"]) == 0
    assert json.loads(out.read_text())["setup"]["carry_over"] is False


@pytest.mark.parametrize("mode", async_loops.MODES)
def test_idle_fractions_count_only_the_steps_after_the_warm_up(mode):
    # the steps' decoding shares partition the rollout's whole-run totals, and a summary that skips every step but
    # the last is that step's own share (the warm-up steps, with their empty pipeline, do not dilute it)
    s = replace(SMALL, keep_frac=0.5, sigma_prompt=1.0)
    sim = Simulation(s, mode, seed=3)
    records = sim.run(6)
    assert sum(r.decode_busy for r in records) == pytest.approx(sim.rollout.busy)
    assert sum(r.decode_capacity for r in records) == pytest.approx(sim.rollout.capacity)
    last = records[-1]
    assert sim.summary(5)["rollout_idle_frac"] == pytest.approx(1 - last.decode_busy / last.decode_capacity)
    if mode != "separate_async":  # the same GPUs decode and train
        busy_gpu_s = last.decode_busy / sim.rollout.slots * s.gpus + last.train_s * s.gpus
        assert sim.summary(5)["gpu_idle_frac"] == pytest.approx(1 - busy_gpu_s / (s.gpus * last.time))
