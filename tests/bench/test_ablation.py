"""bench/experiments/ablation: the paper's Table 1 on the embedded engine, cumulative and leave-one-out."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from omegaconf import OmegaConf

from bench import common
from bench.experiments import ablation
from recipe.config import compose
from recipe.embedded.config import read_config
from tests.conftest import SMOLLM2_TWO_STEPS, prompt_lengths

ACTOR = "actor_rollout_ref.actor"


def _flat(cfg) -> dict:
    """Leaf keys of the composed config, interpolations unresolved (verl's ``critic.loss_agg_mode`` follows the
    actor's through one, which is not a second change)."""

    def walk(tree, prefix=""):
        for key, value in tree.items():
            if isinstance(value, dict):
                yield from walk(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    return dict(walk(OmegaConf.to_container(cfg, resolve=False)))


def _row_overrides(row: dict) -> list[str]:
    return [f"{k}={ablation.override_value(v)}" for k, v in row.items()]


def test_rows_are_the_papers_table_in_order():
    names = [name for name, _ in ablation.rows()]
    assert names == [
        "naive GRPO",
        "+ overlong filtering",
        "+ clip-higher",
        "+ soft overlong punishment",
        "+ token-level loss",
        "+ dynamic sampling (DAPO)",
    ]
    assert len({ablation.slug(n) for n in names}) == 6


def test_each_row_composes_and_differs_from_the_one_before_in_exactly_its_technique():
    configs = [_flat(compose(_row_overrides(row), ablation.CONFIG_NAME)) for _, row in ablation.rows()]
    expected_changes = [
        {"dapo.overlong_filter": (False, True)},
        {f"{ACTOR}.clip_ratio_high": (0.2, 0.28)},
        {"reward.reward_kwargs.overlong_buffer_cfg.enable": (False, True)},
        {f"{ACTOR}.loss_agg_mode": ("seq-mean-token-mean", "token-mean")},
        {"algorithm.filter_groups.enable": (False, True)},
    ]
    for before, after, expected in zip(configs, configs[1:], expected_changes):
        assert set(before) == set(after)
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        assert changed == expected
    # the last row is the shared setting (configs/ablation_long.yaml) as it stands: full DAPO with the paper's settings
    assert configs[-1] == _flat(compose([], ablation.CONFIG_NAME))
    naive = configs[0]
    assert naive[f"{ACTOR}.clip_ratio_low"] == naive[f"{ACTOR}.clip_ratio_high"] == 0.2
    assert naive[f"{ACTOR}.use_kl_loss"] is False and naive["algorithm.use_kl_in_reward"] is False


def test_every_row_is_a_valid_engine_config_with_its_techniques():
    seen = []
    for _, row in ablation.rows():
        c = read_config(compose(_row_overrides(row), ablation.CONFIG_NAME))
        d = c.dapo
        seen.append(
            (d.overlong.filter, d.loss.clip_ratio_high, d.overlong.buffer_enable, d.loss.loss_agg_mode, d.filter.enable)
        )
        assert (
            c.tiny.task["name"] == "addition_steps" and c.tiny.task["digits"] == 6 and c.data.max_response_length == 56
        )
        assert (d.overlong.max_resp_len, d.overlong.buffer_len) == (56, 12)
    assert seen == [
        (False, 0.2, False, "seq-mean-token-mean", False),
        (True, 0.2, False, "seq-mean-token-mean", False),
        (True, 0.28, False, "seq-mean-token-mean", False),
        (True, 0.28, True, "seq-mean-token-mean", False),
        (True, 0.28, True, "token-mean", False),
        (True, 0.28, True, "token-mean", True),
    ]


def run_records(val: dict[int, float], entropy: float, length: float, generated_prompts: int) -> list[dict]:
    records = [{"step": 0, "val-core/synthetic_addition/acc/mean@4": val[0]}]
    for step in range(1, max(val) + 1):
        r = {
            "step": step,
            "actor/entropy": entropy,
            "response_length/mean": length,
            "dapo/generated_prompts": generated_prompts,
            "dapo/overlong_frac": 0.25,
            "timing_s/step": 90.0 * generated_prompts,
        }
        if step in val:
            r["val-core/synthetic_addition/acc/mean@4"] = val[step]
        records.append(r)
    return records


def test_summary_figures_by_hand():
    slow = run_records({0: 0.2, 2: 0.3, 4: 0.4}, entropy=0.5, length=10.0, generated_prompts=4)
    fast = run_records({0: 0.2, 2: 0.5, 4: 0.6}, entropy=0.7, length=12.0, generated_prompts=8)
    never = run_records({0: 0.2, 2: 0.2, 4: 0.2}, entropy=0.1, length=9.0, generated_prompts=4)
    names = [name for name, _ in ablation.rows()]
    results = {
        names[0]: [slow, fast],
        names[1]: [fast, fast],
        names[2]: [never, never],
        names[3]: [slow, never],
        names[4]: [slow, slow],
        names[5]: [never, fast],
    }
    cumulative = ablation.comparisons()
    paper = dict(zip(names, ablation.plan.PAPER_AIME))
    figures = ablation.summarise(results, target=0.4, train_batch_size=4, n=2, comparisons=cumulative, paper=paper)
    assert figures["start_acc"] == pytest.approx(0.2) and figures["target"] == 0.4
    rows = {r["name"]: r for r in figures["rows"]}
    first = rows[names[0]]
    assert first["val_acc_mean"] == pytest.approx(0.5) and first["val_acc_std"] == pytest.approx(math.sqrt(0.02))
    assert first["steps_to_target"] == 3.0  # median of 4 and 2
    # slow reaches 0.4 at step 4: 4 steps x 4 prompts x 2 = 32 responses; fast at step 2: 2 x 8 x 2 = 32
    assert first["responses_to_target"] == 32.0
    assert first["final_entropy"] == pytest.approx(0.6) and first["truncated_frac"] == pytest.approx(0.25)
    assert rows[names[2]]["steps_to_target"] is None and rows[names[2]]["seeds_reaching_target"] == 0
    assert rows[names[3]]["steps_to_target"] is None  # one seed of two never reaches: the median is never
    assert rows[names[5]]["seeds_reaching_target"] == 1
    # compute: each run's step times summed (4 steps of 90 s a prompt): slow/never 4 x 360 s, fast 4 x 720 s
    assert first["per_seed"]["step_seconds"] == [1440.0, 2880.0]
    runs = [r for seeds in results.values() for r in seeds]
    assert figures["step_hours"] == pytest.approx(sum(2880.0 if r is fast else 1440.0 for r in runs) / 3600)
    assert [r["paper_aime_avg32"] for r in figures["rows"]] == [30, 36, 38, 41, 42, 50]
    # the default target: start 0.2 + 0.8 x (best mean final 0.6 - 0.2) = 0.52, reached only by fast, at step 4
    default = ablation.summarise(results, target=None, train_batch_size=4, n=2, comparisons=cumulative)
    assert default["target"] == pytest.approx(0.52)
    assert {r["name"]: r["steps_to_target"] for r in default["rows"]}[names[1]] == 4
    assert ablation.summarise(results, target=0.55, train_batch_size=4, n=2, comparisons=cumulative)["target"] == 0.55
    # each technique: its row less the row before, seed by seed; compute-matched, each row at its last validation
    # within the cheaper row's responses (slow and never: 4 steps x 4 prompts x 2 = 32; fast: 4 x 8 x 2 = 64)
    effects = {e["technique"]: e for e in figures["effects"]}
    assert [(e["with"], e["without"]) for e in figures["effects"]] == list(zip(names[1:], names))
    first_effect = effects["overlong filtering"]["paired"]  # [fast, fast] less [slow, fast]: +0.2, 0
    assert first_effect["val_acc"]["mean"] == pytest.approx(0.1) and first_effect["val_acc"]["seeds"] == 2
    # seed 0: fast (64 responses) against slow (32): fast at its last validation within 32 responses (step 2,
    # 0.5) less slow at step 4 (0.4) = +0.1; seed 1: fast against fast, 0
    assert first_effect["val_acc_matched"]["mean"] == pytest.approx(0.05)
    assert default["effects"][0]["paired"]["val_acc"] == first_effect["val_acc"]


def test_paired_interval_by_hand():
    # differences 0.1, 0.2, 0.3: mean 0.2, sd sqrt((0.01 + 0 + 0.01) / 2) = 0.1, se 0.1 / sqrt(3) = 0.057735,
    # t(0.975, 2) = 4.3027: half-width 0.24842, so [-0.04842, 0.44842] includes 0
    # abs=1e-4 below: the t quantiles are tabulated to 4 decimals (common.T_975), so the bounds are exact to 1e-4
    three = ablation.paired_interval([0.5, 0.6, 0.7], [0.4, 0.4, 0.4])
    assert three["mean"] == pytest.approx(0.2) and three["seeds"] == 3
    assert three["low"] == pytest.approx(-0.04842, abs=1e-4) and three["high"] == pytest.approx(0.44842, abs=1e-4)
    assert ablation.direction(three, +1) == "not shown"
    # five seeds, differences 0.1, 0.2, 0.3, 0.2, 0.2: mean 0.2, sd sqrt(0.02 / 4) = 0.070711, se 0.031623,
    # t(0.975, 4) = 2.7764: half-width 0.087798, [0.11220, 0.28780] wholly above 0
    five = ablation.paired_interval([0.6, 0.7, 0.8, 0.7, 0.7], [0.5] * 5)
    assert five["low"] == pytest.approx(0.11220, abs=1e-4) and five["high"] == pytest.approx(0.28780, abs=1e-4)
    assert ablation.direction(five, +1) == "shown" and ablation.direction(five, -1) == "opposite"
    # a seed missing on either side (a run without the metric) is left out of the pairing: 0.2, 0.2, 0.2 remain,
    # sd 0, a zero-width interval
    gaps = ablation.paired_interval([0.6, None, 0.7, 0.8, math.nan], [0.4, 0.4, 0.5, 0.6, 0.4])
    assert (gaps["mean"], gaps["low"], gaps["high"], gaps["seeds"]) == pytest.approx((0.2, 0.2, 0.2, 3))
    one = ablation.paired_interval([0.6], [0.4])
    assert one["mean"] == pytest.approx(0.2) and one["low"] is None
    assert ablation.direction(one, +1) == "too few seeds"
    # two seeds with the same difference (accuracy moves in steps of 1/256 on 64 problems x 4): a zero-width
    # interval [+2/256, +2/256], which would read as shown; below 3 seeds there is no verdict
    two = ablation.paired_interval([210 / 256, 207 / 256], [208 / 256, 205 / 256])
    assert two["low"] == pytest.approx(two["high"]) == pytest.approx(2 / 256)
    assert ablation.direction(two, +1) == "too few seeds"


def test_t_quantiles():
    assert common.T_975[4] == 2.7764 and common.T_975[1] == 12.7062
    values = [common.T_975[k] for k in sorted(common.T_975)]
    assert values == sorted(values, reverse=True) and values[-1] > 1.96  # falls toward the normal's 1.96
    try:
        from scipy.stats import t
    except ImportError:  # the table is what runs: past it, the next lower df's (wider) value
        assert common.t_quantile_975(4) == 2.7764 and common.t_quantile_975(27) == common.T_975[25]
    else:
        for df, value in common.T_975.items():
            assert t.ppf(0.975, df) == pytest.approx(value, abs=1e-4)  # the table holds 4 decimals


def _summary(name: str, per_seed: dict) -> dict:
    """A hand-made row of ``summarise``'s output: only what ``verdicts`` reads."""
    full = {"steps_to_target": [10] * 3, **per_seed}
    return {"name": name, "per_seed": full}


def test_verdicts_from_hand_made_summaries():
    names = [name for name, _ in ablation.rows()]
    base = {
        "val_acc": [0.50, 0.52, 0.54],
        "final_entropy": [0.30, 0.32, 0.34],
        "final_response_length": [20, 21, 22],
        "final_repeat": [0.10, 0.10, 0.10],
        "truncated_frac": [0.05, 0.05, 0.05],
        "acc_drawdown": [0.04, 0.04, 0.04],
        "steps_to_target_censored": [20, 20, 25],
        "val_acc_matched": [0.0, 0.0, 0.0],  # compute-matched differences, the same in every row here
    }
    changes = [  # each row after the baseline: the previous row's seeds with these changed
        # overlong filtering: accuracy +0.01 in every seed (shown), drawdown -0.02 in every seed (shown)
        {"val_acc": [0.51, 0.53, 0.55], "acc_drawdown": [0.02, 0.02, 0.02]},
        # clip-higher: accuracy unchanged, entropy +0.05 / -0.01 / +0.02 (interval includes 0)
        {"final_entropy": [0.35, 0.31, 0.36]},
        # soft punishment: truncation up by 0.02 in every seed (the wrong way), accuracy unchanged
        {"truncated_frac": [0.07, 0.07, 0.07]},
        # token-level loss: accuracy +0.02 (shown), repetition up 0.05 (opposite): mixed
        {"val_acc": [0.53, 0.55, 0.57], "final_repeat": [0.15] * 3},
        # dynamic sampling: 5 steps sooner in every seed, one of them censored (never reached: budget + 1)
        {"steps_to_target_censored": [15, 15, 20]},
    ]
    row_seeds = [base]
    for change in changes:
        row_seeds.append({**row_seeds[-1], **change})
    summaries = [_summary(name, seeds) for name, seeds in zip(names, row_seeds)]
    summaries[4]["per_seed"]["steps_to_target"] = [10, 10, None]
    summaries[5]["per_seed"]["steps_to_target"] = [10, 10, None]
    effects = [
        {
            "technique": technique,
            "with": after["name"],
            "without": before["name"],
            "paired": {k: ablation.paired_interval(after["per_seed"][k], before["per_seed"][k]) for k in base},
        }
        for technique, before, after in zip([t for t, *_ in ablation.comparisons()], summaries, summaries[1:])
    ]
    got = {v["with"]: v for v in ablation.verdicts({"rows": summaries, "effects": effects})}
    results = {name: {c["key"]: c["result"] for c in v["checks"]} for name, v in got.items()}
    assert results[names[1]] == {"val_acc": "shown", "val_acc_matched": "not shown", "acc_drawdown": "shown"}
    assert results[names[2]] == {"val_acc": "not shown", "val_acc_matched": "not shown", "final_entropy": "not shown"}
    assert results[names[3]] == {"val_acc": "not shown", "val_acc_matched": "not shown", "truncated_frac": "opposite"}
    assert results[names[4]] == {
        "val_acc": "shown",
        "val_acc_matched": "not shown",
        "final_repeat": "opposite",
        "final_response_length": "not shown",
        "final_entropy": "not shown",
    }
    assert results[names[5]] == {
        "val_acc": "not shown",
        "val_acc_matched": "not shown",
        "steps_to_target_censored": "shown",
    }
    assert [got[n]["overall"] for n in names[1:]] == ["shown", "not shown", "opposite", "mixed", "shown"]
    assert got[names[5]]["censored_seeds"] == 1 and got[names[4]]["censored_seeds"] == 0
    lines = ablation.verdict_lines(list(got.values()))
    # clip-higher's entropy: differences +0.05, -0.01, +0.02: mean +0.020, sd 0.03, half 4.3027 x 0.03 / sqrt(3)
    assert (
        "final entropy should rise (Fig. 2b: entropy does not collapse): +0.020 [-0.055, +0.095], not shown"
        " (the interval includes 0)" in lines[1]
    )
    assert lines[4].startswith("- **dynamic sampling: shown.** (+ dynamic sampling (DAPO) less + token-level loss)")
    assert "1 seed(s) never reached" in lines[4]


TINY = [  # a run of seconds: 1-digit operands (one column), the tiny model warmed up for 100 steps to about a third
    # right, so groups are mixed and dynamic sampling fills its batch; 2 steps of 4 prompts
    "tiny.task.digits=1",
    "tiny.task.val_size=8",
    "tiny.task.train_size=24",
    "tiny.warmup.steps=100",
    "tiny.warmup.batch_size=32",
    "data.max_response_length=10",
    "reward.reward_kwargs.overlong_buffer_cfg.len=3",
    "data.train_batch_size=4",
    "data.gen_batch_size=6",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.val_kwargs.n=2",
    f"{ACTOR}.ppo_mini_batch_size=2",
    f"{ACTOR}.ppo_micro_batch_size_per_gpu=4",
    f"{ACTOR}.optim.lr_warmup_steps=0",
    "trainer.total_training_steps=2",
    "trainer.test_freq=2",
    "trainer.save_freq=2",
]


def _one_seed(out, figures_path, cache) -> list[str]:
    """The arguments of an ablation of one seed of TINY runs, two at a time, its report under ``out``."""
    return ["--seeds", "1", "--jobs", "2", "--out", str(out), "--json", str(figures_path), f"cache_dir={cache}", *TINY]


def test_quick_runs_every_row_end_to_end_and_writes_table_plots_and_json(embedded_cache, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    out, figures_path = tmp_path / "ablation", tmp_path / "figures.json"
    args = ["--quick", *_one_seed(out, figures_path, embedded_cache)]
    assert ablation.main(args) == 0
    printed = capsys.readouterr().out

    figures = json.loads(figures_path.read_text())
    assert [r["name"] for r in figures["rows"]] == [name for name, _ in ablation.rows()]
    for row in figures["rows"]:
        assert {"name", "val_acc_mean", "val_acc_std", "final_entropy", "steps_to_target"} <= set(row)
        assert 0.0 <= row["val_acc_mean"] <= 1.0 and row["final_entropy"] > 0
    for effect in figures["effects"]:  # one seed: a paired difference, no interval
        assert effect["paired"]["val_acc"]["seeds"] == 1 and effect["paired"]["val_acc"]["low"] is None
    for row in figures["rows"]:
        assert 0.0 <= row["final_repeat"] <= 1.0
        assert row["curves"]["entropy"]["steps"] == [1, 2] and len(row["curves"]["response_length"]["mean"]) == 2
    assert [v["with"] for v in figures["verdicts"]] == [name for name, _ in ablation.rows()][1:]
    assert {v["overall"] for v in figures["verdicts"]} == {"too few seeds"}  # one seed
    report = (out / "report.md").read_text()
    assert report.count("\n| ") == 8  # header, rule, six rows
    assert report.count("\n- **") == 5 and "too few seeds" in report
    plots = [
        "accuracy",
        "entropy",
        "response_length",
        "repetition",
        "truncation",
        "accuracy_vs_responses",
        "fig2b_clip_higher",
        "fig4_token_level_loss",
        "fig5_overlong_filtering",
        "fig6_dynamic_sampling",
    ]
    for name in plots:
        assert (out / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"plots/{name}.png" in report
    assert "+ dynamic sampling (DAPO)" in printed

    # each run trained with its row's settings: the naive rows generate one train batch per step and never shape
    # the reward; soft punishment rows can; only the DAPO row runs the group filter
    def records(name):
        from recipe.embedded.monitor import read_metrics

        return [r for r in read_metrics(out / ablation.slug(name) / "seed0") if r["step"] > 0]

    for name, row in ablation.rows():
        steps = records(name)
        assert [r["step"] for r in steps] == [1, 2]
        filtered = row["algorithm.filter_groups.enable"]
        assert all(("dapo/kept_group_frac" in r) == filtered for r in steps), name
        if not filtered:
            assert all(r["dapo/generated_prompts"] == 4 for r in steps)
        if not row["reward.reward_kwargs.overlong_buffer_cfg.enable"]:
            assert all(r["dapo/overlong_penalty/mean"] == 0 for r in steps)

    # a second call reuses the finished runs and rebuilds the same report
    assert ablation.main(args) == 0
    assert "reusing 6 finished run(s)" in capsys.readouterr().out
    assert json.loads(figures_path.read_text())["rows"] == figures["rows"]


def test_a_misspelt_override_fails_before_anything_runs(tmp_path, capsys):
    assert ablation.main(["--out", str(tmp_path / "out"), "trainer.total_trainig_steps=3"]) == 2
    assert "total_trainig_steps" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_print_commands_gives_a_dapo_train_line_per_run(capsys, tmp_path):
    assert ablation.main(["--print-commands", "--seeds", "2", "--out", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("dapo-train")]
    assert len(lines) == 12
    # seed by seed: every row's seed 0, then every row's seed 1
    assert all("embedded.seed=0" in line for line in lines[:6]) and all("embedded.seed=1" in line for line in lines[6:])
    assert "dapo.overlong_filter=false" in lines[0] and "dapo.overlong_filter=false" in lines[6]
    assert "algorithm.filter_groups.enable=true" in lines[5] and "algorithm.filter_groups.enable=true" in lines[-1]
    # a seed changes both the RL sampling and the prompt order the engine reads (data.seed wins over embedded.seed)
    seeds = [read_config(compose(line.split()[3:], ablation.CONFIG_NAME)) for line in (lines[0], lines[6])]
    assert [(c.embedded.seed, c.data.seed) for c in seeds] == [(0, 0), (1, 1)]


def test_cuda_preset_commands_compose_into_gpu_runs(capsys, tmp_path):
    assert ablation.main(["--print-commands", "--device", "cuda", "--out", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("dapo-train")]
    assert len(lines) == 6 * ablation.PRESETS["cuda"]["seeds"]
    for line in lines[:6]:  # seed 0 of each row
        overrides = line.split()[3:]
        assert f"{ablation.DEVICE_KEY}=cuda" in overrides
        c = read_config(compose(overrides, ablation.CONFIG_NAME))
        assert c.embedded.device == "cuda" and c.tiny.model["hidden_size"] == 256 and c.embedded.num_threads == 2
    # --quick keeps its small setting on the GPU; a command-line override comes last and wins
    assert (
        ablation.main(
            [
                "--print-commands",
                "--quick",
                "--device",
                "cuda",
                "--seeds",
                "1",
                "--out",
                str(tmp_path),
                "trainer.total_training_steps=3",
            ]
        )
        == 0
    )
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("dapo-train"))
    c = read_config(compose(line.split()[3:], ablation.CONFIG_NAME))
    assert c.embedded.device == "cuda" and c.tiny.model["hidden_size"] == 128 and c.trainer.total_training_steps == 3


def test_the_long_setting_spans_an_order_of_magnitude_and_its_budget_binds_for_the_longest():
    from recipe.common.task import StepsAdditionTask, build_tokenizer, solution_text
    from recipe.common.warmup import TASKS, _settings

    cfg = read_config(compose([], "ablation_long"))
    assert cfg.tiny.task["name"] == "addition_steps" and cfg.tiny.task["digits"] == 6
    # the task's settings as the engine reads them (a null knob of another task counts as not given)
    task = _settings(dict(cfg.tiny.task), TASKS["addition_steps"][1], "tiny.task")
    spec = StepsAdditionTask(**{k: v for k, v in task.items() if k != "name"})
    tokenizer = build_tokenizer(spec)
    # one token per digit, "+", "="; "7+5=12\n" is at most 7 tokens, a carry adds 2 ("+1")
    lengths = [len(tokenizer(solution_text(r), add_special_tokens=False)["input_ids"]) + 1 for r in spec.rows("train")]
    # shortest: "2+3=5\nAnswer: 5" + EOS = 8 tokens; longest: 6 columns with carries + a 7-digit answer, 60 here
    assert min(lengths) == 8 and 55 <= max(lengths) <= 62
    assert max(lengths) / min(lengths) >= 7
    budget, buffer = cfg.data.max_response_length, cfg.dapo.overlong.buffer_len
    over = sum(n > budget for n in lengths) / len(lengths)
    in_buffer = sum(budget - buffer < n <= budget for n in lengths) / len(lengths)
    assert 0.002 < over < 0.03  # the budget binds for the longest solutions only (6 columns, most of them carried)
    assert 0.15 < in_buffer < 0.40  # the long correct solutions (6 columns) are softly punished
    prompts = prompt_lengths(tokenizer, spec.rows("train"))
    assert max(prompts) <= cfg.data.max_prompt_length
    assert max(prompts) + budget <= cfg.tiny.model["max_position_embeddings"]


def test_config_name_picks_the_shared_setting_of_every_run(capsys, tmp_path):
    assert ablation.main(["--print-commands", "--quick", "--seeds", "1", "--out", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("dapo-train")]
    assert len(lines) == 6 and all(line.startswith("dapo-train --config-name ablation_long ") for line in lines)
    c = read_config(compose(lines[0].split()[3:], "ablation_long"))
    assert c.tiny.task["digits"] == 6 and c.trainer.total_training_steps == 8  # the default setting, --quick's 8 steps
    assert ablation.main(["--print-commands", "--config-name", "ablation", "--seeds", "1", "--out", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("dapo-train")]
    assert len(lines) == 6 and all(line.startswith("dapo-train --config-name ablation ") for line in lines)
    c = read_config(compose(lines[0].split()[3:], "ablation"))
    assert c.tiny.task["digits"] == 3 and c.trainer.total_training_steps == 40 and c.data.max_response_length == 28
    assert ablation.main(["--print-commands", "--config-name", "no_such_setting", "--out", str(tmp_path)]) == 2


def test_leave_one_out_rows_are_full_dapo_less_exactly_one_technique():
    names = [name for name, _ in ablation.rows("leave-one-out")]
    assert names == [
        "DAPO",
        "without overlong filtering",
        "without clip-higher",
        "without soft overlong punishment",
        "without token-level loss",
        "without dynamic sampling",
    ]
    assert len({ablation.slug(n) for n in names} | {ablation.slug(n) for n, _ in ablation.rows()}) == 12
    configs = {
        name: _flat(compose(_row_overrides(row), ablation.CONFIG_NAME)) for name, row in ablation.rows("leave-one-out")
    }
    full = configs.pop("DAPO")
    assert full == _flat(compose([], ablation.CONFIG_NAME))  # the shared setting as it stands
    cumulative = dict(ablation.rows())
    for (technique, key, off, on), (name, config) in zip(ablation.plan.SWITCHES, configs.items()):
        assert name == f"without {technique}"
        assert {k: (full[k], config[k]) for k in full if full[k] != config[k]} == {key: (on, off)}
    assert cumulative["+ dynamic sampling (DAPO)"] == dict(ablation.rows("leave-one-out"))["DAPO"]
    picked = ablation.comparisons("leave-one-out", ["dynamic sampling", "clip-higher"])
    assert picked == [  # the paper's order, whatever order they were asked in
        ("clip-higher", "DAPO", "without clip-higher"),
        ("dynamic sampling", "DAPO", "without dynamic sampling"),
    ]
    with pytest.raises(ValueError, match="unknown technique.*'clip higher'.*the techniques are overlong filtering"):
        ablation.rows("leave-one-out", ["clip higher"])
    with pytest.raises(ValueError, match="cumulative design adds every technique"):
        ablation.rows("cumulative", ["clip-higher"])


def test_the_real_model_preset_composes_every_row(capsys):
    preset = ablation.PRESETS["smollm2"]
    for _, row in ablation.rows(preset["design"], preset["techniques"]):
        c = read_config(compose([*_row_overrides(row), *preset["overrides"]], preset["config_name"]))
        assert c.rollout.n == 8 and c.trainer.total_training_steps == 40 and c.model.path.endswith("smollm2/run/model")
    # the plan and its size are said before anything runs: 4 rows x 3 seeds of 40 steps
    assert ablation.main(["--preset", "smollm2", "--print-commands"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("dapo-train")]
    assert len(commands) == 12 and all("--config-name embedded_smollm2" in line for line in commands)


def test_leave_one_out_runs_in_pieces_and_reports_each_technique_against_full_dapo(
    embedded_cache, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("WANDB_MODE", "offline")
    out, figures_path = tmp_path / "loo", tmp_path / "figures.json"
    args = ["--design", "leave-one-out", "--techniques", "clip-higher,dynamic sampling"]
    args += _one_seed(out, figures_path, embedded_cache)
    # a piece of 0 minutes starts nothing, says so, and writes no report
    assert ablation.main([*args, "--stop-after", "0"]) == 0
    printed = capsys.readouterr().out
    assert "3 rows x 1 seeds x 2 steps = 6 training steps (0 done)" in printed
    assert "stopped after 0 min with 3 of 3 runs to go; the same command continues" in printed
    assert not (out / "report.md").exists() and not figures_path.exists()

    # --rows runs those rows' runs alone and stops without a report
    assert ablation.main([*args, "--rows", "without dynamic sampling"]) == 0
    printed = capsys.readouterr().out
    assert "(0 done), 2 at a time, under" in printed and "running 1 of its runs (--rows)" in printed
    assert "the runs of without dynamic sampling are done; the plan's command (without --rows) reports" in printed
    assert (out / "without_dynamic_sampling" / "seed0" / "ablation_done.json").is_file()
    assert not (out / "dapo").exists() and not (out / "report.md").exists()
    with pytest.raises(SystemExit):
        ablation.main([*args, "--rows", "without soft overlong punishment"])  # not a row of this plan
    assert "its rows: DAPO, without clip-higher, without dynamic sampling" in capsys.readouterr().err

    # with --eval-k, each run's last checkpoint answers as soon as the run ends, before the next is counted done
    assert ablation.main([*args, "--eval-k", "2"]) == 0
    printed = capsys.readouterr().out
    assert "reusing 1 finished run(s)" in printed and printed.index("eval-k2: ") < printed.index("[1/2]")
    # 4 models answered: 2 runs as they end, the run of --rows (trained without --eval-k) and the start model at
    # the report, which reuses the first two's answers
    assert printed.count("eval-k2: ") - printed.count("eval-k2: reusing") == 4
    assert printed.count("eval-k2: reusing") == 2
    figures = json.loads(figures_path.read_text())
    assert figures["design"] == "leave-one-out"
    assert [r["name"] for r in figures["rows"]] == ["DAPO", "without clip-higher", "without dynamic sampling"]
    assert [(e["technique"], e["with"], e["without"]) for e in figures["effects"]] == [
        ("clip-higher", "DAPO", "without clip-higher"),
        ("dynamic sampling", "DAPO", "without dynamic sampling"),
    ]
    rows = {r["name"]: r for r in figures["rows"]}
    for effect in figures["effects"]:
        expected = rows["DAPO"]["val_acc_per_seed"][0] - rows[effect["without"]]["val_acc_per_seed"][0]
        assert effect["paired"]["val_acc"]["mean"] == pytest.approx(expected)
    assert all(r["paper_aime_avg32"] is None for r in figures["rows"])
    report = (out / "report.md").read_text()
    assert "(leave-one-out)" in report and report.count("\n| ") == 5  # header, rule, three rows
    assert "- **clip-higher: too few seeds.** (DAPO less without clip-higher)" in report
    for name in ("fig2b_clip_higher", "fig6_dynamic_sampling", "accuracy_vs_responses"):
        assert f"plots/{name}.png" in report
    assert "fig4_token_level_loss" not in report  # not compared in this plan
    # the finished runs are reused: the same command trains and answers nothing more; the accuracies of each run's
    # last checkpoint and the start model, k answers a problem, are paired like the rest
    assert ablation.main([*args, "--eval-k", "2"]) == 0
    printed = capsys.readouterr().out
    assert "reusing 3 finished run(s)" in printed and printed.count("eval-k2: reusing") == 4
    report_one = (out / "report.md").read_text()
    figures = json.loads(figures_path.read_text())
    assert figures["eval_k"] == 2 and 0.0 <= figures["start_eval_acc"] <= 1.0
    rows = {r["name"]: r for r in figures["rows"]}
    for name, row in rows.items():
        answers = out / ablation.slug(name) / "seed0" / "eval-k2" / "0.jsonl"
        lines = [json.loads(line) for line in answers.read_text().splitlines()]
        assert len(lines) == 2 * 8  # 8 held-out problems (tiny.task.val_size), twice each
        assert row["per_seed"]["eval_acc"] == [pytest.approx(sum(a["acc"] for a in lines) / len(lines))]
    for effect in figures["effects"]:
        expected = rows["DAPO"]["per_seed"]["eval_acc"][0] - rows[effect["without"]]["per_seed"]["eval_acc"][0]
        assert effect["paired"]["eval_acc"]["mean"] == pytest.approx(expected)
    report = (out / "report.md").read_text()
    assert "| row | avg@2 at the end (mean, 1 seed) | with less without | val acc @ step 2" in report
    assert "final accuracy, 2 answers a held-out problem should rise" in report
    # a plan of 2 seeds with seed 1 not run: --report-finished starts nothing and reports the finished seed alone
    two_seeds = [*args, "--seeds", "2", "--eval-k", "2", "--report-finished"]
    assert ablation.main(two_seeds) == 0
    printed = capsys.readouterr().out
    assert "3 rows x 2 seeds x 2 steps = 12 training steps (6 done)" in printed
    assert "reporting seed(s) 0 of 2, finished in every row" in printed and "ok in" not in printed
    assert not (out / "dapo" / "seed1").exists()
    interim = json.loads(figures_path.read_text())
    assert interim["seeds"] == 1 and interim["seeds_planned"] == 2 and interim["rows"] == figures["rows"]
    interim_report = (out / "report.md").read_text()
    assert "--seeds 2" in interim_report and "--report-finished" in interim_report  # its command says what it is
    without_command = lambda text: [line for line in text.splitlines() if not line.startswith("Command:")]  # noqa: E731
    assert without_command(interim_report) == without_command(report_one)

    # the records alone are the runs: another checkout holding them without the checkpoints reports the same
    moved = tmp_path / "elsewhere"
    shutil.copytree(out, moved, ignore=shutil.ignore_patterns("global_step_*"))
    moved_args = [*args, "--eval-k", "2", "--out", str(moved), "--json", str(tmp_path / "moved.json")]
    assert ablation.main(moved_args) == 0
    assert "not evaluated" not in capsys.readouterr().out
    assert json.loads((tmp_path / "moved.json").read_text())["rows"] == figures["rows"]
    # runs that another start model began are not added to: the weights differ from those recorded
    record = moved / "start_model.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "sha256": "0" * 64}))
    with pytest.raises(SystemExit, match="started from other weights than .* --fresh"):
        ablation.main(moved_args)


@pytest.mark.slow
def test_the_real_model_preset_runs_quick_end_to_end(smollm2_assets, tmp_path, capsys, monkeypatch):
    # the harness on the real model in minutes: --preset smollm2 --quick, 2 seeds of DAPO and DAPO without the
    # token-level loss, one step of 2 prompts x 2 on the converted SmolLM2 (tests/conftest.py: SMOLLM2_TWO_STEPS);
    # --eval-k is tested on the tiny model above (here it would double the test's minutes: a process a model).
    # That model gets nothing right before its warm-up, so every group is all-wrong: the accuracy filter is off
    # in both rows (it would never fill a batch), as in the two-step run of each engine
    monkeypatch.setenv("WANDB_MODE", "offline")
    out, figures_path = tmp_path / "real", tmp_path / "figures.json"
    one_step = {"trainer.total_training_steps": 1, "trainer.test_freq": 1, "trainer.save_freq": 1}
    settings = {**SMOLLM2_TWO_STEPS, **one_step, "smollm2.assets": str(smollm2_assets), "trainer.logger": "[console]"}
    args = ["--preset", "smollm2", "--quick", "--techniques", "token-level loss", "--eval-k", "0"]
    args += ["--out", str(out), "--json", str(figures_path), *[f"{k}={v}" for k, v in settings.items()]]
    assert ablation.main(args) == 0
    printed = capsys.readouterr().out
    assert "ablation (leave-one-out): 2 rows x 2 seeds x 1 steps = 4 training steps (0 done)" in printed
    figures = json.loads(figures_path.read_text())
    assert [r["name"] for r in figures["rows"]] == ["DAPO", "without token-level loss"]
    for row in figures["rows"]:
        assert len(row["val_acc_per_seed"]) == 2 and all(0.0 <= a <= 1.0 for a in row["val_acc_per_seed"])
        assert 0 < row["final_response_length"] <= SMOLLM2_TWO_STEPS["data.max_response_length"]
    (effect,) = figures["effects"]
    assert effect["technique"] == "token-level loss" and effect["paired"]["val_acc"]["seeds"] == 2
    assert "eval_acc" not in effect["paired"] and figures["eval_k"] == 0
    for seed in (0, 1):
        run = out / "without_token_level_loss" / f"seed{seed}"
        config = json.loads((run / "global_step_1" / "run.json").read_text())
        assert config["actor_rollout_ref.actor.loss_agg_mode"] == "seq-mean-token-mean"
        assert config["embedded.seed"] == seed and config["actor_rollout_ref.model.path"].startswith(
            str(smollm2_assets)
        )
    assert "- **token-level loss: too few seeds.**" in (out / "report.md").read_text()
