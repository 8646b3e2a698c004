"""verl's three trainer modes on paper: step time and idle GPU time of the paper's 32B DAPO job, simulated.

A discrete-event simulation of one cluster running DAPO in verl 0.9.1's ``trainer.v1.trainer_mode`` ``sync``,
``colocate_async`` and ``separate_async``, driven by a distribution of response lengths. It answers what a GPU run
would take days to: how much of the cluster a synchronous step leaves idle while the longest responses of a round
finish, and what the asynchronous modes (partial rollouts, a staleness bound) would give back. It is arithmetic on
stated assumptions, not a measurement; ``docs/benchmarks.md`` reports it with them.

What each mode does, as verl 0.9.1's code does it (``verl/trainer/ppo/v1/``):

* ``sync``: the rollout generates rounds of prompts x ``rollout.n`` responses on every GPU; a round ends when its
  longest response ends; DAPO's dynamic sampling keeps the groups with mixed accuracy and generates rounds until
  ``data.train_batch_size`` groups are kept; then the same GPUs train, then the weights are synced in process. As
  this recipe's sampler does (``dapo.sampling.BatchFiller``): rounds sized from the kept fraction seen so far
  (``adaptive_rounds``, at most ``data.gen_batch_size``), surplus groups carried to the next step
  (``carry_over``); with both off, verl's own DAPO recipe (full rounds, surplus dropped).
* ``colocate_async``: the same GPUs alternate. The rollout keeps ``(1 + num_warmup_batches) x train_batch_size``
  prompts in flight and stops as soon as ``train_batch_size`` kept groups are finished: unfinished responses are
  aborted and resume, their tokens kept, in the next rollout phase on newer weights (a partial rollout). A group the
  filter drops is refilled at once; a finished group older than ``max_off_policy_threshold`` steps is dropped and
  refilled (strategy ``drop``).
* ``separate_async``: ``rollout_gpus`` generate all the time; the others train ``train_batch_size /
  ppo_mini_batch_size`` mini-batches a step, each as soon as that many kept groups are finished (the trainer waits
  otherwise), then the weights are broadcast to the rollout (both sides wait for it; running responses resume
  after it, tokens kept).

Assumptions (each a ``Setup`` field, ``--set key=value``): a rollout replica decodes ``slots`` sequences at once and
every decoding step takes ``decode_step_s`` whatever the batch (memory-bound decoding), so an unused slot is lost
throughput; prefilling a token stalls its replica (2 x parameters FLOPs at ``mfu`` of the replica's peak): a
response's prompt when it starts, its prompt and its tokens so far again when it resumes after an abort (the
prefix cache is cleared at a weight update); request scheduling costs nothing; a trained token costs 8 x parameters
FLOPs (forward, backward and the old-log-prob forward) at ``mfu``; whether a group is kept does not depend on its
lengths; response lengths are log-normal (a per-prompt and a per-response factor) clipped at the budget, or drawn
from measured lengths scaled to the budget (``--lengths``). The separate mode's split of the GPUs is the user's
choice: the figures give it at ``rollout_gpus`` and at the split that trains the most responses a second.

Run: python -m bench.sim.async_loops [--steps N] [--lengths FILE] [--json PATH] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
from collections import deque
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from bench.common import print_table, write_json

MODES = ("sync", "colocate_async", "separate_async")
SYNC_MAX_SPAN = 2  # sync: a carried group is trained one step after its own at the latest (max_carry_age 1)


@dataclass(frozen=True)
class Setup:
    """The job and the cluster. Defaults: the paper's 32B run (UPSTREAM: 16 nodes x 8 GPUs, vLLM tensor parallel 4,
    512 prompts x 16, 16 updates a step, generation rounds of 1536 prompts, 20K budget) on H100s."""

    gpus: int = 128
    gpus_per_replica: int = 4  # vLLM tensor parallel size
    slots: int = 128  # sequences a replica decodes at once (KV memory: about 160 GB for 20K-token sequences)
    decode_step_s: float = 0.03  # one decoding step of a replica (memory-bound: about 33 tokens/s a sequence)
    params: float = 32e9
    mfu: float = 0.35  # of the bf16 peak in training
    peak_flops: float = 989e12  # H100 SXM dense bf16
    sync_colocated_s: float = 15.0  # weight update in process (CUDA IPC)
    sync_separate_s: float = 30.0  # weight broadcast to the rollout GPUs (NCCL)
    rollout_gpus: int = 64  # separate_async: GPUs that only generate
    train_batch_size: int = 512  # prompts (groups) trained a step
    gen_batch_size: int = 1536  # sync: prompts a generation round
    ppo_mini_batch_size: int = 32  # prompts an update: 16 updates a step
    n: int = 16
    max_response_length: int = 20480
    prompt_tokens: int = 300
    keep_frac: float = 0.45  # groups dynamic sampling keeps (mixed accuracy)
    max_num_gen_batches: int = 10  # sync: rounds a step at most
    adaptive_rounds: bool = True  # sync: rounds sized from the kept fraction (this recipe); false: full rounds
    safety_margin: float = 0.25  # sync: extra prompts in an adaptive round (dapo.sampling's default)
    carry_over: bool = True  # sync: surplus groups trained next step (this recipe); false: dropped (verl's recipe)
    num_warmup_batches: int = 1  # async: extra batches of prompts in flight
    max_off_policy_threshold: int = 8  # async: steps from a prompt's submission to its training, at most
    median_length: float = 4000.0  # tokens: the log-normal's median
    sigma_prompt: float = 0.6  # spread of a prompt's typical length (log scale)
    sigma_response: float = 0.5  # spread of the responses of one prompt (log scale)

    @property
    def train_token_s(self) -> float:  # GPU-seconds a trained token costs
        return 8 * self.params / (self.mfu * self.peak_flops)

    @property
    def prefill_token_s(self) -> float:  # seconds a prefilled token stalls its replica
        return 2 * self.params / (self.mfu * self.peak_flops * self.gpus_per_replica)


@dataclass
class Group:
    gid: int
    tag: int  # the step at which its prompt was submitted
    lengths: list[int]
    keep: bool  # dynamic sampling keeps it (mixed accuracy)
    left: int = 0  # responses not finished

    def tokens(self, prompt_tokens: int) -> int:
        return sum(self.lengths) + prompt_tokens * len(self.lengths)


class Lengths:
    """Response lengths of a prompt's group: log-normal with a per-prompt and a per-response factor, or drawn from
    measured groups (``groups``: each prompt's response lengths as fractions of their budget, scaled to this one)."""

    def __init__(self, s: Setup, rng: random.Random, groups: list[list[float]] | None = None) -> None:
        self.s, self.rng, self.groups = s, rng, groups

    def group(self) -> list[int]:
        s, budget = self.s, self.s.max_response_length
        if self.groups is not None:  # one measured prompt's responses, drawn n times with replacement
            measured = self.rng.choice(self.groups)
            return [max(1, min(budget, round(self.rng.choice(measured) * budget))) for _ in range(s.n)]
        mu = math.log(s.median_length) + s.sigma_prompt * self.rng.gauss(0, 1)
        return [max(1, min(budget, round(math.exp(mu + s.sigma_response * self.rng.gauss(0, 1))))) for _ in range(s.n)]


class Rollout:
    """Replicas decoding responses FIFO on ``slots`` equal slots, one token every ``token_s`` seconds each."""

    def __init__(self, slots: int, token_s: float, prefill: float = 0.0, prompt_tokens: int = 0) -> None:
        self.slots, self.token_s = slots, token_s
        # a prefilled token stalls the replica's slots: in slot-seconds, ``prefill`` decoding steps of one slot
        self.prefill, self.prompt_tokens = prefill, prompt_tokens
        self.now, self.free = 0.0, slots
        self.queue: deque[tuple[Group, int]] = deque()  # (group, response index) waiting for a slot
        self.remaining: dict[tuple[int, int], float] = {}  # tokens left per response
        self.running: dict[tuple[int, int], tuple[float, Group, int]] = {}  # start time, group, index
        self.heap: list[tuple[float, int, int]] = []  # (finish time, gid, index)
        self.done: deque[Group] = deque()  # finished groups, in finishing order
        self.busy = self.capacity = 0.0  # slot-seconds decoding / available while the rollout runs
        self.generated = 0.0  # tokens decoded

    def submit(self, group: Group) -> None:
        group.left = len(group.lengths)
        for i, length in enumerate(group.lengths):
            self.remaining[(group.gid, i)] = float(length) + self.prompt_tokens * self.prefill
            self.queue.append((group, i))
        self._fill()

    def _fill(self) -> None:
        while self.free and self.queue:
            group, i = self.queue.popleft()
            self.free -= 1
            finish = self.now + self.remaining[(group.gid, i)] * self.token_s
            self.running[(group.gid, i)] = (self.now, group, i)
            heapq.heappush(self.heap, (finish, group.gid, i))

    def _advance(self, t: float) -> None:
        dt = t - self.now
        self.busy += (self.slots - self.free) * dt
        self.capacity += self.slots * dt
        self.generated += (self.slots - self.free) * dt / self.token_s
        self.now = t

    def run(self, until: float = math.inf, ready=None) -> float:
        """Decode until time ``until``, or until ``ready()`` is true (checked after each finished group), or until
        nothing is left; return the time."""
        self._fill()  # responses aborted earlier resume first
        while self.heap and (ready is None or not ready()):
            finish, gid, i = self.heap[0]
            if finish > until:
                break
            heapq.heappop(self.heap)
            self._advance(finish)
            _, group, _ = self.running.pop((gid, i))
            del self.remaining[(gid, i)]
            self.free += 1
            group.left -= 1
            if group.left == 0:
                self.done.append(group)
            self._fill()
        if until != math.inf and (ready is None or not ready()) and self.now < until:
            self._advance(until)
        return self.now

    def abort(self) -> None:
        """Stop every running response, keeping its tokens: it resumes first when the rollout runs again."""
        for key, (start, group, i) in sorted(self.running.items(), key=lambda kv: kv[1][0], reverse=True):
            self.remaining[key] -= (self.now - start) / self.token_s
            done = group.lengths[i] - max(0.0, min(group.lengths[i], self.remaining[key]))  # tokens generated so far
            self.remaining[key] += (self.prompt_tokens + done) * self.prefill  # prefilled again on resuming
            self.queue.appendleft((group, i))
        self.running.clear()
        self.heap.clear()
        self.free = self.slots

    def wait(self, seconds: float, idle: bool) -> None:
        """Time passes with nothing decoding (``idle``: counted as unused capacity; otherwise the GPUs train)."""
        if idle:
            self.capacity += self.slots * seconds
        self.now += seconds


@dataclass
class StepRecord:
    time: float  # seconds the step took
    train_s: float  # seconds training
    trainer_wait_s: float  # seconds the trainer waited for data (separate_async)
    spans: list[int]  # staleness of the trained groups: steps from submission to training (1 = fresh)
    dropped_stale: int  # groups dropped for staleness
    decode_busy: float = 0.0  # slot-seconds the rollout decoded during the step
    decode_capacity: float = 0.0  # slot-seconds it could have decoded (while it ran, and while weights moved)


class Simulation:
    def __init__(self, s: Setup, mode: str, seed: int, lengths: list[float] | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.s, self.mode = s, mode
        self.rng = random.Random(seed)
        self.lengths = Lengths(s, self.rng, lengths)
        rollout_gpus = s.rollout_gpus if mode == "separate_async" else s.gpus
        self.rollout_gpus = rollout_gpus
        self.train_gpus = s.gpus - s.rollout_gpus if mode == "separate_async" else s.gpus
        if rollout_gpus % s.gpus_per_replica or rollout_gpus <= 0 or self.train_gpus <= 0:
            raise ValueError("rollout_gpus must be a positive multiple of gpus_per_replica, below gpus")
        self.rollout = Rollout(
            rollout_gpus // s.gpus_per_replica * s.slots,
            s.decode_step_s,
            prefill=s.prefill_token_s * s.slots / s.decode_step_s,
            prompt_tokens=s.prompt_tokens,
        )
        self.next_gid, self.step = 0, 0
        self.waiting: list[Group] = []  # finished, kept, not yet trained
        self.wasted_tokens = 0.0
        self.records: list[StepRecord] = []

    def new_group(self) -> Group:
        self.next_gid += 1
        return Group(self.next_gid, self.step, self.lengths.group(), self.rng.random() < self.s.keep_frac)

    def submit(self, count: int) -> None:
        for _ in range(count):
            self.rollout.submit(self.new_group())

    def collect(self) -> int:
        """Move finished groups into ``waiting``: the filter's drops and stale ones are refilled at once (async);
        return how many were dropped for staleness."""
        stale = 0
        limit = self.s.max_off_policy_threshold if self.mode != "sync" else SYNC_MAX_SPAN
        while self.rollout.done:
            group = self.rollout.done.popleft()
            too_old = self.step - group.tag + 1 > limit
            if group.keep and not too_old:
                self.waiting.append(group)
                continue
            self.wasted_tokens += sum(group.lengths)
            stale += int(group.keep and too_old)
            if self.mode != "sync":
                self.submit(1)
        return stale

    def train(self, count: int) -> tuple[float, list[int]]:
        """Train the ``count`` oldest waiting groups: seconds on the training GPUs and their staleness."""
        self.waiting.sort(key=lambda g: g.tag)
        batch, self.waiting = self.waiting[:count], self.waiting[count:]
        tokens = sum(g.tokens(self.s.prompt_tokens) for g in batch)
        return tokens * self.s.train_token_s / self.train_gpus, [self.step - g.tag + 1 for g in batch]

    def run(self, steps: int) -> list[StepRecord]:
        s = self.s
        if self.mode != "sync":
            self.submit(s.num_warmup_batches * s.train_batch_size)
        for _ in range(steps):
            self.step += 1
            start, busy, capacity = self.rollout.now, self.rollout.busy, self.rollout.capacity
            record = getattr(self, f"_step_{self.mode}")()
            record.time = self.rollout.now - start
            record.decode_busy = self.rollout.busy - busy
            record.decode_capacity = self.rollout.capacity - capacity
            self.records.append(record)
        return self.records

    def _step_sync(self) -> StepRecord:
        s = self.s
        self.waiting = [g for g in self.waiting if self.step - g.tag + 1 <= SYNC_MAX_SPAN]
        for _ in range(s.max_num_gen_batches):
            needed = s.train_batch_size - len(self.waiting)
            if needed <= 0:
                break
            size = s.gen_batch_size
            if s.adaptive_rounds:  # dapo.sampling.BatchFiller.next_round_size with the true kept fraction
                size = min(s.gen_batch_size, math.ceil(needed / s.keep_frac * (1 + s.safety_margin)))
            self.submit(size)
            self.rollout.run()  # the round ends with its longest response
            self.collect()
        train_s, spans = self.train(s.train_batch_size)
        if not s.carry_over:
            self.waiting.clear()  # the surplus of the last round is dropped
        self.rollout.wait(train_s, idle=False)
        self.rollout.wait(s.sync_colocated_s, idle=False)
        return StepRecord(0.0, train_s, 0.0, spans, 0)

    def _step_colocate_async(self) -> StepRecord:
        s = self.s
        self.submit(s.train_batch_size)
        stale = self.collect()

        def ready() -> bool:
            nonlocal stale
            stale += self.collect()
            return len(self.waiting) >= s.train_batch_size

        self.rollout.run(ready=ready)
        self.rollout.abort()  # the unfinished responses keep their tokens
        train_s, spans = self.train(s.train_batch_size)
        self.rollout.wait(train_s, idle=False)
        self.rollout.wait(s.sync_colocated_s, idle=False)
        return StepRecord(0.0, train_s, 0.0, spans, stale)

    def _step_separate_async(self) -> StepRecord:
        s = self.s
        self.submit(s.train_batch_size)
        stale, wait_s, train_total, spans = 0, 0.0, 0.0, []

        def ready() -> bool:
            nonlocal stale
            stale += self.collect()
            return len(self.waiting) >= s.ppo_mini_batch_size

        for _ in range(s.train_batch_size // s.ppo_mini_batch_size):
            before = self.rollout.now
            if not ready():
                self.rollout.run(ready=ready)
            if not ready():
                raise RuntimeError("the rollout ran out of prompts before a mini-batch was ready")
            wait_s += self.rollout.now - before
            train_s, mini_spans = self.train(s.ppo_mini_batch_size)
            spans += mini_spans
            train_total += train_s
            self.rollout.run(until=self.rollout.now + train_s)  # the rollout goes on while the trainer trains
        self.rollout.abort()  # the weight broadcast: nothing decodes, running responses resume after it
        self.rollout.wait(s.sync_separate_s, idle=True)
        return StepRecord(0.0, train_total, wait_s, spans, stale)

    def summary(self, skip: int) -> dict[str, float]:
        """Figures over the steps after the first ``skip`` (the warm-up of the pipeline)."""
        s, records = self.s, self.records[skip:]
        total = sum(r.time for r in records)
        train_gpu_s = sum(r.train_s for r in records) * self.train_gpus
        spans = [x for r in records for x in r.spans]
        busy = sum(r.decode_busy for r in records)  # slot-seconds, over the counted steps only
        capacity = sum(r.decode_capacity for r in records)
        decode_util = busy / capacity if capacity else 0.0
        if self.mode == "separate_async":
            gpu_busy = decode_util * self.rollout_gpus * total + train_gpu_s
        else:  # the same GPUs generate and train: busy while decoding (by slot use) and while training
            gpu_busy = busy / self.rollout.slots * s.gpus + train_gpu_s
        return {
            "step_s": total / len(records),
            "trained_responses_per_s": s.train_batch_size * s.n * len(records) / total,
            "gpu_idle_frac": 1 - gpu_busy / (s.gpus * total),
            "rollout_idle_frac": 1 - decode_util,
            "trainer_wait_frac": sum(r.trainer_wait_s for r in records) / total,
            "train_s_per_step": statistics.mean(r.train_s for r in records),
            "staleness_mean": statistics.mean(spans),
            "staleness_max": max(spans),
            "dropped_stale_per_step": statistics.mean(r.dropped_stale for r in records),
        }


def simulate(s: Setup, steps: int = 12, skip: int = 2, seed: int = 0, lengths=None) -> dict[str, dict[str, float]]:
    """Every mode with the same setup, seed and length distribution; ``{mode: summary}``, plus
    ``separate_async (best split)``: the rollout share of the GPUs that trains the most responses a second."""
    out = {}
    for mode in MODES:
        sim = Simulation(s, mode, seed, lengths)
        sim.run(steps)
        out[mode] = sim.summary(skip)
    best = None
    for rollout_gpus in range(s.gpus_per_replica, s.gpus, max(s.gpus_per_replica, s.gpus // 16)):
        sim = Simulation(replace(s, rollout_gpus=rollout_gpus), "separate_async", seed, lengths)
        sim.run(steps)
        summary = {**sim.summary(skip), "rollout_gpus": rollout_gpus}
        if best is None or summary["trained_responses_per_s"] > best["trained_responses_per_s"]:
            best = summary
    out["separate_async (best split)"] = best
    return out


def read_lengths(path: Path) -> list[list[float]]:
    """Measured response lengths, grouped by prompt, as fractions of their budget: a JSON object with ``lengths``
    (tokens, the ``n`` responses of a prompt consecutive), ``n`` and ``budget`` (``bench.experiments.ablation_start
    --json``)."""
    data = json.loads(path.read_text())
    budget, n, lengths = float(data["budget"]), int(data["n"]), data["lengths"]
    if not lengths or len(lengths) % n:
        raise ValueError(f"{path}: {len(lengths)} lengths are not groups of n={n}")
    return [[min(1.0, int(x) / budget) for x in lengths[i : i + n]] for i in range(0, len(lengths), n)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12, help="steps simulated per mode (the first two are not counted)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lengths", type=Path, default=None, help="measured lengths (JSON with lengths and budget)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override a Setup field")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    types = {f.name: type(getattr(Setup(), f.name)) for f in fields(Setup)}
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        if key not in types:
            p.error(f"--set {item}: unknown field {key!r}; one of {', '.join(types)}")
        if types[key] is bool:
            if value.lower() not in ("true", "false"):
                p.error(f"--set {item}: {key} is true or false")
            overrides[key] = value.lower() == "true"
        else:
            overrides[key] = types[key](float(value)) if types[key] is int else types[key](value)
    s = replace(Setup(), **overrides)
    lengths = read_lengths(args.lengths) if args.lengths else None
    results = simulate(s, steps=args.steps, seed=args.seed, lengths=lengths)
    print(
        f"{s.gpus} GPUs ({s.rollout_gpus} generating in separate_async), {s.train_batch_size} prompts x {s.n}, "
        f"{s.train_batch_size // s.ppo_mini_batch_size} updates a step, budget {s.max_response_length}, lengths "
        f"{'from ' + str(args.lengths) if args.lengths else f'log-normal, median {s.median_length:.0f}'}"
    )
    rows = [
        [
            mode,
            r["step_s"],
            r["trained_responses_per_s"],
            r["gpu_idle_frac"],
            r["rollout_idle_frac"],
            r["trainer_wait_frac"],
            r["staleness_mean"],
            r["staleness_max"],
        ]
        for mode, r in results.items()
    ]
    print_table(
        ["mode", "step s", "trained resp/s", "GPU idle", "rollout idle", "trainer waits", "staleness mean", "max"], rows
    )
    base = results["sync"]["step_s"]
    for mode in list(results)[1:]:
        print(f"{mode}: {base / results[mode]['step_s']:.2f}x the synchronous step rate")
    print(f"best split: {results['separate_async (best split)']['rollout_gpus']} of {s.gpus} GPUs generating")
    write_json(args.json, {"setup": asdict(s), "lengths": str(args.lengths or "log-normal"), "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
