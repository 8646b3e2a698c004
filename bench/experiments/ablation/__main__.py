"""``python -m bench.experiments.ablation``: the command line (see the package's docstring)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import bench.experiments.ablation as package
from bench.common import parser, print_table, write_json
from bench.experiments.ablation.figures import run_records, summarise
from bench.experiments.ablation.plan import (
    CONFIG_NAME,
    DESIGNS,
    DEVICE_KEY,
    PAPER_AIME,
    PRESETS,
    comparisons,
    rows,
    run_overrides,
    slug,
)
from bench.experiments.ablation.report import table, write_plots, write_report
from bench.experiments.ablation.run import (
    check_start_model,
    compose_setting,
    evaluate_run,
    evaluate_runs,
    finished,
    prepare_start_model,
    run_all,
    steps_done,
)
from bench.experiments.ablation.stats import verdict_lines, verdicts


def main(argv: list[str] | None = None) -> int:
    p = parser(package.__doc__.split("\n\n")[0], repeats=False)
    p.prog = "python -m bench.experiments.ablation"
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run (verl's names)")
    p.add_argument("--quick", action="store_true", help="2 seeds, 8 steps, 64 validation problems: minutes")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a preset of PRESETS by name")
    p.add_argument(
        "--design",
        choices=DESIGNS,
        default=None,
        help="cumulative (the paper's Table 1, the default) or leave-one-out (full DAPO less one technique a row)",
    )
    p.add_argument(
        "--techniques",
        default=None,
        help="leave-one-out: the techniques to leave out, comma-separated (default all five)",
    )
    p.add_argument(
        "--stop-after",
        type=float,
        default=None,
        metavar="MINUTES",
        help="start no run after this many minutes (the same command continues; the report waits for every run)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help=f"{DEVICE_KEY} of every run; cuda also picks the larger 'cuda' preset (unless --quick)",
    )
    p.add_argument("--seeds", type=int, default=None, help="seeds per row (default 5; --quick 2)")
    p.add_argument("--jobs", type=int, default=None, help="runs at a time (default: the CPU count; cuda: 6)")
    p.add_argument("--out", type=Path, help="run directories and report (default bench/results/ablation[-PRESET])")
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="target validation accuracy (default: start + 0.8 x the best row's gain)",
    )
    p.add_argument(
        "--eval-k",
        type=int,
        default=None,
        metavar="K",
        help="final accuracy with K answers a held-out problem, each run's last checkpoint and the start model "
        "(bench.experiments.paired_eval; default: the preset's, 0 = the last one-sample validation only)",
    )
    p.add_argument(
        "--report-finished",
        action="store_true",
        help="start no run: report over the seeds that every row has finished (a long plan's interim figures)",
    )
    p.add_argument(
        "--rows",
        default=None,
        metavar="NAME,...",
        help="run only these rows' runs of the plan (by name, comma-separated), then stop without a report: a piece "
        "chosen to fit the time left, e.g. two short runs side by side; the plan's command reports",
    )
    p.add_argument("--fresh", action="store_true", help="delete earlier runs under --out instead of reusing them")
    p.add_argument("--print-commands", action="store_true", help="print each run's dapo-train command and exit")
    p.add_argument(
        "--config-name",
        default=None,
        help="the shared setting under configs/ (default: the preset's, else ablation_long; ablation: 3 digits)",
    )
    args = p.parse_args(argv)

    preset = PRESETS[args.preset or ("quick" if args.quick else "cuda" if args.device == "cuda" else "default")]
    if args.quick and args.preset:
        preset = {
            **preset,
            "seeds": PRESETS["quick"]["seeds"],
            "overrides": [*preset["overrides"], *PRESETS["quick"]["overrides"]],
        }
    seeds = args.seeds or preset["seeds"]
    jobs = args.jobs or preset["jobs"]
    config_name = args.config_name or preset.get("config_name", CONFIG_NAME)
    design = args.design or preset.get("design", "cumulative")
    techniques = args.techniques.split(",") if args.techniques else preset.get("techniques")
    if seeds < 1:
        p.error("--seeds must be >= 1")
    try:
        table_rows, compared = rows(design, techniques), comparisons(design, techniques)
    except ValueError as err:
        p.error(str(err))
    device = [f"{DEVICE_KEY}={args.device}"] if args.device else []
    extra = [*preset["overrides"], *device, *args.overrides]
    out = (args.out or Path("bench/results/ablation" + (f"-{args.preset}" if args.preset else ""))).resolve()
    try:
        cfg = compose_setting(extra, config_name)  # fails early on a misspelt key, before anything runs
    except Exception as err:  # noqa: BLE001 - Hydra's and OmegaConf's errors name the key
        print(f"bench.experiments.ablation: error: {str(err).strip()}", file=sys.stderr)
        return 2
    from dapo.settings import select

    steps = int(select(cfg, "trainer.total_training_steps"))
    train_batch_size = int(cfg.data.train_batch_size)
    n = int(cfg.actor_rollout_ref.rollout.n)

    plan = []  # seed by seed, so a plan stopped part-way holds whole paired seeds, not some rows' every seed
    for seed in range(seeds):
        for name, row in table_rows:
            run_dir = out / slug(name) / f"seed{seed}"
            plan.append((name, seed, run_overrides(row, seed, run_dir, extra), run_dir))
    selected = plan
    if args.rows is not None:
        names = [name for name, _ in table_rows]
        only = [name.strip() for name in args.rows.split(",")]
        if unknown := [name for name in only if name not in names]:
            p.error(f"--rows: no row {', '.join(map(repr, unknown))} in this plan (its rows: {', '.join(names)})")
        selected = [entry for entry in plan if entry[0] in only]
    if args.print_commands:
        for name, seed, overrides, _ in selected:
            print(f"# {name}, seed {seed}\ndapo-train --config-name {config_name} {' '.join(overrides)}")
        return 0
    if args.fresh and out.exists():
        shutil.rmtree(out)

    done = sum(steps_done(run_dir, steps) for *_, run_dir in plan)
    print(
        f"ablation ({design}): {len(table_rows)} rows x {seeds} seeds x {steps} steps = {len(plan) * steps} training "
        f"steps ({done} done), {jobs} at a time, under {out}"
        + ("" if args.rows is None else f"; running {len(selected)} of its runs (--rows)")
    )
    start_model = prepare_start_model(extra, config_name)
    check_start_model(out, start_model)
    eval_k = preset.get("eval_k", 0) if args.eval_k is None else args.eval_k
    planned = seeds
    if args.report_finished:  # the seeds finished in every row; the rest of the plan is left as it is
        finished_seeds = [s for s in range(seeds) if all(finished(d) for _, seed, _, d in plan if seed == s)]
        if not finished_seeds:
            print("ablation: no seed is finished in every row yet; nothing to report")
            return 0
        print(f"ablation: reporting seed(s) {', '.join(map(str, finished_seeds))} of {seeds}, finished in every row")
        plan = [p for p in plan if p[1] in finished_seeds]
    else:
        deadline = None if args.stop_after is None else args.stop_after * 60

        def evaluate_now(run_dir):  # while its checkpoint is there: the answers stay with the run's records
            return evaluate_run(run_dir, steps, eval_k, config_name, extra)

        failures, unfinished = run_all(selected, jobs, config_name, deadline, evaluate_now if eval_k > 0 else None)
        if failures:
            print("runs failed:\n  " + "\n  ".join(failures), file=sys.stderr)
            return 1
        if unfinished:
            print(
                f"ablation: stopped after {args.stop_after:g} min with {unfinished} of {len(selected)} runs to go; the "
                "same command continues (finished runs are reused, an interrupted one resumes from its checkpoint)"
            )
            return 0
        if args.rows is not None:
            print(f"ablation: the runs of {args.rows} are done; the plan's command (without --rows) reports")
            return 0

    results = {name: [] for name, _ in table_rows}
    for name, _, _, run_dir in plan:
        results[name].append(run_records(run_dir))
    evals = evaluate_runs(plan, steps, eval_k, start_model, out, config_name, extra) if eval_k > 0 else None
    paper = dict(zip(results, PAPER_AIME)) if design == "cumulative" else None
    figures = {
        **summarise(results, args.target, train_batch_size, n, compared, paper, evals),
        "design": design,
        "eval_k": eval_k,
    }
    seeds = len({seed for _, seed, _, _ in plan})  # all planned, or those reported by --report-finished
    headers, body = table(figures, seeds, steps)
    verdict_list = verdicts(figures)
    evaluated = f" (avg@{eval_k}: {figures['start_eval_acc']:.3f})" if eval_k else ""
    print(f"\nstart accuracy {figures['start_acc']:.3f}{evaluated}, target {figures['target']:.3f}")
    print_table(headers, body)
    print("\n" + "\n".join(verdict_lines(verdict_list)))
    plots = write_plots(results, out / "plots", compared, train_batch_size, n)
    command = "python -m bench.experiments.ablation " + " ".join(
        [
            *([f"--preset {args.preset}"] if args.preset else []),
            *([f"--config-name {args.config_name}"] if args.config_name else []),
            *([f"--design {args.design}"] if args.design else []),
            *([f"--techniques {args.techniques}"] if args.techniques else []),
            *(["--quick"] if args.quick else []),
            *([f"--device {args.device}"] if args.device else []),
            *([f"--seeds {planned}"] if args.seeds else []),
            *(["--report-finished"] if args.report_finished else []),
            *([f"--eval-k {args.eval_k}"] if args.eval_k is not None else []),
            *args.overrides,
        ]
    )
    report = write_report(out, figures, headers, body, command.strip(), plots, verdict_list)
    print(f"report: {report}")
    write_json(
        args.json,
        {
            **figures,
            "verdicts": verdict_list,
            "seeds": seeds,
            "seeds_planned": planned,
            "steps": steps,
            "command": command.strip(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
