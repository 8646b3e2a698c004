"""The paper's Table 1, small: what each DAPO technique does, on the embedded engine, in one of two designs.

``--design cumulative`` (the default; the paper's): six rows, in the paper's order, each the one before it with one
technique switched on (:func:`rows`); a technique's effect is its row less the row before:

  naive GRPO                   clip 0.2/0.2, per-sequence loss (seq-mean-token-mean), no overlong filtering,
                               no soft overlong punishment, no dynamic sampling; no KL in any row (DAPO has none)
  + overlong filtering         dapo.overlong_filter=true
  + clip-higher                actor_rollout_ref.actor.clip_ratio_high=0.28
  + soft overlong punishment   reward.reward_kwargs.overlong_buffer_cfg.enable=true
  + token-level loss           actor_rollout_ref.actor.loss_agg_mode=token-mean
  + dynamic sampling (DAPO)    algorithm.filter_groups.enable=true

``--design leave-one-out``: full DAPO, then full DAPO without each technique of ``--techniques`` (default all five:
overlong filtering, clip-higher, soft overlong punishment, token-level loss, dynamic sampling); a technique's effect
is full DAPO less the row without it. Fewer rows for the techniques asked about, each against the recipe users run.

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
running the command again reuses them and resumes an interrupted one from its last checkpoint. With ``--eval-k``
each run is evaluated as soon as it ends, its answers kept in the run's folder (``eval-k<K>/``), so a finished run
needs its checkpoint no longer: the records alone (``metrics.jsonl``, ``ablation_done.json``, the answers) are
the run, and a plan can go on in another checkout that holds them (the smollm2 preset's are committed, under
``bench/results/ablation-smollm2/``, checkpoints left out). ``start_model.json`` records the start model's weights
(sha256); a later call whose start model differs is refused, since its runs would not pair with the earlier ones.

Figures, per row, over seeds (seeds are paired: seed s of every row starts from the same model and reads the same
prompt order with the same sampling seed):
  val acc            held-out validation accuracy (mean@k, ``rollout.val_kwargs``) at the last step: mean ± std
  its technique      the mean of the per-seed differences, the row with the technique less the row without, and
                     its 95% t-interval over seeds (t quantile from scipy when installed, else ``bench.common.T_975``)
  same responses     the same, compute-matched: each row's accuracy at its last validation within the responses
                     the cheaper of the two generated in all (dynamic sampling generates more a step)
  steps to target    first validation step at or above the target accuracy: the median over seeds, a seed that
                     never reaches it counting as never (so "-" when most seeds do not)
  responses to tgt   responses generated up to that step (dynamic sampling generates more per step): median
  final entropy      actor/entropy (mean per-token entropy of the trained responses) over the last 5 steps
  final length       response_length/mean over the last 5 steps
  repetition         response/repeat_ngram_frac (responses repeating a 4-gram) over the last 5 steps
  truncated          dapo/overlong_frac, the share of trained responses cut at the length limit, over all steps
  avg@K at the end   with ``--eval-k K`` (the smollm2 preset: 4): each run's last checkpoint answering every
                     held-out problem K times (``bench.experiments.paired_eval``), the mean over seeds, and the
                     technique's paired difference; the start model is evaluated alike. It is the accuracy to read:
                     the one-sample validation's noise is about sqrt(K) times larger
The target (``--target``) defaults to the start accuracy plus 0.8 x the best row's gain (its mean final accuracy
less the start), a level the best row reaches late in the budget, so that the steps to reach it tell rows apart.

Verdicts (``verdicts``): for each technique, its paired difference (with less without) on accuracy (avg@K at the
end with ``--eval-k``, the last validation, and the compute-matched validation), and on the
mechanism the paper names (``MECHANISMS``: entropy for Clip-Higher; repetition, length and entropy for the
token-level loss; accuracy drawdown for overlong filtering; truncation for the soft punishment; steps to target
for dynamic sampling, a seed that never reaches it counting as one step past the budget). "shown" when the
interval lies wholly on the paper's side of 0, "not shown" when it includes 0, "opposite" when wholly on the other,
"too few seeds" below 3 paired seeds (``--quick``'s 2 give intervals, no verdicts).

Run: python -m bench.experiments.ablation [--preset NAME] [--config-name NAME] [--design D] [--techniques T,...]
                                         [--quick] [--device cuda] [--seeds N] [--jobs N] [--stop-after MINUTES]
                                         [--eval-k K] [--report-finished] [--rows NAME,...] [--json PATH] [--out DIR]
                                         [key=value ...]
It says at the start how many training steps the plan is and how many are done; ``--stop-after`` starts no run
after that many minutes, so a long plan runs in pieces of the same command. Runs go seed by seed (every row's seed 0,
then every row's seed 1), so a plan stopped part-way holds whole paired seeds; ``--report-finished`` starts no run
and reports over the seeds every row has finished (the JSON's ``seeds``, of ``seeds_planned``). ``--rows`` runs
only the named rows' runs of the plan (``--seeds`` of them) and stops without a report: a piece chosen to fit the
time left, such as the two short runs without dynamic sampling side by side.
Presets (``PRESETS``, a list of overrides each): default 5 seeds x 6 rows of 60 steps, as many runs at a time as
CPUs, one torch thread each (docs/ablation.md: 49 minutes on 2 cores, plus a one-time 7-minute warm-up
of the start model when it is not cached); ``--quick`` 2 seeds, 8 steps, validation on 64 problems every 4 steps;
``--device cuda`` sets ``embedded.device=cuda`` and, unless ``--quick``, the larger "cuda" preset; ``--preset
smollm2`` is the real model (``configs/embedded_smollm2.yaml``, ``make model``), leave-one-out of clip-higher, the
token-level loss and dynamic sampling, 3 seeds x 40 steps of 8 prompts x 8, a run a core with one thread each (as
many at a time as memory holds, 8 GiB a run), the final checkpoints evaluated with 4 answers a problem
(docs/ablation.md).
``key=value`` overrides (verl's names) apply to every run, after the preset's and the row's own.
"""

from __future__ import annotations

from bench.experiments.ablation.figures import summarise
from bench.experiments.ablation.plan import (
    CONFIG_NAME,
    DEVICE_KEY,
    PRESETS,
    comparisons,
    override_value,
    rows,
    run_overrides,
    slug,
)
from bench.experiments.ablation.stats import direction, paired_interval, verdict_lines, verdicts

__all__ = [
    "CONFIG_NAME",
    "DEVICE_KEY",
    "PRESETS",
    "comparisons",
    "direction",
    "main",
    "override_value",
    "paired_interval",
    "rows",
    "run_overrides",
    "slug",
    "summarise",
    "verdict_lines",
    "verdicts",
]


def main(argv: list[str] | None = None) -> int:
    """The command line (``python -m bench.experiments.ablation``), see :mod:`bench.experiments.ablation.__main__`."""
    from bench.experiments.ablation.__main__ import main as run

    return run(argv)
