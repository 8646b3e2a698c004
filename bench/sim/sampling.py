"""Dynamic sampling: generation spent per trained response, verl's two behaviours against dapo.sampling.

A simulation, not a test. Run: python -m bench.sim.sampling [--json PATH] [--seeds 5] [--steps 200]
(~30 s on 2 cores with the defaults: 2 worlds x 5 seeds x 200 steps x 7 policies).

World (the same for every policy, drawn once per seed):

* N unique prompts (default 4096; with the default batch that is ~11 verl-recipe steps per epoch, as
  DAPO-Math-17k's 17.4k prompts at 1536 prompts per step). The data loader is one shuffled permutation per
  epoch, shared by all policies; each policy reads it at its own pace.
* Prompt i's pass rate at train step t is ``p_i(t) = sigmoid(b_i + r_i * A(t))``: initial logit
  ``b_i ~ Normal(-3, 3)`` (U-shaped pass rates with mean ~0.19: most prompts start near-unsolved, some are
  solved already), learnability ``r_i ~ Uniform(0.5, 1.5)`` and ability gain
  ``A(t) = gain (1 - e^{-3t/S}) / (1 - e^{-3})`` (fast early progress, then a plateau), so the data shifts toward
  "solved". Two presets: ``typical`` (gain 6: mean pass rate 0.19 -> 0.75; kept fraction of a fresh prompt
  0.49 at the start, ~0.6 early on, 0.47 at the end, always above 1/3, so verl's recipe needs one round) and
  ``saturating`` (gain 9: pass rate -> 0.89, kept fraction falls to 0.25, so verl's recipe needs two rounds
  late in the run). A fraction
  ``--unsolvable`` (default 0.03) of prompts has p = 0 throughout (wrong or unparseable reference answers,
  which DAPO-Math-17k has).
* Outcomes are pre-drawn: ``K[t, i, a] ~ Binomial(G, p_i(t))`` correct responses for the a-th generation of
  prompt i in step t (a < 2; a later attempt in the same step reuses a modulo 2, which the default sizes
  never reach). Every policy that generates prompt i in step t sees the same K, so the comparison is paired.
* The world does not depend on the policy: every policy trains on train_batch_size groups with signal per
  step, and progress is taken as a function of the step only. What this leaves out: carried groups are one
  policy version stale (reported as off_policy_frac) and skipped prompts are not trained on while skipped.
* Generation latency (reported, not the goal): each group takes ``D ~ LogNormal`` with mean 1 and sigma 0.4
  (pre-drawn per (t, i, a) like K); a round's prompts are generated concurrently and the round lasts as long
  as its slowest group. ``gen_time_per_step`` is in units of the mean group time.

Policies (same world, same data order, same outcomes):

1. ``verl_recipe``: verl-recipe's V0 DAPO trainer. Rounds of gen_batch_size = 3 x train_batch_size prompts,
   keep the mixed groups, stop when train_batch_size are kept, truncate, discard the surplus. Written here
   independently of dapo.sampling; the bench checks that ``BatchFiller`` with every option off reproduces
   it exactly.
2. ``verl_v1``: verl 0.9.1's V1 sync trainer with ``algorithm.filter_groups`` on, as
   ``verl/trainer/ppo/v1/replay_buffer.py::ReplayBuffer.sample`` and ``trainer_base.py`` are written:
   ``prepare_step`` dispatches train_batch_size prompts (gen_batch_size is forced to 1); the buffer polls every
   ``poll_interval`` (2 s in verl; here 0.05 of the mean group time); each poll evicts the finished constant
   groups and, while fewer than train_batch_size groups are sampleable and it is not draining, adds 2 refill
   credits per eviction; it dispatches ``min(credit, max_inflight_gen_batches x train_batch_size - in_flight)``
   prompts; once train_batch_size groups are sampleable it stops dispatching, zeroes the credit, waits until
   nothing is in flight (drain), selects train_batch_size groups and discards every other sampleable group.
   Nothing carries between steps; ``max_num_gen_batches`` is ignored (as verl does). V1 has no rounds:
   its ``rounds_per_step`` is the number of dispatches (the initial batch plus each refill), which depends
   on the poll interval, so compare it through ``gen_time_per_step`` instead.
3. ``ours_*``: the real ``dapo.sampling.BatchFiller``, each option alone and all together, with its default
   knobs (safety_margin 0.25, min_gen_batch_size train/4, kept_frac_decay 0.5, max_carry_age 1,
   saturation_window 2, reprobe_after 4). Saturation skip: candidates are drawn from the loader, ``admit``
   filters them, the shortfall is drawn again (at most one epoch of offers per round).

Figures: ``generated_per_trained`` = prompts generated / prompts trained over the whole run (= responses
generated per trained response); ``rounds_per_step`` = mean generation rounds per step; both means over seeds.
The goal: ours_all generates at least 30% less per trained response than verl_recipe, without more rounds per
step.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from bench.common import parser, print_table, write_json
from dapo.sampling import BatchFiller

ATTEMPTS = 2


@dataclass
class World:
    """Pre-drawn outcomes and durations of one seed: K [S, N, A] int8, D [S, N, A] float32."""

    correct: np.ndarray  # [S, N, A] correct responses out of G
    duration: np.ndarray  # [S, N, A] group generation time, mean 1
    order: np.ndarray  # [E*N] concatenated per-epoch permutations (the data loader)
    mean_pass: np.ndarray  # [S] mean pass rate per step, for the report
    mixed_prob: np.ndarray  # [S] probability that a fresh prompt's group is mixed (the kept fraction)
    group_size: int


def make_world(
    seed: int,
    steps: int,
    num_prompts: int,
    group_size: int,
    unsolvable: float,
    epochs: int,
    logit_mean: float = -3.0,
    logit_std: float = 3.0,
    gain_max: float = 6.0,
) -> World:
    rng = np.random.default_rng(seed)
    b = rng.normal(logit_mean, logit_std, num_prompts)  # [N] initial logit
    r = rng.uniform(0.5, 1.5, num_prompts)  # [N] learnability
    t = np.arange(steps)
    gain = gain_max * (1 - np.exp(-3 * t / steps)) / (1 - np.exp(-3))  # [S]
    p = 1 / (1 + np.exp(-(b[None, :] + r[None, :] * gain[:, None])))  # [S, N]
    p[:, rng.random(num_prompts) < unsolvable] = 0.0
    correct = rng.binomial(group_size, p[:, :, None], size=(steps, num_prompts, ATTEMPTS)).astype(np.int8)
    sigma = 0.4
    duration = rng.lognormal(-(sigma**2) / 2, sigma, size=(steps, num_prompts, ATTEMPTS)).astype(np.float32)
    order = np.concatenate([rng.permutation(num_prompts) for _ in range(epochs)])
    mixed_prob = 1 - p**group_size - (1 - p) ** group_size  # [S, N]
    return World(correct, duration, order, p.mean(axis=1), mixed_prob.mean(axis=1), group_size)


class Loader:
    """One policy's cursor over the shared data order, and its per-step attempt counts."""

    def __init__(self, world: World):
        self.world = world
        self.cursor = 0
        n = world.correct.shape[1]
        self._seen_step = np.full(n, -1)
        self._seen_count = np.zeros(n, dtype=np.int64)

    def take(self, n: int) -> np.ndarray:
        if self.cursor + n > len(self.world.order):
            raise RuntimeError("the run read more epochs of data order than pre-drawn; raise `epochs` in simulate()")
        ids = self.world.order[self.cursor : self.cursor + n]
        self.cursor += n
        return ids

    def generate(self, step: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(correct counts [n], durations [n]) of generating `ids` at `step` (each id once per call)."""
        fresh = self._seen_step[ids] != step
        self._seen_count[ids[fresh]] = 0
        self._seen_step[ids] = step
        attempt = self._seen_count[ids] % ATTEMPTS
        self._seen_count[ids] += 1
        return self.world.correct[step, ids, attempt], self.world.duration[step, ids, attempt]


def mixed(correct: np.ndarray, group_size: int) -> np.ndarray:
    return (correct > 0) & (correct < group_size)


@dataclass
class Tally:
    generated: list[int] = field(default_factory=list)  # per step
    rounds: list[int] = field(default_factory=list)
    gen_time: list[float] = field(default_factory=list)
    trained: int = 0
    carried: int = 0
    skipped: int = 0

    def summary(self, train_batch_size: int, phases: int = 3) -> dict:
        gen = np.array(self.generated, dtype=float)
        rounds = np.array(self.rounds, dtype=float)
        chunks = np.array_split(np.arange(len(gen)), phases)
        return {
            "generated_per_trained": gen.sum() / self.trained,
            "rounds_per_step": rounds.mean(),
            "max_rounds": int(rounds.max()),
            "multi_round_step_frac": float((rounds > 1).mean()),
            "gen_time_per_step": float(np.mean(self.gen_time)),
            "off_policy_frac": self.carried / self.trained,
            "skipped_per_trained": self.skipped / self.trained,
            "by_phase": [
                {
                    "generated_per_trained": gen[c].sum() / (len(c) * train_batch_size),
                    "rounds_per_step": rounds[c].mean(),
                }
                for c in chunks
            ],
        }


def run_verl_recipe(world: World, steps: int, train_batch_size: int, gen_batch_size: int) -> Tally:
    """verl-recipe V0: fixed rounds of gen_batch_size, truncate, discard the surplus."""
    loader, tally = Loader(world), Tally()
    for step in range(steps):
        kept = generated = rounds = 0
        gen_time = 0.0
        while kept < train_batch_size:
            correct, duration = loader.generate(step, loader.take(gen_batch_size))
            kept += int(mixed(correct, world.group_size).sum())
            generated += gen_batch_size
            rounds += 1
            gen_time += float(duration.max())
        tally.generated.append(generated)
        tally.rounds.append(rounds)
        tally.gen_time.append(gen_time)
        tally.trained += train_batch_size
    return tally


def run_verl_v1(
    world: World, steps: int, train_batch_size: int, max_inflight_gen_batches: int = 1, poll_interval: float = 0.05
) -> Tally:
    """verl 0.9.1 V1 sync ReplayBuffer.sample with DAPO filtering (see the module docstring)."""
    loader, tally = Loader(world), Tally()
    cap = max_inflight_gen_batches * train_batch_size
    for step in range(steps):
        finish: list[np.ndarray] = []  # in-flight finish times and outcomes, per dispatch
        outcome: list[np.ndarray] = []
        now = 0.0
        dispatches = generated = 0

        def dispatch(n: int) -> None:
            nonlocal dispatches, generated
            correct, duration = loader.generate(step, loader.take(n))
            finish.append(now + duration.astype(np.float64))
            outcome.append(correct)
            dispatches += 1
            generated += n

        dispatch(train_batch_size)  # prepare_step: one train batch of prompts
        sampleable = 0
        credit = 0
        draining = False
        while True:
            fin = np.concatenate(finish)
            out = np.concatenate(outcome)
            done_now = fin <= now + 1e-12
            terminal = out[done_now]
            finish, outcome = [fin[~done_now]], [out[~done_now]]  # in flight
            evicted = int((~mixed(terminal, world.group_size)).sum())
            sampleable += len(terminal) - evicted
            in_flight = len(finish[0])
            has_enough = sampleable >= train_batch_size
            if has_enough:
                draining, credit = True, 0
            elif not draining:
                credit += 2 * evicted
            if not draining and credit > 0:
                n = min(credit, max(0, cap - in_flight))
                if n > 0:
                    dispatch(n)
                    credit -= n
                    continue  # verl re-polls at once after a dispatch
            if has_enough and in_flight == 0:
                break  # select train_batch_size, discard the other sampleable groups
            # sleep until the next poll at which something finishes (polls in between change nothing)
            nxt = float(finish[0].min())
            now = max(now + poll_interval, math.ceil(nxt / poll_interval - 1e-9) * poll_interval)
        tally.generated.append(generated)
        tally.rounds.append(dispatches)
        tally.gen_time.append(now)
        tally.trained += train_batch_size
    return tally


def run_filler(world: World, steps: int, filler: BatchFiller) -> Tally:
    """Drive the real BatchFiller the way an engine does."""
    loader, tally = Loader(world), Tally()
    group_size = world.group_size
    arange = torch.arange(group_size)
    epoch = world.correct.shape[1]
    for step in range(steps):
        filler.begin_step(step)
        gen_time = 0.0
        while not filler.done:
            n = filler.next_round_size()
            chosen: list[np.ndarray] = []
            have = offered = 0
            while have < n and offered < epoch:
                cand = loader.take(min(n - have, epoch - offered))
                offered += len(cand)
                keep = np.array(filler.admit(cand.tolist()), dtype=bool)
                chosen.append(cand[keep])
                have += int(keep.sum())
            ids = np.concatenate(chosen)
            correct, duration = loader.generate(step, ids)
            acc = arange[None, :] < torch.from_numpy(correct.astype(np.int64))[:, None]  # [n, G] bool
            keys = ids.tolist()
            filler.add_round(keys, acc, keys)
            gen_time += float(duration.max()) if len(ids) else 0.0
        _, metrics = filler.end_step()
        tally.generated.append(int(metrics["dapo/generated_prompts"]))
        tally.rounds.append(int(metrics["train/num_gen_batches"]))
        tally.gen_time.append(gen_time)
        tally.trained += filler.train_batch_size
        tally.carried += int(metrics["dapo/carried_groups"])
        tally.skipped += int(metrics["dapo/skipped_prompts"])
    return tally


OURS = {
    "ours_off": {},
    "ours_adaptive": {"adaptive": True},
    "ours_carry": {"carry_over": True},
    "ours_skip": {"skip_saturated": True},
    "ours_all": {"adaptive": True, "carry_over": True, "skip_saturated": True},
}

# initial-logit mean and spread, logit gained over the run by an average prompt
WORLDS = {
    "typical": {"logit_mean": -3.0, "logit_std": 3.0, "gain_max": 6.0},
    "saturating": {"logit_mean": -3.0, "logit_std": 3.0, "gain_max": 9.0},
}


def simulate(world_params: dict, args: argparse.Namespace) -> dict:
    """All policies on `args.seeds` draws of one world; figures are means over seeds."""
    tbs = args.train_batch_size
    gbs = args.gen_batch_size or 3 * tbs
    # enough epochs of data order for the hungriest policy (up to 4 rounds of gen_batch_size per step)
    epochs = math.ceil(args.steps * gbs * 4 / args.prompts) + 2
    per_policy: dict[str, list[dict]] = {}
    mean_pass, mixed_prob = [], []
    for seed in range(args.seeds):
        world = make_world(seed, args.steps, args.prompts, args.group_size, args.unsolvable, epochs, **world_params)
        mean_pass.append(world.mean_pass)
        mixed_prob.append(world.mixed_prob)
        tallies = {
            "verl_recipe": run_verl_recipe(world, args.steps, tbs, gbs),
            "verl_v1": run_verl_v1(world, args.steps, tbs, args.max_inflight_gen_batches),
        }
        for name, options in OURS.items():
            tallies[name] = run_filler(world, args.steps, BatchFiller(tbs, gbs, **options))
        # two ways must agree: BatchFiller with every option off is verl's recipe, step by step
        assert tallies["ours_off"].generated == tallies["verl_recipe"].generated, "BatchFiller(off) != verl recipe"
        assert tallies["ours_off"].rounds == tallies["verl_recipe"].rounds, "BatchFiller(off) != verl recipe"
        for name, tally in tallies.items():
            per_policy.setdefault(name, []).append(tally.summary(tbs))

    def mean_over_seeds(runs: list[dict]) -> dict:
        out = {key: float(np.mean([r[key] for r in runs])) for key in runs[0] if key != "by_phase"}
        out["max_rounds"] = int(max(r["max_rounds"] for r in runs))
        out["by_phase"] = [
            {key: float(np.mean([r["by_phase"][i][key] for r in runs])) for key in runs[0]["by_phase"][i]}
            for i in range(len(runs[0]["by_phase"]))
        ]
        out["per_seed_generated_per_trained"] = [r["generated_per_trained"] for r in runs]
        return out

    policies = {name: mean_over_seeds(runs) for name, runs in per_policy.items() if name != "ours_off"}
    base = policies["verl_recipe"]
    for fig in policies.values():
        fig["generation_saved_vs_recipe"] = 1 - fig["generated_per_trained"] / base["generated_per_trained"]
    passes, kept = np.mean(mean_pass, axis=0), np.mean(mixed_prob, axis=0)
    thirds = np.array_split(np.arange(args.steps), 3)
    ours, recipe = policies["ours_all"], policies["verl_recipe"]
    saved = ours["generation_saved_vs_recipe"]
    rounds_ok = ours["rounds_per_step"] <= recipe["rounds_per_step"]
    return {
        "policies": policies,
        "goal": {"generation_saved": saved, "rounds_not_higher": rounds_ok, "met": saved >= 0.30 and rounds_ok},
        "world": {
            **world_params,
            "mean_pass_rate": {
                "first_step": float(passes[0]),
                "last_step": float(passes[-1]),
                "by_phase": [float(passes[c].mean()) for c in thirds],
            },
            "kept_fraction": {
                "first_step": float(kept[0]),
                "last_step": float(kept[-1]),
                "by_phase": [float(kept[c].mean()) for c in thirds],
            },
        },
    }


def report(name: str, result: dict) -> None:
    policies, world = result["policies"], result["world"]
    pass_rate, kept = world["mean_pass_rate"], world["kept_fraction"]
    print(
        f"\n== world '{name}': initial logit Normal({world['logit_mean']}, {world['logit_std']}), gain "
        f"{world['gain_max']}; mean pass rate {pass_rate['first_step']:.2f} -> {pass_rate['last_step']:.2f}, "
        f"kept fraction of fresh prompts {kept['first_step']:.2f} -> {kept['last_step']:.2f}"
    )
    headers = [
        "policy",
        "gen/trained",
        "saved",
        "rounds/step",
        "max rounds",
        ">1 round",
        "gen time/step",
        "off-policy",
        "skipped/trained",
    ]
    print_table(
        headers,
        [
            [
                name,
                f["generated_per_trained"],
                f"{f['generation_saved_vs_recipe']:+.1%}",
                f["rounds_per_step"],
                f["max_rounds"],
                f"{f['multi_round_step_frac']:.1%}",
                f["gen_time_per_step"],
                f"{f['off_policy_frac']:.1%}",
                f["skipped_per_trained"],
            ]
            for name, f in policies.items()
        ],
    )
    print(
        "by third of the run (mean pass rate "
        + " / ".join(f"{x:.2f}" for x in pass_rate["by_phase"])
        + ", kept fraction of fresh prompts "
        + " / ".join(f"{x:.2f}" for x in kept["by_phase"])
        + "): gen/trained | rounds/step"
    )
    print_table(
        ["policy", "early", "middle", "late"],
        [
            [name] + [f"{ph['generated_per_trained']:.2f} | {ph['rounds_per_step']:.2f}" for ph in f["by_phase"]]
            for name, f in policies.items()
        ],
    )
    goal, ours, recipe = result["goal"], policies["ours_all"], policies["verl_recipe"]
    print(
        f"goal (ours_all >= 30% less generation per trained response than verl_recipe, rounds/step not higher): "
        f"{'MET' if goal['met'] else 'NOT MET'} ({goal['generation_saved']:.1%} less, rounds/step "
        f"{ours['rounds_per_step']:.3f} vs {recipe['rounds_per_step']:.3f})"
    )


def main() -> None:
    p = parser(__doc__, repeats=False)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--steps", type=int, default=200, help="train steps per simulated run")
    p.add_argument(
        "--worlds",
        nargs="+",
        default=list(WORLDS),
        choices=list(WORLDS),
        help="world presets to simulate; the first one is the headline ('policies' in the JSON)",
    )
    p.add_argument("--train-batch-size", type=int, default=128)
    p.add_argument("--gen-batch-size", type=int, default=None, help="default 3 x train batch size (DAPO's)")
    p.add_argument("--group-size", type=int, default=16, help="responses per prompt (rollout.n)")
    p.add_argument("--prompts", type=int, default=4096, help="unique prompts in the data set")
    p.add_argument("--unsolvable", type=float, default=0.03, help="fraction of prompts nobody can solve")
    p.add_argument("--max-inflight-gen-batches", type=int, default=1, help="verl V1's cap (its default: 1)")
    args = p.parse_args()

    start = time.perf_counter()
    results = {name: simulate(WORLDS[name], args) for name in args.worlds}
    elapsed = time.perf_counter() - start
    gbs = args.gen_batch_size or 3 * args.train_batch_size
    print(
        f"dynamic sampling, {args.seeds} seeds x {args.steps} steps: train batch {args.train_batch_size} prompts x "
        f"G={args.group_size}, gen batch {gbs}, {args.prompts} prompts ({args.unsolvable:.0%} unsolvable)"
    )
    print("check: BatchFiller with all options off reproduces verl_recipe step by step in every run: OK")
    for name, result in results.items():
        report(name, result)
    print("\nverl_v1 'rounds' are dispatches (initial batch + refills), not rounds; compare gen time/step instead")
    print(f"simulated in {elapsed:.1f} s")
    headline = results[args.worlds[0]]
    write_json(
        args.json,
        {
            "policies": headline["policies"],
            "goal": headline["goal"],
            "headline_world": args.worlds[0],
            "worlds": results,
            "setup": {
                "seeds": args.seeds,
                "steps": args.steps,
                "train_batch_size": args.train_batch_size,
                "gen_batch_size": gbs,
                "group_size": args.group_size,
                "prompts": args.prompts,
                "unsolvable": args.unsolvable,
                "max_inflight_gen_batches": args.max_inflight_gen_batches,
                "filler_defaults": {
                    "safety_margin": BatchFiller(1, 1).safety_margin,
                    "saturation_window": BatchFiller(1, 1).saturation_window,
                    "reprobe_after": BatchFiller(1, 1).reprobe_after,
                    "kept_frac_decay": BatchFiller(1, 1).kept_frac_decay,
                    "max_carry_age": BatchFiller(1, 1).max_carry_age,
                },
                "seconds": elapsed,
            },
        },
    )


if __name__ == "__main__":
    main()
