"""The paper's Table 1, small: DAPO built up from naive GRPO one technique at a time, on the embedded engine.

Six rows, in the paper's order, each the one before it with one technique switched on (:func:`rows`):

  naive GRPO                   clip 0.2/0.2, per-sequence loss (seq-mean-token-mean), no overlong filtering,
                               no soft overlong punishment, no dynamic sampling; no KL in any row (DAPO has none)
  + overlong filtering         dapo.overlong_filter=true
  + clip-higher                actor_rollout_ref.actor.clip_ratio_high=0.28
  + soft overlong punishment   reward.reward_kwargs.overlong_buffer_cfg.enable=true
  + token-level loss           actor_rollout_ref.actor.loss_agg_mode=token-mean
  + dynamic sampling (DAPO)    algorithm.filter_groups.enable=true

Every run composes ``configs/ablation_long.yaml`` (the shared setting, ``--config-name`` picks another: the
``addition_steps`` task with operands of 1 to 6 digits, whose worked solutions are 8 to 60 tokens long against a
56-token budget with a 12-token overlong buffer, so long correct solutions are softly punished and the longest are
cut; a start model that solves a minority (29.5% at temperature 1); the held-out validation set; 60 steps) plus its
row's overrides, and is an ordinary ``dapo-train`` run in its own process: ``--print-commands`` shows each one, to
rerun a single row by hand. ``--config-name ablation`` is the shorter setting it composes (operands of 1 to 3
digits, 8 to 30 tokens, 40 steps). Every row of a seed starts from the same warmed-up model (built once, cached);
the seed changes the RL sampling (``embedded.seed``) and the prompt order (``data.seed``).

What it writes under ``--out`` (default ``bench/results/ablation``): one run directory per row and seed (the
engine's ``metrics.jsonl``, plots, last checkpoint, ``log.txt``), ``report.md`` (the table, a verdict per
technique, the plots), ``plots/`` and, with ``--json PATH``, the figures (per seed, paired differences, mean
curves, verdicts). Plots, each the mean over seeds shaded from the lowest to the highest seed: every row against
steps for accuracy, entropy, response length, repetition and truncation; and the paper's figures
(``PAPER_FIGURES``), two rows side by side: Fig. 2b entropy without / with Clip-Higher, Fig. 4 length, entropy and
repetition with sample- / token-level loss, Fig. 5 accuracy and entropy without / with overlong filtering, Fig. 6
accuracy without / with dynamic sampling against steps and against responses generated. Finished runs are kept:
running the command again reuses them and resumes an interrupted one from its last checkpoint.

Figures, per row, over seeds (seeds are paired: seed s of every row starts from the same model and reads the same
prompt order with the same sampling seed):
  val acc            held-out validation accuracy (mean@k, ``rollout.val_kwargs``) at the last step: mean ± std
  vs row above       the mean of the per-seed differences to the row before and its 95% t-interval over seeds
                     (t quantile from scipy when installed, else the table ``bench.common.T_975``)
  steps to target    first validation step at or above the target accuracy: the median over seeds, a seed that
                     never reaches it counting as never (so "-" when most seeds do not)
  responses to tgt   responses generated up to that step (dynamic sampling generates more per step): median
  final entropy      actor/entropy (mean per-token entropy of the trained responses) over the last 5 steps
  final length       response_length/mean over the last 5 steps
  repetition         response/repeat_ngram_frac (responses repeating a 4-gram) over the last 5 steps
  truncated          dapo/overlong_frac, the share of trained responses cut at the length limit, over all steps
The target (``--target``) defaults to the start accuracy plus 0.8 x the best row's gain (its mean final accuracy
less the start), a level the best row reaches late in the budget, so that the steps to reach it tell rows apart.

Verdicts (``verdicts``): for each technique, its paired difference to the row before on accuracy and on the
mechanism the paper names (``MECHANISMS``: entropy for Clip-Higher; repetition, length and entropy for the
token-level loss; accuracy drawdown for overlong filtering; truncation for the soft punishment; steps to target
for dynamic sampling, a seed that never reaches it counting as one step past the budget). "shown" when the
interval lies wholly on the paper's side of 0, "not shown" when it includes 0, "opposite" when wholly on the other,
"too few seeds" below 3 paired seeds (``--quick``'s 2 give intervals, no verdicts).

Run: python -m bench.ablation [--config-name NAME] [--quick] [--device cuda] [--seeds N] [--jobs N] [--json PATH]
                              [--out DIR] [key=value ...]
Presets (``PRESETS``, a list of overrides each): default 5 seeds x 6 rows of 60 steps, as many runs at a time as
CPUs, one torch thread each (docs/ablation.md: 49 minutes on 2 cores, plus a one-time 7-minute warm-up
of the start model when it is not cached); ``--quick`` 2 seeds, 8 steps, validation on 64 problems every 4 steps;
``--device cuda`` sets ``embedded.device=cuda`` and, unless ``--quick``, the larger "cuda" preset. The presets apply
to any ``--config-name`` unchanged.
``key=value`` overrides (verl's names) apply to every run, after the preset's and the row's own.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from bench.common import mean_interval, parser, print_table, t_quantile_975, write_json

CONFIG_NAME = "ablation_long"  # --config-name ablation: the shorter 3-digit setting it composes
ACTOR = "actor_rollout_ref.actor"
# The paper's Table 1 (AIME 2024 avg@32, Qwen2.5-32B), for the comparison column.
PAPER_AIME = (30, 36, 38, 41, 42, 50)
NAIVE_GRPO = {
    "dapo.overlong_filter": False,
    f"{ACTOR}.clip_ratio_high": 0.2,
    "reward.reward_kwargs.overlong_buffer_cfg.enable": False,
    f"{ACTOR}.loss_agg_mode": "seq-mean-token-mean",
    "algorithm.filter_groups.enable": False,
}
TECHNIQUES = (  # (row name, the override that switches the technique on), in the paper's order
    ("+ overlong filtering", {"dapo.overlong_filter": True}),
    ("+ clip-higher", {f"{ACTOR}.clip_ratio_high": 0.28}),
    ("+ soft overlong punishment", {"reward.reward_kwargs.overlong_buffer_cfg.enable": True}),
    ("+ token-level loss", {f"{ACTOR}.loss_agg_mode": "token-mean"}),
    ("+ dynamic sampling (DAPO)", {"algorithm.filter_groups.enable": True}),
)
# Presets: (seeds, runs at a time, overrides applied to every run before the command line's). A task or scale
# change is a list of overrides here; --device cuda picks "cuda" (unless --quick) and adds embedded.device=cuda.
PRESETS = {
    "default": {"seeds": 5, "jobs": os.cpu_count() or 1, "overrides": []},
    "quick": {
        "seeds": 2,
        "jobs": os.cpu_count() or 1,
        "overrides": [
            "trainer.total_training_steps=8",
            "trainer.test_freq=4",
            "trainer.save_freq=4",
            "data.val_max_samples=64",
        ],
    },
    # a lent GPU: a larger model and batch, more steps; several runs share the device
    "cuda": {
        "seeds": 5,
        "jobs": 6,
        "overrides": [
            "embedded.num_threads=2",
            "embedded.model.hidden_size=256",
            "embedded.model.intermediate_size=1024",
            "embedded.model.num_hidden_layers=6",
            "data.train_batch_size=32",
            "data.gen_batch_size=48",
            "trainer.total_training_steps=80",
        ],
    },
}
DEVICE_KEY = "embedded.device"  # the embedded engine's device knob (verl's trainer.device is unused by it)
MIN_VERDICT_SEEDS = 3  # fewer paired seeds give no verdict: with 2, two equal differences (validation accuracy
# moves in steps of 1/(problems x k)) make a zero-width interval that would read as "shown"
# What each technique should do in the paper, as (figure key, sign of the paired difference to the row before:
# +1 should rise, -1 should fall; what it is; the paper's claim). Every technique is also checked on accuracy
# (ACCURACY_CHECK); these are the mechanisms. The verdicts are computed from them (``verdicts``), never written.
ACCURACY_CHECK = ("val_acc", +1, "final validation accuracy", "Table 1")
MECHANISMS = {
    "+ overlong filtering": [("acc_drawdown", -1, "validation-accuracy drawdown", "Fig. 5: training is stabler")],
    "+ clip-higher": [("final_entropy", +1, "final entropy", "Fig. 2b: entropy does not collapse")],
    "+ soft overlong punishment": [("truncated_frac", -1, "truncated share", "§3.4: fewer overlong samples")],
    "+ token-level loss": [
        ("final_repeat", -1, "repetition rate", "Fig. 4: long repetitive samples are penalised"),
        ("final_response_length", -1, "final length", "Fig. 4: no unhealthy length growth"),
        ("final_entropy", -1, "final entropy", "Fig. 4: no unhealthy entropy growth"),
    ],
    "+ dynamic sampling (DAPO)": [("steps_to_target_censored", -1, "steps to target", "Fig. 6: fewer steps")],
}
# The paper's figures: (title, the two rows compared, panels); a panel is a curve name of CURVES, or
# "accuracy_vs_responses" (Fig. 6 against generated responses instead of steps).
PAPER_FIGURES = {
    "fig2b_clip_higher.png": (
        "Fig. 2b: entropy with vs without Clip-Higher",
        ("+ overlong filtering", "+ clip-higher"),
        ("entropy",),
    ),
    "fig4_token_level_loss.png": (
        "Fig. 4: sample- vs token-level loss",
        ("+ soft overlong punishment", "+ token-level loss"),
        ("response_length", "entropy", "repetition"),
    ),
    "fig5_overlong_filtering.png": (
        "Fig. 5: with vs without overlong filtering",
        ("naive GRPO", "+ overlong filtering"),
        ("accuracy", "entropy"),
    ),
    "fig6_dynamic_sampling.png": (
        "Fig. 6: with vs without dynamic sampling",
        ("+ token-level loss", "+ dynamic sampling (DAPO)"),
        ("accuracy", "accuracy_vs_responses"),
    ),
}
TARGET_FRACTION = 0.8  # default target: start + 0.8 x the best row's mean gain
TAIL_STEPS = 5  # final entropy / length: mean over this many last steps
VAL_PREFIX = "val-core/"


def rows() -> list[tuple[str, dict]]:
    """The six rows of Table 1: (name, overrides), each the previous one plus one technique."""
    out = [("naive GRPO", dict(NAIVE_GRPO))]
    for name, switch in TECHNIQUES:
        out.append((name, {**out[-1][1], **switch}))
    return out


def slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name.lower().removeprefix("+ ")).strip("_").replace("__", "_")


def _value(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def run_overrides(row: dict, seed: int, run_dir: Path, extra: list[str]) -> list[str]:
    """The ``dapo-train`` overrides of one (row, seed) run."""
    return [
        *(f"{k}={_value(v)}" for k, v in row.items()),
        f"embedded.seed={seed}",  # the RL sampling
        f"data.seed={seed}",  # the prompt order (configs/embedded.yaml fixes it at 0 for every run otherwise)
        f"trainer.default_local_dir={run_dir}",
        f"trainer.experiment_name={run_dir.parent.name}-{run_dir.name}",
        "embedded.progress_bar=false",
        *extra,
    ]


# ---------------------------------------------------------------------------------------------------- running


def _compose(overrides: list[str], config_name: str = CONFIG_NAME):
    from recipe.config import compose

    return compose(overrides, config_name)


def prepare_start_model(extra: list[str], config_name: str = CONFIG_NAME) -> None:
    """Build the task files and the warmed-up start model once, before the parallel runs (they all reuse it)."""
    import torch

    from recipe.common.warmup import task_files, warm_model
    from recipe.embedded.config import read_config

    c = read_config(_compose(extra, config_name))
    if c.model.path is None:
        torch.set_num_threads(c.embedded.num_threads or torch.get_num_threads())
        cuda = c.embedded.device == "cuda" or (c.embedded.device == "auto" and torch.cuda.is_available())
        warm_model(
            c.embedded.cache_dir,
            c.embedded.task,
            c.embedded.tiny_model,
            c.embedded.warmup,
            device=torch.device("cuda" if cuda else "cpu"),
        )
    elif c.data.train_files is None or c.data.val_files is None:
        task_files(c.embedded.cache_dir, c.embedded.task)


def _finished(run_dir: Path) -> bool:
    return (run_dir / "ablation_done.json").is_file()


def run_one(
    name: str, overrides: list[str], run_dir: Path, config_name: str = CONFIG_NAME
) -> tuple[str, Path, int, float]:
    """One ``dapo-train`` run in its own process, its output in ``run_dir/log.txt``; (name, dir, rc, seconds)."""
    start = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_SILENT": "true"}
    with open(run_dir / "log.txt", "a") as log:
        rc = subprocess.run(
            [sys.executable, "-m", "recipe.cli", "--config-name", config_name, *overrides],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        ).returncode
    seconds = time.perf_counter() - start
    if rc == 0:
        (run_dir / "ablation_done.json").write_text(json.dumps({"overrides": overrides, "seconds": seconds}) + "\n")
    return name, run_dir, rc, seconds


def run_all(plan: list[tuple[str, int, list[str], Path]], jobs: int, config_name: str = CONFIG_NAME) -> list[str]:
    """Run every unfinished (row, seed) of ``plan``, ``jobs`` at a time; return the failures' descriptions."""
    todo = [p for p in plan if not _finished(p[3])]
    if len(todo) < len(plan):
        print(f"reusing {len(plan) - len(todo)} finished run(s) under {plan[0][3].parents[1]}")
    failures, start = [], time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [
            pool.submit(run_one, f"{name} / seed {seed}", overrides, run_dir, config_name)
            for name, seed, overrides, run_dir in todo
        ]
        for done, future in enumerate(as_completed(futures), 1):
            name, run_dir, rc, seconds = future.result()
            status = "ok" if rc == 0 else f"FAILED (exit {rc}; see {run_dir / 'log.txt'})"
            final = _final_val(run_dir)
            acc = f", val acc {final:.3f}" if final is not None else ""
            print(
                f"[{done}/{len(todo)}] {name}: {status} in {seconds:.0f} s{acc}  "
                f"(elapsed {time.perf_counter() - start:.0f} s)",
                flush=True,
            )
            if rc != 0:
                tail = (run_dir / "log.txt").read_text().strip().splitlines()[-5:]
                failures.append(f"{name}: exit {rc}\n    " + "\n    ".join(tail))
    return failures


# ---------------------------------------------------------------------------------------------------- figures


def _records(run_dir: Path) -> list[dict]:
    from recipe.embedded.monitor import read_metrics

    return read_metrics(run_dir)


def _val_key(records: list[dict]) -> str | None:
    keys = sorted({k for r in records for k in r if k.startswith(VAL_PREFIX) and "/acc/" in k})
    return keys[0] if keys else None


def _val_curve(records: list[dict]) -> list[tuple[int, float]]:
    key = _val_key(records)
    return [(r["step"], r[key]) for r in records if key and r.get(key) is not None]


def _final_val(run_dir: Path) -> float | None:
    curve = _val_curve(_records(run_dir))
    return curve[-1][1] if curve else None


def _series(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in records if r.get("step", 0) > 0 and r.get(key) is not None]


def _train_records(records: list[dict]) -> list[dict]:
    """A run's training-step records (validation-only records carry no ``actor/entropy``), in step order."""
    return sorted((r for r in records if r.get("step", 0) > 0 and "actor/entropy" in r), key=lambda r: r["step"])


def _generated(record: dict, train_batch_size: int, n: int) -> float:
    """Responses generated in a training step (rounds x prompts x n)."""
    return record.get("dapo/generated_prompts", train_batch_size) * n


def _median_or_none(values: list[float]) -> float | None:
    """Median where ``inf`` means never; None when the median itself is never."""
    if not values:
        return None
    m = statistics.median(sorted(values))
    return None if math.isinf(m) else m


def _fmean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else math.nan


CURVES = {  # name: (axis label, the per-step series of one run's records)
    "accuracy": ("held-out validation accuracy", _val_curve),
    "entropy": ("actor/entropy (trained responses)", lambda r: _series(r, "actor/entropy")),
    "response_length": ("response_length/mean (tokens)", lambda r: _series(r, "response_length/mean")),
    "repetition": ("response/repeat_ngram_frac", lambda r: _series(r, "response/repeat_ngram_frac")),
    "truncation": ("dapo/overlong_frac (trained responses)", lambda r: _series(r, "dapo/overlong_frac")),
}


def _mean_curve(seeds: list[list[dict]], curve) -> dict[str, list[float]]:
    """Mean, lowest and highest over seeds at the steps every seed has: {"steps", "mean", "min", "max"}."""
    curves = [dict(curve(r)) for r in seeds]
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    values = [[c[s] for c in curves] for s in steps]  # [steps][seeds]
    return {
        "steps": steps,
        "mean": [statistics.fmean(v) for v in values],
        "min": [min(v) for v in values],
        "max": [max(v) for v in values],
    }


def _drawdown(curve: list[tuple[int, float]]) -> float:
    """Sum of the falls between consecutive validation points: 0 for a curve that never goes down."""
    return sum(max(0.0, a - b) for (_, a), (_, b) in zip(curve, curve[1:]))


def summarise(results: dict[str, list[list[dict]]], target: float | None, train_batch_size: int, n: int) -> dict:
    """The figures of every row from its seeds' metric records (``results[row] = [records of seed 0, ...]``, the
    same seed at the same index in every row). Per seed lists are kept (``per_seed``) for the paired differences."""
    finals = {name: [(_val_curve(r) or [(0, math.nan)])[-1][1] for r in seeds] for name, seeds in results.items()}
    start_accs = [c[0][1] for seeds in results.values() for r in seeds if (c := _val_curve(r)) and c[0][0] == 0]
    start_acc = statistics.fmean(start_accs) if start_accs else math.nan
    if target is None:
        best = max(statistics.fmean(v) for v in finals.values())
        target = start_acc + TARGET_FRACTION * (best - start_acc)
    out_rows = []
    for (name, seeds), paper in zip(results.items(), PAPER_AIME):
        per_seed = {
            k: []
            for k in (
                "val_acc",
                "steps_to_target",
                "steps_to_target_censored",
                "responses_to_target",
                "final_entropy",
                "final_response_length",
                "final_repeat",
                "truncated_frac",
                "acc_drawdown",
                "generated_responses",
            )
        }
        for records in seeds:
            train = _train_records(records)
            last_step = max((r["step"] for r in train), default=0)
            hit = next((s for s, v in _val_curve(records) if v >= target), None)
            per_seed["steps_to_target"].append(math.inf if hit is None else hit)
            # never reaching counts as one step past the budget: a lower bound of the true steps
            per_seed["steps_to_target_censored"].append(last_step + 1 if hit is None else hit)
            per_seed["responses_to_target"].append(
                math.inf if hit is None else sum(_generated(r, train_batch_size, n) for r in train if r["step"] <= hit)
            )
            tail = train[-TAIL_STEPS:]
            per_seed["final_entropy"].append(_fmean(r["actor/entropy"] for r in tail))
            per_seed["final_response_length"].append(_fmean(r["response_length/mean"] for r in tail))
            per_seed["final_repeat"].append(
                _fmean(r["response/repeat_ngram_frac"] for r in tail if "response/repeat_ngram_frac" in r)
            )
            per_seed["truncated_frac"].append(_fmean(r.get("dapo/overlong_frac", 0.0) for r in train))
            per_seed["acc_drawdown"].append(_drawdown(_val_curve(records)))
            per_seed["generated_responses"].append(sum(_generated(r, train_batch_size, n) for r in train))
        accs = finals[name]
        per_seed["val_acc"] = accs
        steps_to = per_seed["steps_to_target"]
        out_rows.append(
            {
                "name": name,
                "val_acc_mean": statistics.fmean(accs),
                "val_acc_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                "val_acc_per_seed": accs,
                "final_entropy": _fmean(per_seed["final_entropy"]),
                "steps_to_target": _median_or_none(steps_to),
                "seeds_reaching_target": sum(not math.isinf(s) for s in steps_to),
                "responses_to_target": _median_or_none(per_seed["responses_to_target"]),
                "final_response_length": _fmean(per_seed["final_response_length"]),
                "final_repeat": _fmean(per_seed["final_repeat"]),
                "truncated_frac": _fmean(per_seed["truncated_frac"]),
                "acc_drawdown": _fmean(per_seed["acc_drawdown"]),
                "generated_responses": _fmean(per_seed["generated_responses"]),
                "paper_aime_avg32": paper,
                "per_seed": {k: [None if math.isinf(v) else v for v in vs] for k, vs in per_seed.items()},
                "curves": {k: _mean_curve(seeds, curve) for k, (_, curve) in CURVES.items()},
            }
        )
    for before, after in zip(out_rows, out_rows[1:]):
        after["vs_previous"] = {
            key: paired_interval(after["per_seed"][key], before["per_seed"][key])
            for key in (
                "val_acc",
                "final_entropy",
                "final_response_length",
                "final_repeat",
                "truncated_frac",
                "acc_drawdown",
                "steps_to_target_censored",
            )
        }
    return {"target": target, "start_acc": start_acc, "rows": out_rows}


# ---------------------------------------------------------------------------------------------------- statistics


def paired_interval(after: list[float | None], before: list[float | None]) -> dict:
    """Mean of the per-seed differences ``after - before`` and its 95% t-interval over seeds:
    mean ± t_{0.975, S-1} x sd / sqrt(S). Seeds missing from either side (None, NaN) are left out; with fewer than
    two seeds left the interval is undefined (None)."""
    diffs = [
        a - b
        for a, b in zip(after, before)
        if a is not None and b is not None and not math.isnan(a) and not math.isnan(b)
    ]
    if not diffs:
        return {"mean": None, "low": None, "high": None, "seeds": 0}
    mean, low, high = mean_interval(diffs, t_quantile_975)
    return {"mean": mean, "low": low, "high": high, "seeds": len(diffs)}


def direction(interval: dict, sign: int) -> str:
    """Whether a paired difference shows the paper's direction (``sign`` +1: should rise, -1: should fall):
    "shown" when the whole interval is on that side of 0, "opposite" when it is wholly on the other side, "not
    shown" when it includes 0, "too few seeds" with fewer than ``MIN_VERDICT_SEEDS`` paired seeds."""
    if interval["seeds"] < MIN_VERDICT_SEEDS or interval["low"] is None:
        return "too few seeds"
    low, high = sorted((sign * interval["low"], sign * interval["high"]))
    if low > 0:
        return "shown"
    if high < 0:
        return "opposite"
    return "not shown"


def _fmt_interval(interval: dict, digits: int = 3) -> str:
    if interval["mean"] is None:
        return "-"
    text = f"{interval['mean']:+.{digits}f}"
    if interval["low"] is not None:
        text += f" [{interval['low']:+.{digits}f}, {interval['high']:+.{digits}f}]"
    return text


def verdicts(figures: dict) -> list[dict]:
    """For each technique (every row after the first): accuracy and each mechanism of ``MECHANISMS`` against the
    row before, and an overall word: "shown" (some check in the paper's direction, none opposite), "opposite",
    "mixed" (both), "not shown" (neither), "too few seeds" (no check had ``MIN_VERDICT_SEEDS``)."""
    out = []
    for row in figures["rows"][1:]:
        paired = row["vs_previous"]
        checks = [ACCURACY_CHECK, *MECHANISMS.get(row["name"], [])]
        results = [
            {
                "key": key,
                "what": what,
                "why": why,
                "sign": sign,
                "interval": paired[key],
                "result": direction(paired[key], sign),
            }
            for key, sign, what, why in checks
        ]
        found = {r["result"] for r in results}
        overall = (
            "mixed"
            if {"shown", "opposite"} <= found
            else "shown"
            if "shown" in found
            else "opposite"
            if "opposite" in found
            else "too few seeds"
            if found == {"too few seeds"}
            else "not shown"
        )
        censored = (
            sum(v is None for v in row["per_seed"]["steps_to_target"])
            if any(r["key"] == "steps_to_target_censored" for r in results)
            else 0
        )
        out.append({"technique": row["name"], "overall": overall, "checks": results, "censored_seeds": censored})
    return out


def verdict_lines(verdict_list: list[dict]) -> list[str]:
    """Markdown: one paragraph per technique, every check with its difference, interval and result."""
    lines = []
    for v in verdict_list:
        parts = []
        for c in v["checks"]:
            why = " (the interval includes 0)" if c["result"] == "not shown" else ""
            want = "should rise" if c["sign"] > 0 else "should fall"
            parts.append(f"{c['what']} {want} ({c['why']}): {_fmt_interval(c['interval'])}, {c['result']}{why}")
        note = (
            f" ({v['censored_seeds']} seed(s) never reached the target: counted as one step past the budget)"
            if v["censored_seeds"]
            else ""
        )
        lines.append(f"- **{v['technique']}: {v['overall']}.** " + "; ".join(parts) + note + ".")
    return lines


# ---------------------------------------------------------------------------------------------------- report


def table(figures: dict, seeds: int, steps: int) -> tuple[list[str], list[list[object]]]:
    headers = [
        "row",
        f"val acc @ step {steps} (mean ± std, {seeds} seed{'s' if seeds > 1 else ''})",
        "vs row above (paired, 95% CI)",
        "steps to target",
        "responses to target",
        "final entropy",
        "final length",
        "repetition",
        "truncated",
        "paper (AIME avg@32)",
    ]
    body = []
    for r in figures["rows"]:
        reach = "-" if r["steps_to_target"] is None else f"{r['steps_to_target']:.0f}"
        responses = "-" if r["responses_to_target"] is None else f"{r['responses_to_target']:.0f}"
        if seeds > 1:
            reach += f" ({r['seeds_reaching_target']}/{seeds})"
        diff = _fmt_interval(r["vs_previous"]["val_acc"]) if "vs_previous" in r else ""
        repeat = "-" if math.isnan(r["final_repeat"]) else f"{100 * r['final_repeat']:.1f}%"
        body.append(
            [
                r["name"],
                f"{r['val_acc_mean']:.3f} ± {r['val_acc_std']:.3f}",
                diff,
                reach,
                responses,
                f"{r['final_entropy']:.3f}",
                f"{r['final_response_length']:.1f}",
                repeat,
                f"{100 * r['truncated_frac']:.1f}%",
                r["paper_aime_avg32"],
            ]
        )
    return headers, body


def markdown_table(headers: list[str], body: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def _responses_curve(records: list[dict], train_batch_size: int, n: int) -> list[tuple[float, float]]:
    """Validation accuracy against the responses generated up to its step."""
    generated, total = {0: 0.0}, 0.0
    for r in _train_records(records):
        total += _generated(r, train_batch_size, n)
        generated[r["step"]] = total
    return [(generated[s], v) for s, v in _val_curve(records) if s in generated]


def _draw(ax, results: dict[str, list[list[dict]]], names, panel: str, train_batch_size: int, n: int) -> None:
    """One panel: each row of ``names`` as its mean over seeds, shaded from the lowest to the highest seed."""
    import numpy as np

    for name in names:
        seeds = results[name]
        if panel == "accuracy_vs_responses":
            curves = [_responses_curve(r, train_batch_size, n) for r in seeds]
            size = min((len(c) for c in curves), default=0)
            if not size:
                continue
            x = np.array([[c[i][0] for i in range(size)] for c in curves]).mean(0)  # mean responses at each point
            values = np.array([[c[i][1] for i in range(size)] for c in curves])  # [seeds, points]
        else:
            curve = _mean_curve(seeds, CURVES[panel][1])
            if not curve["steps"]:
                continue
            x = np.array(curve["steps"])
            values = np.array([[dict(CURVES[panel][1](r))[s] for s in curve["steps"]] for r in seeds])
        (line,) = ax.plot(x, values.mean(0), label=name, marker="o" if "accuracy" in panel else None, markersize=3)
        if len(seeds) > 1:
            ax.fill_between(x, values.min(0), values.max(0), color=line.get_color(), alpha=0.12)
    ax.set_title(CURVES[panel][0] if panel in CURVES else "held-out validation accuracy", fontsize=9)
    ax.set_xlabel("responses generated" if panel == "accuracy_vs_responses" else "training step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def write_plots(
    results: dict[str, list[list[dict]]], out_dir: Path, train_batch_size: int = 0, n: int = 1
) -> list[Path]:
    """Every row on one plot per curve (accuracy, entropy, length, repetition, truncation against steps), then the
    paper's figures (``PAPER_FIGURES``): two rows side by side, one panel per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {f"{panel}.png": (None, tuple(results), (panel,)) for panel in CURVES}
    figures.update({k: v for k, v in PAPER_FIGURES.items() if all(name in results for name in v[1])})
    written = []
    for file_name, (title, names, panels) in figures.items():
        fig, axes = plt.subplots(
            1, len(panels), figsize=(7 if len(panels) == 1 else 4.5 * len(panels), 4), squeeze=False
        )
        for ax, panel in zip(axes[0], panels):
            _draw(ax, results, names, panel, train_batch_size, n)
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        path = out_dir / file_name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write_report(
    out: Path, figures: dict, headers, body, command: str, plots: list[Path], verdict_list: list[dict] | None = None
) -> Path:
    text = [
        "# DAPO ablation on the embedded engine",
        "",
        f"Command: `{command}`",
        "",
        f"Start accuracy (step 0, held-out): {figures['start_acc']:.3f}. Target accuracy: {figures['target']:.3f}.",
        "",
        markdown_table(headers, body),
        "",
        "Paired: the mean over seeds of (this row - the row above) with the same seed, and its 95% t-interval.",
        "Final entropy, length and repetition: the last 5 steps; truncated: over all steps.",
        "",
    ]
    if verdict_list:
        text += [
            "## Does each technique show its effect in the paper's direction?",
            "",
            "Computed from the paired differences to the row before (95% t-intervals over seeds): a check is "
            "shown when its whole interval lies on the paper's side of 0.",
            "",
            *verdict_lines(verdict_list),
            "",
        ]
    text += [*(f"![{p.stem}]({p.relative_to(out)})" for p in plots), ""]
    path = out / "report.md"
    path.write_text("\n".join(text))
    return path


# ---------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__.split("\n\n")[0], repeats=False)
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run (verl's names)")
    p.add_argument("--quick", action="store_true", help="2 seeds, 8 steps, 64 validation problems: minutes")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help=f"{DEVICE_KEY} of every run; cuda also picks the larger 'cuda' preset (unless --quick)",
    )
    p.add_argument("--seeds", type=int, default=None, help="seeds per row (default 5; --quick 2)")
    p.add_argument("--jobs", type=int, default=None, help="runs at a time (default: the CPU count; cuda: 6)")
    p.add_argument("--out", type=Path, default=Path("bench/results/ablation"), help="run directories and report")
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="target validation accuracy (default: start + 0.8 x the best row's gain)",
    )
    p.add_argument("--fresh", action="store_true", help="delete earlier runs under --out instead of reusing them")
    p.add_argument("--print-commands", action="store_true", help="print each run's dapo-train command and exit")
    p.add_argument(
        "--config-name",
        default=CONFIG_NAME,
        help="the shared setting under configs/ (default: ablation_long; ablation: the 3-digit task)",
    )
    args = p.parse_args(argv)

    preset = PRESETS["quick" if args.quick else "cuda" if args.device == "cuda" else "default"]
    seeds = args.seeds or preset["seeds"]
    jobs = args.jobs or preset["jobs"]
    if seeds < 1:
        p.error("--seeds must be >= 1")
    device = [f"{DEVICE_KEY}={args.device}"] if args.device else []
    extra = [*preset["overrides"], *device, *args.overrides]
    out = args.out.resolve()
    try:
        cfg = _compose(extra, args.config_name)  # fails early on a misspelt key, before anything runs
    except Exception as err:  # noqa: BLE001 - Hydra's and OmegaConf's errors name the key
        print(f"bench.ablation: error: {str(err).strip()}", file=sys.stderr)
        return 2
    from dapo.settings import select

    steps = int(select(cfg, "trainer.total_training_steps"))
    train_batch_size = int(cfg.data.train_batch_size)
    n = int(cfg.actor_rollout_ref.rollout.n)

    plan = []
    for name, row in rows():
        for seed in range(seeds):
            run_dir = out / slug(name) / f"seed{seed}"
            plan.append((name, seed, run_overrides(row, seed, run_dir, extra), run_dir))
    if args.print_commands:
        for name, seed, overrides, _ in plan:
            print(f"# {name}, seed {seed}\ndapo-train --config-name {args.config_name} {' '.join(overrides)}")
        return 0
    if args.fresh and out.exists():
        shutil.rmtree(out)

    print(f"ablation: {len(rows())} rows x {seeds} seeds x {steps} steps, {jobs} at a time, under {out}")
    prepare_start_model(extra, args.config_name)
    failures = run_all(plan, jobs, args.config_name)
    if failures:
        print("runs failed:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1

    results = {name: [] for name, _ in rows()}
    for name, _, _, run_dir in plan:
        results[name].append(_records(run_dir))
    figures = summarise(results, args.target, train_batch_size, n)
    headers, body = table(figures, seeds, steps)
    verdict_list = verdicts(figures)
    print(f"\nstart accuracy {figures['start_acc']:.3f}, target {figures['target']:.3f}")
    print_table(headers, body)
    print("\n" + "\n".join(verdict_lines(verdict_list)))
    plots = write_plots(results, out / "plots", train_batch_size, n)
    command = "python -m bench.ablation " + " ".join(
        [
            *([f"--config-name {args.config_name}"] if args.config_name != CONFIG_NAME else []),
            *(["--quick"] if args.quick else []),
            *([f"--device {args.device}"] if args.device else []),
            *([f"--seeds {seeds}"] if args.seeds else []),
            *args.overrides,
        ]
    )
    report = write_report(out, figures, headers, body, command.strip(), plots, verdict_list)
    print(f"report: {report}")
    write_json(
        args.json, {**figures, "verdicts": verdict_list, "seeds": seeds, "steps": steps, "command": command.strip()}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
