"""Scorer throughput: dapo.reward.compute_score against verl 0.9.1's math_dapo.compute_score.

Same inputs for both, timed interleaved in one run: CoT-like responses (about 1-6 kB of reasoning lines with
LaTeX) over the real AIME 2024 ground truths, ending in a correct answer in one of several surface forms, a
wrong one, a \\boxed{} answer without "Answer:", or nothing (truncated). Contenders:
  ours            the paper's scorer (default mode), normalisation cache warm as in training
  ours, cold      the same with the cache cleared before every pass over the inputs
  ours, boxed     boxed_fallback=True: verl's semantics
  verl            verl.utils.reward_score.math_dapo.compute_score(solution, ground_truth)
Agreement is exact equality of the returned dicts: default mode against the paper's scorer (the authors'
eval/math_dapo.py; verl's is_correct_minerva on the last 300 characters is that code), boxed mode against verl.
Run: python -m bench.micro.scorer [--json PATH] [--responses N]
"""

from __future__ import annotations

import random

from bench.common import REPO, parser, print_table, time_interleaved, write_json
from dapo import reward

AIME_PARQUET = REPO / "tests" / "data" / "aime-2024.parquet"
FALLBACK_TRUTHS = ["204", "25", "116", "33", "80", "699", "727", "236", "45", "540"]  # if the parquet is absent

REASONING_LINES = [
    "Let $n$ be the number of such integers; we count residues modulo $7$ first.",
    "By the AM-GM inequality, $\\frac{a+b}{2} \\ge \\sqrt{ab}$, with equality when $a = b$.",
    "Substituting $x = 3$ gives $f(3) = 27 - 9 + 2 = 20$, which is consistent with the bound.",
    "Wait, I should double-check the case $k = 0$: then the sum is empty and contributes nothing.",
    "So the area is $\\tfrac{1}{2} \\cdot 12 \\cdot 5 = 30$ and the inradius follows from $A = rs$.",
    "Hence $\\log_2(xy) = \\log_2 x + \\log_2 y = 5$, so $xy = 32$.",
    "The answer should be an integer between $0$ and $999$, as in every AIME problem.",
]


def load_truths() -> tuple[list[str], str]:
    if not AIME_PARQUET.exists():
        return FALLBACK_TRUTHS * 96, f"built-in list ({AIME_PARQUET} not found)"
    import pandas as pd

    frame = pd.read_parquet(AIME_PARQUET)
    return [row["ground_truth"] for row in frame["reward_model"]], f"{AIME_PARQUET.name} ({len(frame)} rows)"


def make_inputs(truths: list[str], n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    correct_forms = [
        "Answer: {a}",
        "Answer: ${a}$",
        "Answer: \\boxed{{{a}}}",
        "answer: {a}",
        "Answer: $\\boxed{{{a}}}$",
    ]
    inputs = []
    for i in range(n):
        truth = truths[i % len(truths)]
        body = "\n".join(rng.choice(REASONING_LINES) for _ in range(rng.randint(10, 60)))
        kind = rng.random()
        if kind < 0.45:  # correct, in one of several accepted forms
            ending = rng.choice(correct_forms).format(a=truth)
        elif kind < 0.85:  # wrong
            ending = f"Answer: {int(truth) + rng.randint(1, 50) if truth.isdigit() else 0}"
        elif kind < 0.95:  # boxed only: the paper scores -1, verl's fallback may score +1
            ending = f"Therefore the answer is $\\boxed{{{truth if rng.random() < 0.5 else '7'}}}$."
        else:  # truncated mid-reasoning
            ending = ""
        inputs.append((body + "\n\n" + ending, truth))
    return inputs


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--responses", type=int, default=3000, help="responses per pass")
    args = p.parse_args()

    from verl.utils.reward_score import math_dapo as verl_math_dapo

    truths, source = load_truths()
    inputs = make_inputs(truths, args.responses)

    def paper(solution: str, truth: str) -> dict:
        correct, pred = verl_math_dapo.is_correct_minerva(solution[-300:], truth)
        return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}

    ours_results = [reward.compute_score("math_dapo", s, t) for s, t in inputs]
    boxed_results = [reward.compute_score("math_dapo", s, t, boxed_fallback=True) for s, t in inputs]
    verl_results = [verl_math_dapo.compute_score(s, t) for s, t in inputs]
    paper_results = [paper(s, t) for s, t in inputs]
    agreement_paper = sum(a == b for a, b in zip(ours_results, paper_results)) / len(inputs)
    agreement_verl = sum(a == b for a, b in zip(boxed_results, verl_results)) / len(inputs)
    verl_vs_paper = sum(a == b for a, b in zip(verl_results, paper_results)) / len(inputs)

    def ours():
        return [reward.compute_score("math_dapo", s, t) for s, t in inputs]

    def ours_cold():
        reward._normalize_cached.cache_clear()
        return [reward.compute_score("math_dapo", s, t) for s, t in inputs]

    def ours_boxed():
        return [reward.compute_score("math_dapo", s, t, boxed_fallback=True) for s, t in inputs]

    def verl():
        return [verl_math_dapo.compute_score(s, t) for s, t in inputs]

    contenders = {"ours": ours, "ours, cold": ours_cold, "ours, boxed": ours_boxed, "verl": verl}
    times = time_interleaved(contenders, args.repeats)
    rate = {name: len(inputs) / seconds for name, seconds in times.items()}
    ratio = rate["ours"] / rate["verl"]

    mean_chars = sum(len(s) for s, _ in inputs) / len(inputs)
    accuracy = sum(r["acc"] for r in ours_results) / len(inputs)
    print(
        f"math scorer, {len(inputs)} responses (mean {mean_chars:.0f} chars) over {source}, median of "
        f"{args.repeats} passes; paper-scorer accuracy of the mix {accuracy:.3f}"
    )
    print_table(
        ["contender", "calls / s", "us / call", "x verl"],
        [[name, rate[name], 1e6 / rate[name], rate[name] / rate["verl"]] for name in contenders],
    )
    print(f"speed ratio ours / verl: {ratio:.2f}x (>1 means ours is faster)")
    print(f"exact agreement, ours (default) vs the paper's scorer: {agreement_paper:.4f}")
    print(f"exact agreement, ours (boxed_fallback=True) vs verl:   {agreement_verl:.4f}")
    print(f"for reference, verl vs the paper's scorer:             {verl_vs_paper:.4f} (its boxed fallback)")
    write_json(
        args.json,
        {
            "ours": {"calls_per_s": rate["ours"]},
            "ours_cold_cache": {"calls_per_s": rate["ours, cold"]},
            "ours_boxed_fallback": {"calls_per_s": rate["ours, boxed"]},
            "verl": {"calls_per_s": rate["verl"]},
            "ratio": ratio,
            "ratio_cold_cache": rate["ours, cold"] / rate["verl"],
            "ratio_boxed_fallback": rate["ours, boxed"] / rate["verl"],
            "agreement": agreement_paper,
            "agreement_boxed_fallback_vs_verl": agreement_verl,
            "verl_vs_paper_agreement": verl_vs_paper,
            "responses": len(inputs),
            "mean_response_chars": mean_chars,
            "ground_truths": source,
        },
    )


if __name__ == "__main__":
    main()
