"""The ablation's plan: the rows (the paper's order, one technique switched on a row), presets, the mechanism each
verdict checks and the paper's figures it draws; each run's overrides."""

from __future__ import annotations

import os
from pathlib import Path

CONFIG_NAME = "ablation_long"  # --config-name ablation: the shorter 3-digit setting it composes
ACTOR = "actor_rollout_ref.actor"
# The paper's Table 1 (AIME 2024 avg@32, Qwen2.5-32B), for the comparison column.
PAPER_AIME = (30, 36, 38, 41, 42, 50)
# The four techniques as five switches (overlong shaping is two), in the paper's order: (technique, the key, its
# value without the technique, its value with it). Naive GRPO is every switch off, DAPO every switch on; no row of
# either design has a KL term (DAPO has none).
SWITCHES = (
    ("overlong filtering", "dapo.overlong_filter", False, True),
    ("clip-higher", f"{ACTOR}.clip_ratio_high", 0.2, 0.28),
    ("soft overlong punishment", "reward.reward_kwargs.overlong_buffer_cfg.enable", False, True),
    ("token-level loss", f"{ACTOR}.loss_agg_mode", "seq-mean-token-mean", "token-mean"),
    ("dynamic sampling", "algorithm.filter_groups.enable", False, True),
)
NAIVE_GRPO = {key: off for _, key, off, _ in SWITCHES}
DAPO = {key: on for _, key, _, on in SWITCHES}
FULL_ROW = "DAPO"  # the leave-one-out design's reference row
DESIGNS = ("cumulative", "leave-one-out")
SMOLLM2_RUN_GIB = 8  # a real-model run's peak memory at 8 responses a micro-batch (6.1 GB measured), rounded up


def _memory_gib() -> int:
    """The machine's memory in GiB (0 where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**30
    except (ValueError, OSError, AttributeError):
        return 0


# Presets: (seeds, runs at a time, overrides applied to every run before the command line's; optionally the config,
# the design and the techniques it ablates). A task or scale change is a list of overrides here; --device cuda
# picks "cuda" (unless --quick) and adds embedded.device=cuda; --preset names one.
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
            "tiny.model.hidden_size=256",
            "tiny.model.intermediate_size=1024",
            "tiny.model.num_hidden_layers=6",
            "data.train_batch_size=32",
            "data.gen_batch_size=48",
            "trainer.total_training_steps=80",
        ],
    },
    # the real model (SmolLM2-135M-Instruct on word problems, `make model`): each technique left out of full DAPO
    # in turn, 3 paired seeds, a run a core with one thread each (measured on 2 cores: two such runs at once do 1.47x
    # the steps of one run on both cores), as many as memory holds (docs/ablation.md, "On a real model")
    "smollm2": {
        "config_name": "embedded_smollm2",
        "design": "leave-one-out",
        "techniques": ["clip-higher", "token-level loss", "dynamic sampling"],
        "seeds": 3,
        "jobs": min(os.cpu_count() or 1, max(1, _memory_gib() // SMOLLM2_RUN_GIB)),
        "overrides": [
            "embedded.num_threads=1",
            "actor_rollout_ref.rollout.n=8",
            "trainer.total_training_steps=40",
            "trainer.test_freq=10",
            "trainer.save_freq=5",
            "trainer.max_actor_ckpt_to_keep=1",
        ],
        "eval_k": 4,  # final accuracy: each run's last checkpoint, 4 answers a problem (about 7 min a run)
    },
}
DEVICE_KEY = "embedded.device"  # the embedded engine's device knob (verl's trainer.device is unused by it)
MIN_VERDICT_SEEDS = 3  # fewer paired seeds give no verdict: with 2, two equal differences (validation accuracy
# moves in steps of 1/(problems x k)) make a zero-width interval that would read as "shown"
# What each technique should do in the paper, as (figure key, sign of the paired difference with the technique less
# without it: +1 should rise, -1 should fall; what it is; the paper's claim). Every technique is also checked on
# accuracy (ACCURACY_CHECKS: per step, and compute-matched); these are the mechanisms. The verdicts are computed
# from them (``verdicts``), never written.
ACCURACY_CHECKS = [
    ("val_acc", +1, "final validation accuracy", "Table 1"),
    (
        "val_acc_matched",
        +1,
        "validation accuracy at the same responses generated",
        "compute-matched: the row with the technique at the last validation within the other's generation",
    ),
]
# with --eval-k: the final checkpoints' accuracy, K answers a held-out problem (figures' "eval_acc")
EVAL_CHECK = (
    "eval_acc",
    +1,
    "final accuracy, {k} answers a held-out problem",
    "Table 1 (bench.experiments.paired_eval)",
)
MECHANISMS = {
    "overlong filtering": [("acc_drawdown", -1, "validation-accuracy drawdown", "Fig. 5: training is stabler")],
    "clip-higher": [("final_entropy", +1, "final entropy", "Fig. 2b: entropy does not collapse")],
    "soft overlong punishment": [("truncated_frac", -1, "truncated share", "§3.4: fewer overlong samples")],
    "token-level loss": [
        ("final_repeat", -1, "repetition rate", "Fig. 4: long repetitive samples are penalised"),
        ("final_response_length", -1, "final length", "Fig. 4: no unhealthy length growth"),
        ("final_entropy", -1, "final entropy", "Fig. 4: no unhealthy entropy growth"),
    ],
    "dynamic sampling": [("steps_to_target_censored", -1, "steps to target", "Fig. 6: fewer steps")],
}
# The paper's figures: (title, the technique whose two rows are drawn, panels); a panel is a curve name of CURVES,
# or "accuracy_vs_responses" (accuracy against generated responses instead of steps).
PAPER_FIGURES = {
    "fig2b_clip_higher.png": (
        "Fig. 2b: entropy with vs without Clip-Higher",
        "clip-higher",
        ("entropy",),
    ),
    "fig4_token_level_loss.png": (
        "Fig. 4: sample- vs token-level loss",
        "token-level loss",
        ("response_length", "entropy", "repetition"),
    ),
    "fig5_overlong_filtering.png": (
        "Fig. 5: with vs without overlong filtering",
        "overlong filtering",
        ("accuracy", "entropy"),
    ),
    "fig6_dynamic_sampling.png": (
        "Fig. 6: with vs without dynamic sampling",
        "dynamic sampling",
        ("accuracy", "accuracy_vs_responses"),
    ),
}
TARGET_FRACTION = 0.8  # default target: start + 0.8 x the best row's mean gain
TAIL_STEPS = 5  # final entropy / length: mean over this many last steps
VAL_PREFIX = "val-core/"


def _check_design(design: str, techniques: list[str] | None) -> list[str]:
    known = [name for name, *_ in SWITCHES]
    if design not in DESIGNS:
        raise ValueError(f"unknown design {design!r}; the designs are {', '.join(DESIGNS)}")
    if techniques is None:
        return known
    unknown = [t for t in techniques if t not in known]
    if unknown:
        raise ValueError(f"unknown technique(s) {unknown}; the techniques are {', '.join(known)}")
    if design == "cumulative" and techniques != known:
        raise ValueError(
            "the cumulative design adds every technique in the paper's order; pick techniques with "
            "--design leave-one-out"
        )
    return [t for t in known if t in techniques]


def rows(design: str = "cumulative", techniques: list[str] | None = None) -> list[tuple[str, dict]]:
    """(name, overrides) of each row. ``cumulative``: the six rows of Table 1, naive GRPO then each row the previous
    one plus one technique; ``leave-one-out``: full DAPO, then DAPO without each of ``techniques`` (default all)."""
    chosen = _check_design(design, techniques)
    if design == "leave-one-out":
        return [(FULL_ROW, dict(DAPO))] + [
            (f"without {name}", {**DAPO, key: off}) for name, key, off, _ in SWITCHES if name in chosen
        ]
    out = [("naive GRPO", dict(NAIVE_GRPO))]
    for name, key, _, on in SWITCHES:
        label = f"+ {name}" + (" (DAPO)" if key == SWITCHES[-1][1] else "")
        out.append((label, {**out[-1][1], key: on}))
    return out


def comparisons(design: str = "cumulative", techniques: list[str] | None = None) -> list[tuple[str, str, str]]:
    """(technique, the row with it, the row without it) for each technique the design isolates: in ``cumulative``
    a row and the row before it, in ``leave-one-out`` full DAPO and the row that leaves the technique out."""
    names = [name for name, _ in rows(design, techniques)]
    chosen = _check_design(design, techniques)
    if design == "leave-one-out":
        return [(t, FULL_ROW, f"without {t}") for t in chosen]
    return [(t, after, before) for t, before, after in zip(chosen, names, names[1:])]


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
