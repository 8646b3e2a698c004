"""The pure parts of ``bench/compare/sampling_verl.py`` (no verl run): its command line, the configs its three
contenders train with (composed against verl's schema, checked by verl's and our start-up checks), and the
arithmetic of its summary."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

pytest.importorskip("verl")
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402

from bench.common import read_steps  # noqa: E402
from bench.compare import sampling_verl as bench  # noqa: E402
from recipe.config import compose  # noqa: E402
from recipe.dapo.main_dapo import check_dapo_config  # noqa: E402
from recipe.dapo.sampler import DynamicSamplingSettings  # noqa: E402


def _composed(name: str, tmp_path: Path):
    return compose(
        ["+experiment=cpu_tiny", *bench.contender_overrides(name, 6, tmp_path / bench.slug(name))], "dapo_trainer"
    )


def _custom_sampler(cfg) -> tuple:
    custom = cfg.trainer.v1.sampler.custom_sampler
    return custom.get("path"), custom.get("name")


@pytest.mark.parametrize("name", list(bench.CONTENDERS))
def test_every_contender_composes_and_passes_the_start_up_check(name, tmp_path):
    cfg = _composed(name, tmp_path)
    check_dapo_config(cfg)  # what main_dapo runs before Ray starts
    assert cfg.trainer.total_training_steps == 6 and cfg.trainer.test_freq == 6
    assert cfg.data.train_batch_size == bench.TRAIN_BATCH_SIZE and cfg.data.seed == 0
    assert Path(cfg.trainer.default_local_dir) == tmp_path / bench.slug(name)


def test_our_contenders_use_our_sampler_with_their_options(tmp_path):
    for name, options in (("ours", (False, False)), ("ours, options", (True, True))):
        cfg = _composed(name, tmp_path)
        assert cfg.trainer.v1.trainer_mode == "dapo" and cfg.dapo.overlong_filter
        assert _custom_sampler(cfg) == ("pkg://recipe.dapo.sampler", "DAPOReplayBuffer")
        kwargs = OmegaConf.to_container(cfg.trainer.v1.sampler.sampler_kwargs, resolve=True)
        sampling = DynamicSamplingSettings.from_kwargs(kwargs).sampling
        assert (sampling.adaptive, sampling.carry_over, sampling.skip_saturated) == (*options, False)
        assert sampling.gen_batch_size == 8  # rounds of 8 prompts for batches of 4


def test_verl_contender_gets_verls_builtin_filter_on_acc(tmp_path):
    cfg = _composed("verl filter", tmp_path)
    assert cfg.trainer.v1.trainer_mode == "sync" and not cfg.dapo.overlong_filter
    assert _custom_sampler(cfg) == (None, None)  # verl builds its own ReplayBuffer (trainer_base._build_replay_buffer)
    # verl's own resolution of the filter metric (it reads only self.config)
    assert PPOTrainer._resolve_filter_groups_metric(SimpleNamespace(config=cfg)) == "acc"


def test_command_line():
    with pytest.raises(SystemExit):
        bench.main(["--steps", "1"])  # a step time needs a second step
    with pytest.raises(SystemExit, match="is missing"):
        bench.main(["--verl-python", "/nonexistent/python"])
    with pytest.raises(SystemExit):
        bench.main(["--only", "nobody"])
    assert bench.verl_python(Path("/x/python")) == Path("/x/python")


def test_verl_python_from_the_environment(monkeypatch):
    monkeypatch.setenv("DAPO_VERL_CPU_PYTHON", "/opt/v/bin/python")
    assert bench.verl_python(None) == Path("/opt/v/bin/python")
    monkeypatch.delenv("DAPO_VERL_CPU_PYTHON")
    assert bench.verl_python(None) == bench.REPO / ".venv-verl-cpu" / "bin" / "python"


def _write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_summary_of_our_sampler(tmp_path):
    val = bench.VAL_KEY_VERL
    metrics = _write(
        tmp_path / "m.jsonl",
        [
            {"step": 0, "data": {val: 0.25}},
            # step 1: two rounds of 8 prompts, 5 filtered, 7 kept, 3 of them surplus
            {
                "step": 1,
                "data": {
                    "timing_s/step": 9.0,
                    "dapo/generated_prompts": 16,
                    "train/num_gen_batches": 2,
                    "dapo/filtered_all_correct": 2,
                    "dapo/filtered_all_wrong": 3,
                    "dapo/surplus_groups": 3,
                },
            },
            {
                "step": 2,
                "data": {
                    "timing_s/step": 3.0,
                    "dapo/generated_prompts": 8,
                    "train/num_gen_batches": 1,
                    "dapo/filtered_all_correct": 1,
                    "dapo/filtered_all_wrong": 0,
                    "dapo/surplus_groups": 3,
                },
            },
            {
                "step": 3,
                "data": {
                    "timing_s/step": 5.0,
                    "dapo/generated_prompts": 8,
                    "train/num_gen_batches": 1,
                    "dapo/filtered_all_correct": 0,
                    "dapo/filtered_all_wrong": 4,
                    "dapo/surplus_groups": 0,
                },
            },
            {"step": 3, "data": {val: 0.5}},  # validation after the last step: a second line for the same step
        ],
    )
    s = bench.summarize(read_steps(metrics), steps=3, train_batch_size=4)
    assert s["gen_per_trained"] == (16 + 8 + 8) / (3 * 4)  # 2.667
    assert s["rounds_per_step"] == (2 + 1 + 1) / 3
    assert s["filtered_per_step"] == (5 + 1 + 4) / 3
    assert s["surplus_per_step"] == (3 + 3 + 0) / 3
    assert s["step_s"] == s["step_s_median"] == (3.0 + 5.0) / 2  # steps 2 and 3; step 1 (start-up) excluded
    assert (s["val_acc_before"], s["val_acc"]) == (0.25, 0.5)


def test_summary_of_verls_filter_counts_every_generated_group(tmp_path):
    metrics = _write(
        tmp_path / "m.jsonl",
        [
            {
                "step": 1,
                "data": {
                    "timing_s/step": 2.0,
                    "training/filter_groups/evicted_samples": 6,
                    "training/filter_groups/discarded_surplus_samples": 2,
                },
            },
            {
                "step": 2,
                "data": {"timing_s/step": 4.0, "training/rollout_failure/evicted_samples": 1},
            },  # nothing filtered
        ],
    )
    s = bench.summarize(read_steps(metrics), steps=2, train_batch_size=4)
    assert s["gen_per_trained"] == (2 * 4 + 6 + 2 + 1) / (2 * 4)  # trained + evicted + surplus + failed = 17 / 8
    assert s["rounds_per_step"] is None  # verl logs no count of its refill dispatches
    assert (s["filtered_per_step"], s["surplus_per_step"]) == (3, 1)
    assert s["step_s"] == 4.0 and s["val_acc"] is None


def test_step_time_mean_counts_the_extra_rounds_the_median_hides(tmp_path):
    times = [9.0, 2.0, 2.0, 8.0]  # step 4 ran a second generation round
    metrics = _write(
        tmp_path / "m.jsonl",
        [
            {"step": s, "data": {"timing_s/step": t, "training/filter_groups/evicted_samples": 0}}
            for s, t in enumerate(times, start=1)
        ],
    )
    s = bench.summarize(read_steps(metrics), steps=4, train_batch_size=4)
    assert s["step_s"] == (2.0 + 2.0 + 8.0) / 3 and s["step_s_median"] == 2.0


def test_summary_refuses_a_run_that_ended_early(tmp_path):
    metrics = _write(tmp_path / "m.jsonl", [{"step": 1, "data": {"timing_s/step": 2.0}}])
    with pytest.raises(RuntimeError, match=r"steps \[2\]"):
        bench.summarize(read_steps(metrics), steps=2, train_batch_size=4)


def test_ratios_against_ours():
    results = {
        "ours": {"gen_per_trained": 2.0, "rounds_per_step": 1.5, "step_s": 3.0},
        "verl filter": {"gen_per_trained": 3.0, "rounds_per_step": None, "step_s": 6.0},
    }
    assert bench.ratios(results) == {"verl filter": {"gen_per_trained": 1.5, "step_s": 2.0}}
