"""The ablation's plan: the rows (the paper's order, one technique switched on a row), presets, the mechanism each
verdict checks and the paper's figures it draws; each run's overrides."""

from __future__ import annotations

import os
from pathlib import Path

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


def override_value(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def run_overrides(row: dict, seed: int, run_dir: Path, extra: list[str]) -> list[str]:
    """The ``dapo-train`` overrides of one (row, seed) run."""
    return [
        *(f"{k}={override_value(v)}" for k, v in row.items()),
        f"embedded.seed={seed}",  # the RL sampling
        f"data.seed={seed}",  # the prompt order (configs/embedded.yaml fixes it at 0 for every run otherwise)
        f"trainer.default_local_dir={run_dir}",
        f"trainer.experiment_name={run_dir.parent.name}-{run_dir.name}",
        "embedded.progress_bar=false",
        *extra,
    ]
