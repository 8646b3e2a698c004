"""End-to-end DAPO training: the embedded engine against TRL 1.16's GRPOTrainer (loss_type="dapo"), in one run.

Same run, same start: both train the engine's warmed-up tiny Qwen2 (the ``tiny.warmup`` cache, built once if
absent and not timed) on the same task files with the same G, lengths, batch, learning rate and schedule, and
the same number of AdamW updates per rollout over the same number of samples. TRL's configuration is derived from
the engine's composed config; the mapping and what cannot be matched are written down in ``bench/compare/trl_peer.py``.

How it runs. Each trainer runs in its own process (set up at the same time, untimed); then they take turns,
one rollout step at a time, so each timed step has the machine to itself and machine noise hits both alike
(bench/common.py's interleaving). Both use the engine's ``embedded.num_threads`` torch threads (1 in
configs/embedded.yaml; ``--threads`` sets it):
  ours  ``recipe.embedded.trainer.run(cfg)`` (what ``dapo-train`` runs) with checkpoints every ``--eval-every``
        rollout steps as snapshots and validation off; a step's time is its ``timing_s/step`` (metrics.jsonl);
  trl   ``GRPOTrainer.train()``; a rollout step (``updates_per_rollout`` optimizer steps, generation in the
        first) is timed by a callback from the first ``on_step_begin`` to the last ``on_step_end``.
Then both sets of snapshots (and the common start) are scored by one evaluator, here: ``sample`` from
``recipe.embedded.decode`` (Hugging Face ``generate``'s distribution, faster) with the engine's validation sampling
(``rollout.val_kwargs``: temperature 1.0, top_p 0.7, mean@4 over the 256 held-out problems), the same seed for
every snapshot, graded by ``dapo.reward.compute_score``. Evaluation time is excluded from both training times.

Seeds. Each seed in ``--seeds`` is a paired run: both contenders train with that seed (``embedded.seed`` and
``data.seed``; TRL's ``seed``) from the same start model; snapshots every ``--eval-every`` rollout steps (every 2
by default, so the step at which the target is crossed is known to within 2 steps).

Figures (per seed, medians over its rollout steps; then the median and range of each ratio over the seeds):
  step_s            HEADLINE: seconds per optimizer update = seconds per rollout step / updates per rollout.
                    Both train the same number of samples per update; the engine's time includes dynamic
                    sampling's extra generation (data.gen_batch_size prompts per round, rounds until
                    data.train_batch_size groups are kept), which TRL does not do.
  rollout_step_s    seconds per rollout step (one generation phase + all its updates), and its two parts:
                    generation (generate, score, old log-probs; TRL: its first optimizer step less a plain
                    one) and updates.
  ms / response     seconds per rollout step / responses generated in it (the engine generates more per step).
  peak_rss_mib      peak resident memory of the contender's training process (setup included), MiB.
  time_to_target_s  training seconds (sum of step times, evaluation excluded) until the first evaluation at
                    or above the target accuracy (``--target``; default: the start accuracy plus 0.9 x the
                    smallest best gain of either contender in any seed, a level both reach in every seed, the
                    same for every seed); null if not reached.
  mean curve        time to target on the accuracy curves averaged over the seeds (less evaluation noise than
                    one seed's first crossing), for targets at 0.5, 0.75 and 0.9 of the smaller gain.

Run: python -m bench.compare.trl_grpo [--quick | --real-model] [--seeds S ...] [--json PATH] [key=value ...]
(key=value: engine overrides, applied to both). Default: 5 seeds of 48 rollout steps each, snapshots every 2 (about
15 minutes on 2 shared cores, a third of it evaluation, plus a one-time warm-up of the start model if it is not
cached); --quick: one seed, 6 steps, every 3, 64 held-out problems (under a minute).

--real-model: the same comparison on SmolLM2-135M-Instruct (``configs/embedded_smollm2.yaml``, ``make model``
first): 8 prompts x 4 responses of up to 104 tokens a step, 2 updates, one seed of 6 rollout steps, snapshots every
3, mean@1 over 128 held-out problems. Where the engine computes in bf16 (``embedded.dtype=bfloat16`` on a CPU with
AVX-512 BF16) TRL is given the same precision (``bf16=True``: mixed precision over fp32 weights) and the evaluator
samples every snapshot in bf16.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

from bench.common import parser, print_table, write_json
from dapo.settings import eos_token_ids

CONTENDERS = ("ours", "trl")
PRESETS = {  # config, rollout steps, steps between snapshots, seeds, engine overrides (both read them)
    "default": {"config": "embedded", "steps": 48, "eval_every": 2, "seeds": [0, 1, 2, 3, 4], "overrides": []},
    "quick": {
        "config": "embedded",
        "steps": 6,
        "eval_every": 3,
        "seeds": [0],
        "overrides": ["data.val_max_samples=64"],
    },  # mean@4 over 64 problems
    # the real model (make model): SmolLM2-135M-Instruct on word problems, bf16 compute where the CPU has it
    "real-model": {
        "config": "embedded_smollm2",
        "steps": 6,
        "eval_every": 3,
        "seeds": [0],
        "overrides": ["data.val_max_samples=128"],
    },  # mean@1 over 128 problems
}
TARGET_FRACTION = 0.9  # default target: start + 0.9 x the smallest best gain of any contender in any seed
MEAN_CURVE_FRACTIONS = (0.5, 0.75, 0.9)  # targets on the seed-mean curves: these fractions of the smaller gain


def engine_overrides(run_dir: Path, steps: int, eval_every: int, threads: int | None, seed: int) -> list[str]:
    """What the bench sets on top of configs/embedded.yaml: length, seed, checkpoints as snapshots, nothing extra.
    The seed is the training seed and the data-order seed of both contenders (TRL's ``seed`` is ``embedded.seed``,
    its data order follows it); the start model (the warm-up cache) is the same for every seed."""
    return [
        f"embedded.seed={seed}",
        f"data.seed={seed}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={eval_every}",
        "trainer.max_actor_ckpt_to_keep=null",  # keep every snapshot
        "trainer.test_freq=-1",  # validation is done afterwards, for both, by the same evaluator
        "trainer.val_before_train=false",
        "trainer.resume_mode=disable",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={run_dir}",
        "embedded.progress_bar=false",
    ] + ([] if threads is None else [f"embedded.num_threads={threads}"])


def engine_config(overrides: list[str], config_name: str = "embedded"):
    """The composed config (as ``dapo-train --config-name <config_name>`` composes it) and the engine's checked
    view of it."""
    from recipe.config import compose
    from recipe.embedded.config import read_config

    cfg = compose(overrides, config_name)
    return cfg, read_config(cfg)


def data_files(c) -> tuple[str, list[str]]:
    """The train / validation parquet the engine reads (the synthetic task's unless data.*_files are set)."""
    if c.data.train_files is None or c.data.val_files is None:
        task_dir = c.tiny.task_dir()
    train = c.data.train_files or [str(task_dir / "train.parquet")]
    val = c.data.val_files or [str(task_dir / "val.parquet")]
    if len(train) != 1:
        raise SystemExit(f"bench_trl: give TRL one train file (data.train_files has {len(train)})")
    return train[0], val


def start_model(c) -> str:
    """The model both start from: ``actor_rollout_ref.model.path``, else the engine's warm-up cache entry."""
    if c.model.path is not None:
        return c.model.path

    start = time.perf_counter()
    path = c.tiny.model_dir(torch.device("cpu"))
    print(f"start model: {path} ({time.perf_counter() - start:.0f} s to get it, not timed)")
    return str(path)


# ---------------------------------------------------------------------------------------------------- workers


class Turns:
    """Strict alternation of the two training processes, one rollout step at a time (as bench/common.py's
    ``time_interleaved`` alternates calls): each step runs alone on the machine, machine noise hits both alike.

    ``take(me)`` before each rollout step: the first call waits until both processes are set up (their setup is
    not timed and must not overlap a timed step), later calls hand the turn over and wait for it to come back.
    ``finish(me)`` when done: the other process then never waits again.
    """

    def __init__(self, ctx):
        self.sem = {name: ctx.Semaphore(0) for name in CONTENDERS}
        self.done = {name: ctx.Event() for name in CONTENDERS}
        self.ready = ctx.Barrier(len(CONTENDERS))
        self.started = {name: ctx.Event() for name in CONTENDERS}

    def _other(self, me: str) -> str:
        return CONTENDERS[1 - CONTENDERS.index(me)]

    def _wait(self, me: str) -> None:
        while not self.sem[me].acquire(timeout=0.2):
            if self.done[self._other(me)].is_set():
                return

    def take(self, me: str) -> None:
        if not self.started[me].is_set():
            self.started[me].set()
            self.ready.wait(timeout=1800)
            if me == CONTENDERS[0]:
                return  # the first contender starts
        else:
            self.sem[self._other(me)].release()
        self._wait(me)

    def finish(self, me: str) -> None:
        self.done[me].set()
        self.sem[self._other(me)].release()
        self.ready.abort()  # never block a process still at the barrier


def worker(name: str, spec: dict, turns: Turns) -> None:
    """One contender's training, in its own process; writes ``<name>.json`` (rollout step seconds, snapshots)."""
    out_dir = Path(spec["out_dir"])
    log = open(out_dir / f"{name}.log", "w")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    try:
        cfg, c = engine_config(spec["overrides"], spec["config_name"])
        if c.embedded.num_threads is not None:  # as the engine does (None: torch's default)
            torch.set_num_threads(c.embedded.num_threads)
        train = train_ours if name == "ours" else train_trl
        result = train(cfg, c, spec, turns)
    finally:
        turns.finish(name)  # after everything this process does, so that it never overlaps a timed step
    import resource

    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB; whole process
    (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1))


def train_ours(cfg, c, spec: dict, turns: Turns) -> dict:
    """The engine, as ``dapo-train`` runs it; step times from its metrics.jsonl, its checkpoints as snapshots."""
    from bench.compare.trl_peer import updates_per_rollout
    from recipe.embedded import trainer
    from recipe.embedded.monitor import read_metrics

    class TakeTurns(trainer.Callback):  # each rollout step waits for its turn (outside the step's timing)
        def on_step_begin(self, step: int) -> None:
            turns.take("ours")

    run_dir = trainer.run(cfg, callbacks=[TakeTurns()])
    records = [r for r in read_metrics(run_dir) if r.get("timing_s/step") is not None]
    return {
        "rollout_s": [r["timing_s/step"] for r in records],
        "gen_s": [r.get("timing_s/gen", float("nan")) for r in records],
        "update_s": [r.get("timing_s/update_actor", float("nan")) for r in records],
        "generated": [r.get("dapo/generated_prompts", c.data.train_batch_size) * c.rollout.n for r in records],
        "kept_group_frac": [r.get("dapo/kept_group_frac") for r in records],
        "updates_per_rollout": updates_per_rollout(c),
        "torch_threads": torch.get_num_threads(),
        "snapshots": {
            str(s): str(run_dir / f"global_step_{s}" / "actor")
            for s in range(spec["eval_every"], spec["steps"] + 1, spec["eval_every"])
        },
    }


def train_trl(cfg, c, spec: dict, turns: Turns) -> dict:
    from bench.compare.trl_peer import run_worker

    return run_worker(
        c, spec["model_dir"], spec["train_file"], Path(spec["out_dir"]), spec["steps"], spec["eval_every"], turns
    )


def run_alternating(spec: dict, out_dir: Path) -> dict[str, dict]:
    """Run both trainers in two processes taking turns step by step; on failure show the failing log's tail."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    turns = Turns(ctx)
    procs = {
        name: ctx.Process(target=worker, args=(name, spec, turns), name=f"bench_trl-{name}") for name in CONTENDERS
    }
    start = time.perf_counter()
    for proc in procs.values():
        proc.start()
    for proc in procs.values():
        proc.join()
    print(f"training, both taking turns: {time.perf_counter() - start:.0f} s wall (setup included)")
    failed = [name for name, proc in procs.items() if proc.exitcode != 0]
    for name in failed:
        tail = (out_dir / f"{name}.log").read_text().splitlines()[-30:]
        print(f"--- {name} failed; last lines of {out_dir / f'{name}.log'}:\n" + "\n".join(tail), file=sys.stderr)
    if failed:
        raise SystemExit(f"bench_trl: {', '.join(failed)} failed")
    return {name: json.loads((out_dir / f"{name}.json").read_text()) for name in CONTENDERS}


# ---------------------------------------------------------------------------------------------------- evaluator


class Evaluator:
    """mean@k accuracy on the held-out set at the engine's validation sampling, one seed for every model."""

    def __init__(self, c, model_dir: str, val_files: list[str], seed: int = 12345):
        from bench.compare.trl_peer import load_tokenizer
        from recipe.embedded.data import load_prompts

        self.c, self.model_dir, self.seed = c, model_dir, seed
        self.tokenizer = load_tokenizer(model_dir)
        self.val = load_prompts(
            val_files,
            self.tokenizer,
            files_key="data.val_files",
            max_samples=c.data.val_max_samples,
            **c.data.prompt_kwargs(),
        )

    def load(self, weights: str):
        from transformers import AutoModelForCausalLM

        from recipe.embedded.policy import bf16_compute, low_precision_copy

        if weights.endswith(".pt"):  # a TRL snapshot: state dict of the start model's architecture
            model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
            model.load_state_dict(torch.load(weights, map_location="cpu"))
        else:
            model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
        if bf16_compute(self.c):  # sampled as the engine samples, the same for every model
            model = low_precision_copy(model, torch.bfloat16)
        return model.eval()

    @torch.no_grad()
    def accuracy(self, weights: str) -> float:
        from dapo.reward import compute_score
        from recipe.embedded.decode import sample
        from recipe.embedded.rollout import SamplingParams

        c, tok = self.c, self.tokenizer
        model = self.load(weights)
        eos = eos_token_ids(tok.eos_token_id, model.generation_config.eos_token_id)  # the engines' rule
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
        params = SamplingParams(
            c.rollout.val_do_sample, c.rollout.val_temperature, c.rollout.val_top_p, c.rollout.val_top_k
        )
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            ids, mask, _ = sample(  # generate's distribution, faster (tests/embedded/test_decode.py)
                model,
                self.val.prompt_ids,
                n=c.rollout.val_n,
                params=params,
                max_new_tokens=c.data.max_response_length,
                eos_ids=torch.tensor(eos),
                pad_id=pad_id,
                max_num_seqs=c.rollout.max_num_seqs,
            )  # [V*k, T]
        truths = [t for t in self.val.ground_truths for _ in range(c.rollout.val_n)]
        correct = [
            compute_score(None, tok.decode(ids[i][mask[i].bool()], skip_special_tokens=True), truths[i])["acc"]
            for i in range(ids.shape[0])
        ]
        return sum(correct) / len(correct)


def check_prompt_parity(c, model_dir: str, train_file: str, rows: int = 64) -> None:
    """TRL tokenizes prompts itself (apply_chat_template, tokenize=True) with the tokenizer given to it; its
    tokens must be the engine's: for the embedded model, those of the tokenizer the warm-up trained with."""
    import pandas as pd
    from transformers import AutoTokenizer

    from bench.compare.trl_peer import load_tokenizer, train_dataset
    from recipe.embedded.data import load_prompts

    tok = load_tokenizer(model_dir)
    reference = tok
    if c.model.path is None:  # the task's own tokenizer directory (no model config beside it)
        reference = AutoTokenizer.from_pretrained(c.tiny.task_dir() / "tokenizer")
    with tempfile.TemporaryDirectory() as tmp:
        head = Path(tmp) / "head.parquet"
        pd.read_parquet(train_file).head(rows).to_parquet(head, index=False)
        ours = load_prompts(
            [str(head)],
            reference,
            files_key="data.train_files",
            **c.data.prompt_kwargs(),
        )
        prompts = list(train_dataset(str(head))["prompt"])
    theirs = tok.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    if [p.tolist() for p in ours.prompt_ids] != [list(t) for t in theirs]:
        raise SystemExit("bench_trl: TRL's prompt tokens differ from the engine's; the comparison would be unfair")


# ---------------------------------------------------------------------------------------------------- figures


def time_to(target: float, acc: dict[int, float], rollout_s: list[float]) -> tuple[float | None, int | None]:
    """Training seconds and rollout steps until the first evaluation with accuracy >= target."""
    for step in sorted(acc):
        if acc[step] >= target:
            return sum(rollout_s[:step]), step
    return None, None


def common_target(accs: list[dict[str, dict[int, float]]]) -> float:
    """The default target: a level every contender reaches in every seed, start + 0.9 x the smallest best gain."""
    start = accs[0]["ours"][0]
    gains = [max(a.values()) - start for acc in accs for a in acc.values()]
    return start + TARGET_FRACTION * max(0.0, min(gains))


def figures(results: dict[str, dict], acc: dict[str, dict[int, float]], target: float) -> dict:
    """One seed's figures: medians over its rollout steps, time to ``target`` and the ratios ours over TRL."""
    out = {"target_acc": target, "start_acc": acc["ours"][0]}
    for name, r in results.items():
        rollout_s, upr = r["rollout_s"], r["updates_per_rollout"]
        per_response = [s / g for s, g in zip(rollout_s, r["generated"])]
        t, steps = time_to(target, acc[name], rollout_s)
        out[name] = {
            "step_s": statistics.median(rollout_s) / upr,
            "rollout_step_s": statistics.median(rollout_s),
            "gen_phase_s": statistics.median(r["gen_s"]),
            "update_phase_s": statistics.median(r["update_s"]),
            "response_ms": statistics.median(per_response) * 1e3,
            "time_to_target_s": t,
            "steps_to_target": steps,
            "train_s_total": sum(rollout_s),
            "rollout_steps": len(rollout_s),
            "updates_per_rollout": upr,
            "generated_per_step": statistics.mean(r["generated"]),
            "peak_rss_mib": r.get("peak_rss_mib"),
            "val_acc": {str(k): v for k, v in sorted(acc[name].items())},
            "final_acc": acc[name][max(acc[name])],
            "best_acc": max(acc[name].values()),
        }
    ours, trl = out["ours"], out["trl"]
    out["speedup_step"] = trl["step_s"] / ours["step_s"]
    out["speedup_response"] = trl["response_ms"] / ours["response_ms"]
    both = ours["time_to_target_s"] and trl["time_to_target_s"]  # reached by both, after step 0
    out["speedup_time_to_target"] = trl["time_to_target_s"] / ours["time_to_target_s"] if both else None
    return out


def summary(per_seed: dict[int, dict]) -> dict:
    """Across seeds: the median and range of each ratio, and of each contender's steps to the target."""

    def spread(values: list) -> dict:
        values = [v for v in values if v is not None]
        if not values:
            return {"median": None, "min": None, "max": None, "n": 0}
        return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}

    figs = list(per_seed.values())
    out = {
        key: spread([f[key] for f in figs]) for key in ("speedup_step", "speedup_response", "speedup_time_to_target")
    }
    for name in CONTENDERS:
        for key in ("steps_to_target", "time_to_target_s", "step_s", "rollout_step_s", "final_acc", "peak_rss_mib"):
            out[f"{name}_{key}"] = spread([f[name][key] for f in figs])
    out["seeds_reached_by_both"] = sum(f["speedup_time_to_target"] is not None for f in figs)
    out["mean_curve"] = mean_curve(per_seed)
    return out


def mean_curve(per_seed: dict[int, dict]) -> dict:
    """Time to target on the curves averaged over seeds: each contender's mean accuracy at each evaluation and
    its mean training seconds up to it. One seed's first crossing of a level near the plateau moves by several
    evaluations with the evaluator's noise (mean@4 over 256 problems: about +-0.015); the mean of the seeds'
    curves has sqrt(seeds) less of it. Targets: ``MEAN_CURVE_FRACTIONS`` of the smaller of the two best gains."""
    figs = list(per_seed.values())
    start = figs[0]["start_acc"]
    curves, seconds = {}, {}
    for name in CONTENDERS:
        steps = sorted(int(s) for s in figs[0][name]["val_acc"])
        curves[name] = {s: statistics.mean(f[name]["val_acc"][str(s)] for f in figs) for s in steps}
        # mean step time per rollout step (seconds to step s = s x the mean over seeds of seconds per step)
        seconds[name] = statistics.mean(f[name]["train_s_total"] / f[name]["rollout_steps"] for f in figs)
    gain = min(max(c.values()) - start for c in curves.values())
    out = {
        "acc": {name: {str(s): a for s, a in c.items()} for name, c in curves.items()},
        "mean_step_s": seconds,
        "targets": {},
    }
    for fraction in MEAN_CURVE_FRACTIONS:
        target = start + fraction * gain
        reached = {name: next((s for s in sorted(c) if s > 0 and c[s] >= target), None) for name, c in curves.items()}
        entry = {"target_acc": target, "steps": reached, "speedup": None}
        if all(reached.values()):
            entry["speedup"] = (reached["trl"] * seconds["trl"]) / (reached["ours"] * seconds["ours"])
        out["targets"][str(fraction)] = entry
    return out


def report(per_seed: dict[int, dict], summ: dict, settings: dict) -> None:
    first = next(iter(per_seed.values()))
    print(
        f"\nDAPO training, engine vs TRL GRPOTrainer(loss_type='dapo'), taking turns step by step, "
        f"{settings['threads']} torch thread(s) each; {settings['steps']} rollout steps of "
        f"{settings['train_batch_size']} prompts x {settings['n']}, {first['ours']['updates_per_rollout']} updates "
        f"each, evaluated every {settings['eval_every']}; seeds {settings['seeds']}; medians over rollout steps"
    )
    for seed, fig in per_seed.items():
        rows = []
        for name in CONTENDERS:
            f = fig[name]
            ttt = "not reached"
            if f["time_to_target_s"] is not None:
                ttt = f"{f['time_to_target_s']:.1f} (step {f['steps_to_target']})"
            rows.append(
                [
                    name,
                    f["step_s"],
                    f["rollout_step_s"],
                    f["gen_phase_s"],
                    f["update_phase_s"],
                    f["generated_per_step"],
                    f["response_ms"],
                    f"{fig['start_acc']:.3f} -> {f['final_acc']:.3f}",
                    ttt,
                    f["peak_rss_mib"],
                ]
            )
        print(f"\nseed {seed}:")
        print_table(
            [
                "contender",
                "s / update",
                "s / rollout step",
                "(generation",
                "updates)",
                "responses / step",
                "ms / response",
                "val acc start -> end",
                f"s to acc >= {fig['target_acc']:.3f}",
                "peak RSS MiB",
            ],
            rows,
        )
        steps = sorted(int(s) for s in fig["ours"]["val_acc"])
        print("validation accuracy (mean@k, same evaluator) by rollout step:")
        print_table(
            ["rollout step", *map(str, steps)],
            [[name, *[fig[name]["val_acc"].get(str(s), float("nan")) for s in steps]] for name in CONTENDERS],
        )
    print("\nours over TRL, per seed:")
    fmt = lambda v: "n/a" if v is None else f"{v:.2f}x"  # noqa: E731
    print_table(
        ["seed", "per update (headline)", "per response", "time to target", "steps to target ours / trl"],
        [
            [
                seed,
                fmt(f["speedup_step"]),
                fmt(f["speedup_response"]),
                fmt(f["speedup_time_to_target"]),
                f"{f['ours']['steps_to_target']} / {f['trl']['steps_to_target']}",
            ]
            for seed, f in per_seed.items()
        ],
    )
    line = []
    for key, label in (
        ("speedup_step", "per update (headline)"),
        ("speedup_response", "per generated response"),
        ("speedup_time_to_target", "time to target"),
    ):
        s = summ[key]
        line.append(
            f"{label}: "
            + (
                "n/a"
                if s["median"] is None
                else f"{s['median']:.2f}x (seeds {s['min']:.2f}-{s['max']:.2f}, n={s['n']})"
            )
        )
    print("\nmedian over seeds, ours over TRL: " + "; ".join(line))
    mc = summ["mean_curve"]
    print(
        f"\non the curves averaged over the {len(per_seed)} seeds (mean s / rollout step: ours "
        f"{mc['mean_step_s']['ours']:.3f}, trl {mc['mean_step_s']['trl']:.3f}):"
    )
    print_table(
        ["fraction of the gain", "target acc", "steps ours / trl", "time to target, ours over TRL"],
        [
            [fraction, e["target_acc"], f"{e['steps']['ours']} / {e['steps']['trl']}", fmt(e["speedup"])]
            for fraction, e in mc["targets"].items()
        ],
    )


def evaluate(
    evaluator: Evaluator, model_dir: str, results: dict[str, dict], steps: int, every: int, start_acc: float | None
) -> dict[str, dict[int, float]]:
    """Accuracy of the start model and of every snapshot of both contenders, interleaved (not timed)."""
    begin = time.perf_counter()
    start_acc = evaluator.accuracy(model_dir) if start_acc is None else start_acc
    acc = {name: {0: start_acc} for name in CONTENDERS}
    for step in range(every, steps + 1, every):
        for name in CONTENDERS:
            acc[name][step] = evaluator.accuracy(results[name]["snapshots"][str(step)])
    print(f"evaluation: {2 * (steps // every)} snapshots in {time.perf_counter() - begin:.0f} s (not timed)")
    return acc


def main() -> None:
    p = parser(__doc__, repeats=False)
    p.add_argument("overrides", nargs="*", help="engine config overrides (key=value, verl's names), applied to both")
    p.add_argument(
        "--quick",
        action="store_true",
        help="6 rollout steps, evaluated every 3 on 64 held-out problems, one seed (about 2 minutes)",
    )
    p.add_argument(
        "--real-model",
        action="store_true",
        help="SmolLM2-135M-Instruct on word problems (configs/embedded_smollm2.yaml; `make model` first): "
        "6 rollout steps, evaluated every 3 on 128 held-out problems, one seed",
    )
    p.add_argument("--steps", type=int, default=None, help="rollout steps per contender")
    p.add_argument("--eval-every", type=int, default=None, help="rollout steps between snapshots")
    p.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="training seeds, each a paired run of both contenders (same start model, same seed)",
    )
    p.add_argument("--target", type=float, default=None, help="validation accuracy for time_to_target_s")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads of both (sets embedded.num_threads; default: the engine's setting)",
    )
    p.add_argument("--keep", type=Path, default=None, help="keep run dirs and logs here (default: a temp dir)")
    args = p.parse_args()
    warnings.filterwarnings("ignore", message=".*engine is not available.*")  # verl's optional engines
    os.environ["WANDB_MODE"] = "disabled"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    preset_name = "real-model" if args.real_model else "quick" if args.quick else "default"
    preset = PRESETS[preset_name]
    steps, every = args.steps or preset["steps"], args.eval_every or preset["eval_every"]
    seeds = args.seeds or preset["seeds"]
    if steps % every:
        raise SystemExit(f"--steps ({steps}) must be a multiple of --eval-every ({every})")
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seeds must be distinct (got {seeds})")
    with tempfile.TemporaryDirectory(prefix="bench_trl-") as tmp:
        root = (args.keep or Path(tmp)).resolve()
        results, accs, evaluator, start_acc = {}, {}, None, None
        for seed in seeds:
            out_dir = root / f"seed_{seed}"
            out_dir.mkdir(parents=True, exist_ok=True)
            overrides = engine_overrides(out_dir / "ours_run", steps, every, args.threads, seed) + preset["overrides"]
            overrides += args.overrides
            _, c = engine_config(overrides, preset["config"])
            model_dir = start_model(c)
            train_file, val_files = data_files(c)
            check_prompt_parity(c, model_dir, train_file)
            spec = {
                "overrides": overrides,
                "config_name": preset["config"],
                "model_dir": model_dir,
                "train_file": train_file,
                "steps": steps,
                "eval_every": every,
                "out_dir": str(out_dir),
            }
            print(f"seed {seed}: training both")
            results[seed] = run_alternating(spec, out_dir)

            if c.embedded.num_threads is not None:
                torch.set_num_threads(c.embedded.num_threads)
            if evaluator is None:
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()  # one "Loading weights" bar per snapshot otherwise
                evaluator = Evaluator(c, model_dir, val_files)  # one evaluator (its own seed) for every seed
            accs[seed] = evaluate(evaluator, model_dir, results[seed], steps, every, start_acc)
            start_acc = accs[seed]["ours"][0]  # the same start model for every seed

        target = args.target if args.target is not None else common_target(list(accs.values()))
        per_seed = {seed: figures(results[seed], accs[seed], target) for seed in seeds}
        summ = summary(per_seed)
        settings = {
            "steps": steps,
            "eval_every": every,
            "seeds": seeds,
            "threads": results[seeds[0]]["ours"]["torch_threads"],
            "n": c.rollout.n,
            "train_batch_size": c.data.train_batch_size,
            "gen_batch_size": c.data.gen_batch_size,
            "ppo_mini_batch_size": c.actor.ppo_mini_batch_size,
            "max_response_length": c.data.max_response_length,
            "lr": c.actor.lr,
            "val_n": c.rollout.val_n,
            "val_top_p": c.rollout.val_top_p,
            "overrides": args.overrides,
            "filter_groups": c.dapo.filter.enable,
            "preset": preset_name,
            "config": preset["config"],
            "dtype": c.embedded.dtype,
        }
        report(per_seed, summ, settings)
        write_json(
            args.json,
            {
                "target_acc": target,
                "seeds": {str(k): v for k, v in per_seed.items()},
                "summary": summ,
                "settings": settings,
            },
        )


if __name__ == "__main__":
    main()
