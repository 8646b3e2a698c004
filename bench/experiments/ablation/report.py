"""The ablation's report: the table, the plots (every row, and the paper's figures side by side), ``report.md``."""

from __future__ import annotations

import math
from pathlib import Path

from bench.experiments.ablation.figures import CURVES, mean_curve, responses_curve
from bench.experiments.ablation.plan import PAPER_FIGURES
from bench.experiments.ablation.stats import fmt_interval, verdict_lines


def table(figures: dict, seeds: int, steps: int) -> tuple[list[str], list[list[object]]]:
    headers = [
        "row",
        f"val acc @ step {steps} (mean ± std, {seeds} seed{'s' if seeds > 1 else ''})",
        "its technique: with less without (paired, 95% CI)",
        "same responses generated (paired, 95% CI)",
        "steps to target",
        "responses to target",
        "final entropy",
        "final length",
        "repetition",
        "truncated",
        "paper (AIME avg@32)",
    ]
    k = figures.get("eval_k") or 0
    if k:  # the final checkpoints answering every held-out problem k times come first: the accuracy to read
        headers[1:1] = [f"avg@{k} at the end (mean, {seeds} seed{'s' if seeds > 1 else ''})", "with less without"]
    # a row shows the effect of the technique it differs by: cumulative, the one it adds; leave-one-out, the one it
    # leaves out (full DAPO less this row)
    first = figures["rows"][0]["name"]
    effect_of = {e["without"] if e["with"] == first else e["with"]: e for e in figures["effects"]}
    body = []
    for r in figures["rows"]:
        reach = "-" if r["steps_to_target"] is None else f"{r['steps_to_target']:.0f}"
        responses = "-" if r["responses_to_target"] is None else f"{r['responses_to_target']:.0f}"
        if seeds > 1:
            reach += f" ({r['seeds_reaching_target']}/{seeds})"
        effect = effect_of.get(r["name"])
        diff = fmt_interval(effect["paired"]["val_acc"]) if effect else ""
        matched = fmt_interval(effect["paired"]["val_acc_matched"]) if effect else ""
        repeat = "-" if math.isnan(r["final_repeat"]) else f"{100 * r['final_repeat']:.1f}%"
        evaluated = (
            [f"{r['eval_acc_mean']:.3f}", fmt_interval(effect["paired"]["eval_acc"]) if effect else ""] if k else []
        )
        body.append(
            [
                r["name"],
                *evaluated,
                f"{r['val_acc_mean']:.3f} ± {r['val_acc_std']:.3f}",
                diff,
                matched,
                reach,
                responses,
                f"{r['final_entropy']:.3f}",
                f"{r['final_response_length']:.1f}",
                repeat,
                f"{100 * r['truncated_frac']:.1f}%",
                "" if r["paper_aime_avg32"] is None else r["paper_aime_avg32"],
            ]
        )
    return headers, body


def markdown_table(headers: list[str], body: list[list[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def _draw(ax, results: dict[str, list[list[dict]]], names, panel: str, train_batch_size: int, n: int) -> None:
    """One panel: each row of ``names`` as its mean over seeds, shaded from the lowest to the highest seed."""
    import numpy as np

    for name in names:
        seeds = results[name]
        if panel == "accuracy_vs_responses":
            curves = [responses_curve(r, train_batch_size, n) for r in seeds]
            size = min((len(c) for c in curves), default=0)
            if not size:
                continue
            x = np.array([[c[i][0] for i in range(size)] for c in curves]).mean(0)  # mean responses at each point
            values = np.array([[c[i][1] for i in range(size)] for c in curves])  # [seeds, points]
        else:
            curve = mean_curve(seeds, CURVES[panel][1])
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
    results: dict[str, list[list[dict]]],
    out_dir: Path,
    comparisons: list[tuple[str, str, str]],
    train_batch_size: int = 0,
    n: int = 1,
) -> list[Path]:
    """Every row on one plot per curve (accuracy, entropy, length, repetition, truncation against steps, accuracy
    against responses generated), then the paper's figures (``PAPER_FIGURES``) of the techniques compared: the
    rows without and with it side by side, one panel per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {f"{panel}.png": (None, tuple(results), (panel,)) for panel in (*CURVES, "accuracy_vs_responses")}
    pairs = {technique: (without, with_) for technique, with_, without in comparisons}
    figures.update(
        {
            name: (title, pairs[technique], panels)
            for name, (title, technique, panels) in PAPER_FIGURES.items()
            if technique in pairs
        }
    )
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
        f"# DAPO ablation on the embedded engine ({figures.get('design', 'cumulative')})",
        "",
        f"Command: `{command}`",
        "",
        f"Start accuracy (step 0, held-out): {figures['start_acc']:.3f}. Target accuracy: {figures['target']:.3f}."
        + (
            f" The start model answering every held-out problem {figures['eval_k']} times: "
            f"{figures['start_eval_acc']:.3f} (avg@{figures['eval_k']}, as each run's last checkpoint)."
            if figures.get("eval_k")
            else ""
        ),
        "",
        markdown_table(headers, body),
        "",
        "Paired: the mean over seeds of (the row with the technique - the row without it) with the same seed, and "
        "its 95% t-interval; same responses generated: each row's accuracy at its last validation within the "
        "responses the cheaper row generated in all.",
        "Final entropy, length and repetition: the last 5 steps; truncated: over all steps.",
        f"Compute: {figures['step_hours']:.1f} h of training steps in all (the runs' `timing_s/step` summed; "
        "validations, evaluations and model loads not counted).",
        "",
    ]
    if verdict_list:
        text += [
            "## Does each technique show its effect in the paper's direction?",
            "",
            "Computed from the paired differences, the row with the technique less the row without (95% "
            "t-intervals over seeds): a check is shown when its whole interval lies on the paper's side of 0.",
            "",
            *verdict_lines(verdict_list),
            "",
        ]
    text += [*(f"![{p.stem}]({p.relative_to(out)})" for p in plots), ""]
    path = out / "report.md"
    path.write_text("\n".join(text))
    return path
