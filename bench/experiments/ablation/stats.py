"""The ablation's statistics: each technique's paired difference over seeds, the row with it less the row without it
(a t-interval, ``bench.common.mean_interval``), and the verdict on the mechanism the paper names."""

from __future__ import annotations

import math

from bench.common import mean_interval, t_quantile_975
from bench.experiments.ablation.plan import ACCURACY_CHECKS, EVAL_CHECK, MECHANISMS, MIN_VERDICT_SEEDS


def interval(values: list[float | None]) -> dict:
    """Mean of ``values`` and its 95% t-interval over seeds: mean ± t_{0.975, S-1} x sd / sqrt(S). Seeds missing
    (None, NaN) are left out; with fewer than two left the interval is undefined (None)."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return {"mean": None, "low": None, "high": None, "seeds": 0}
    mean, low, high = mean_interval(values, t_quantile_975)
    return {"mean": mean, "low": low, "high": high, "seeds": len(values)}


def paired_interval(after: list[float | None], before: list[float | None]) -> dict:
    """:func:`interval` of the per-seed differences ``after - before``; a seed missing from either side (None,
    NaN) is left out."""
    return interval([None if a is None or b is None else a - b for a, b in zip(after, before)])


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


def fmt_interval(interval: dict, digits: int = 3) -> str:
    if interval["mean"] is None:
        return "-"
    text = f"{interval['mean']:+.{digits}f}"
    if interval["low"] is not None:
        text += f" [{interval['low']:+.{digits}f}, {interval['high']:+.{digits}f}]"
    return text


def verdicts(figures: dict) -> list[dict]:
    """For each technique (``figures["effects"]``): accuracy (per step and compute-matched) and each mechanism of
    ``MECHANISMS``, the row with it against the row without, and an overall word: "shown" (some check in the
    paper's direction, none opposite), "opposite", "mixed" (both), "not shown" (neither), "too few seeds" (no check
    had ``MIN_VERDICT_SEEDS``)."""
    out = []
    rows = {row["name"]: row for row in figures["rows"]}
    for effect in figures["effects"]:
        paired = effect["paired"]
        key, sign, what, why = EVAL_CHECK
        evaluated = [(key, sign, what.format(k=figures.get("eval_k")), why)] if key in paired else []
        checks = [*evaluated, *ACCURACY_CHECKS, *MECHANISMS.get(effect["technique"], [])]
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
            sum(v is None for v in rows[effect["with"]]["per_seed"]["steps_to_target"])
            if any(r["key"] == "steps_to_target_censored" for r in results)
            else 0
        )
        out.append(
            {
                "technique": effect["technique"],
                "with": effect["with"],
                "without": effect["without"],
                "overall": overall,
                "checks": results,
                "censored_seeds": censored,
            }
        )
    return out


def verdict_lines(verdict_list: list[dict]) -> list[str]:
    """Markdown: one paragraph per technique, every check with its difference, interval and result."""
    lines = []
    for v in verdict_list:
        parts = []
        for c in v["checks"]:
            why = " (the interval includes 0)" if c["result"] == "not shown" else ""
            want = "should rise" if c["sign"] > 0 else "should fall"
            parts.append(f"{c['what']} {want} ({c['why']}): {fmt_interval(c['interval'])}, {c['result']}{why}")
        note = (
            f" ({v['censored_seeds']} seed(s) never reached the target: counted as one step past the budget)"
            if v["censored_seeds"]
            else ""
        )
        pair = f" ({v['with']} less {v['without']})"
        lines.append(f"- **{v['technique']}: {v['overall']}.**{pair} " + "; ".join(parts) + note + ".")
    return lines
