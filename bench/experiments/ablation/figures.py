"""The ablation's figures from the runs' ``metrics.jsonl``: per seed and per row (final accuracy, steps and responses
to the target, entropy, length, repetition, truncation) and the mean curves."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from bench.experiments.ablation.plan import TAIL_STEPS, TARGET_FRACTION, VAL_PREFIX
from bench.experiments.ablation.stats import interval, paired_interval


def run_records(run_dir: Path) -> list[dict]:
    from recipe.embedded.monitor import read_metrics

    return read_metrics(run_dir)


def _val_key(records: list[dict]) -> str | None:
    keys = sorted({k for r in records for k in r if k.startswith(VAL_PREFIX) and "/acc/" in k})
    return keys[0] if keys else None


def val_curve(records: list[dict]) -> list[tuple[int, float]]:
    key = _val_key(records)
    return [(r["step"], r[key]) for r in records if key and r.get(key) is not None]


def final_val(run_dir: Path) -> float | None:
    curve = val_curve(run_records(run_dir))
    return curve[-1][1] if curve else None


def _series(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in records if r.get("step", 0) > 0 and r.get(key) is not None]


def train_records(records: list[dict]) -> list[dict]:
    """A run's training-step records (validation-only records carry no ``actor/entropy``), in step order."""
    return sorted((r for r in records if r.get("step", 0) > 0 and "actor/entropy" in r), key=lambda r: r["step"])


def responses_generated(record: dict, train_batch_size: int, n: int) -> float:
    """Responses generated in a training step (rounds x prompts x n)."""
    return record.get("dapo/generated_prompts", train_batch_size) * n


def responses_curve(records: list[dict], train_batch_size: int, n: int) -> list[tuple[float, float]]:
    """Validation accuracy against the responses generated up to its step: [(responses, accuracy)]."""
    generated, total = {0: 0.0}, 0.0
    for r in train_records(records):
        total += responses_generated(r, train_batch_size, n)
        generated[r["step"]] = total
    return [(generated[s], v) for s, v in val_curve(records) if s in generated]


def _accuracy_within(curve: list[tuple[float, float]], budget: float) -> float | None:
    """The accuracy of the last validation whose responses generated are within ``budget``."""
    within = [acc for responses, acc in curve if responses <= budget]
    return within[-1] if within else None


def matched_differences(with_seeds, without_seeds, train_batch_size: int, n: int) -> list[float | None]:
    """Per seed, compute-matched: each row's accuracy at its last validation within the responses the cheaper of
    the two generated in all, the row with the technique less the row without (dynamic sampling generates more a
    step, so a per-step comparison flatters it)."""
    out = []
    for with_records, without_records in zip(with_seeds, without_seeds):
        a, b = responses_curve(with_records, train_batch_size, n), responses_curve(without_records, train_batch_size, n)
        if not a or not b:
            out.append(None)
            continue
        budget = min(a[-1][0], b[-1][0])
        x, y = _accuracy_within(a, budget), _accuracy_within(b, budget)
        out.append(None if x is None or y is None else x - y)
    return out


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
    "accuracy": ("held-out validation accuracy", val_curve),
    "entropy": ("actor/entropy (trained responses)", lambda r: _series(r, "actor/entropy")),
    "response_length": ("response_length/mean (tokens)", lambda r: _series(r, "response_length/mean")),
    "repetition": ("response/repeat_ngram_frac", lambda r: _series(r, "response/repeat_ngram_frac")),
    "truncation": ("dapo/overlong_frac (trained responses)", lambda r: _series(r, "dapo/overlong_frac")),
}


def mean_curve(seeds: list[list[dict]], curve) -> dict[str, list[float]]:
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


PAIRED_KEYS = (  # the per-seed figures each technique's paired difference is taken of
    "val_acc",
    "final_entropy",
    "final_response_length",
    "final_repeat",
    "truncated_frac",
    "acc_drawdown",
    "steps_to_target_censored",
)


def summarise(
    results: dict[str, list[list[dict]]],
    target: float | None,
    train_batch_size: int,
    n: int,
    comparisons: list[tuple[str, str, str]],
    paper: dict[str, object] | None = None,
    evals: dict | None = None,
) -> dict:
    """The figures of every row from its seeds' metric records (``results[row] = [records of seed 0, ...]``, the
    same seed at the same index in every row), and of each technique of ``comparisons`` (technique, the row with
    it, the row without) its paired differences over seeds, with less without (``effects``). Per seed lists are
    kept (``per_seed``). ``paper``: the paper's figure of each row, where it has one. ``evals``: the final
    checkpoints' accuracy with several answers a problem (``run.evaluate_runs``), paired like the rest as
    ``eval_acc``."""
    finals = {name: [(val_curve(r) or [(0, math.nan)])[-1][1] for r in seeds] for name, seeds in results.items()}
    start_accs = [c[0][1] for seeds in results.values() for r in seeds if (c := val_curve(r)) and c[0][0] == 0]
    start_acc = statistics.fmean(start_accs) if start_accs else math.nan
    if target is None:
        best = max(statistics.fmean(v) for v in finals.values())
        target = start_acc + TARGET_FRACTION * (best - start_acc)
    out_rows = []
    for name, seeds in results.items():
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
                "step_seconds",
            )
        }
        for records in seeds:
            train = train_records(records)
            last_step = max((r["step"] for r in train), default=0)
            hit = next((s for s, v in val_curve(records) if v >= target), None)
            per_seed["steps_to_target"].append(math.inf if hit is None else hit)
            # never reaching counts as one step past the budget: a lower bound of the true steps
            per_seed["steps_to_target_censored"].append(last_step + 1 if hit is None else hit)
            per_seed["responses_to_target"].append(
                math.inf
                if hit is None
                else sum(responses_generated(r, train_batch_size, n) for r in train if r["step"] <= hit)
            )
            tail = train[-TAIL_STEPS:]
            per_seed["final_entropy"].append(_fmean(r["actor/entropy"] for r in tail))
            per_seed["final_response_length"].append(_fmean(r["response_length/mean"] for r in tail))
            per_seed["final_repeat"].append(
                _fmean(r["response/repeat_ngram_frac"] for r in tail if "response/repeat_ngram_frac" in r)
            )
            per_seed["truncated_frac"].append(_fmean(r.get("dapo/overlong_frac", 0.0) for r in train))
            per_seed["acc_drawdown"].append(_drawdown(val_curve(records)))
            per_seed["generated_responses"].append(sum(responses_generated(r, train_batch_size, n) for r in train))
            # each step's own time: a resumed run's replayed steps count once, a run that shared the cores counts long
            per_seed["step_seconds"].append(sum(r.get("timing_s/step", 0.0) for r in train))
        accs = finals[name]
        per_seed["val_acc"] = accs
        if evals is not None:
            per_seed["eval_acc"] = evals["rows"][name]
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
                "eval_acc_mean": None if evals is None else _fmean(v for v in evals["rows"][name] if v is not None),
                "paper_aime_avg32": (paper or {}).get(name),
                "per_seed": {k: [None if math.isinf(v) else v for v in vs] for k, vs in per_seed.items()},
                "curves": {k: mean_curve(seeds, curve) for k, (_, curve) in CURVES.items()},
            }
        )
    by_name = {row["name"]: row for row in out_rows}
    effects = []
    for technique, with_row, without_row in comparisons:
        a, b = by_name[with_row]["per_seed"], by_name[without_row]["per_seed"]
        paired = {
            key: paired_interval(a[key], b[key]) for key in PAIRED_KEYS + (() if evals is None else ("eval_acc",))
        }
        matched = matched_differences(results[with_row], results[without_row], train_batch_size, n)
        paired["val_acc_matched"] = interval(matched)
        effects.append({"technique": technique, "with": with_row, "without": without_row, "paired": paired})
    start_eval = evals["start"] if evals is not None else None
    return {
        "step_hours": sum(s for row in out_rows for s in row["per_seed"]["step_seconds"]) / 3600,
        "target": target,
        "start_acc": start_acc,
        "start_eval_acc": start_eval,
        "rows": out_rows,
        "effects": effects,
    }
