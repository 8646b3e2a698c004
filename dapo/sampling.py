"""Dynamic sampling: keep only prompt groups with a learning signal, fill the train batch with them.

The paper's rule (arXiv 2503.14476, §3.2, Eq. 11): the DAPO objective is taken subject to

    0 < |{o_i | is_equivalent(a, o_i)}| < G

i.e. a prompt whose G responses are all correct or all wrong is dropped (its group-relative advantages are
all zero, so it only dilutes the batch), and sampling continues until the batch is full of groups with
mixed accuracy.

What verl does (read off its source):

* V0 recipe (verl-recipe ``dapo/dapo_ray_trainer.py``): each round takes ``data.gen_batch_size`` prompts
  (the paper's run: 3x ``data.train_batch_size``), generates ``rollout.n`` responses each, keeps the groups whose
  ``algorithm.filter_groups.metric`` has ``np.std > 0`` (or that hold a single response), and repeats rounds
  until ``train_batch_size`` groups are kept. When round ``max_num_gen_batches`` ends with the batch still
  short it raises ``ValueError`` (0 = unbounded). The kept groups are truncated to the train batch in
  generation order; the surplus is thrown away.
* V1 sync trainer (``verl/trainer/ppo/v1/replay_buffer.py``, ``ReplayBuffer.sample``): starts
  ``train_batch_size`` prompts, evicts constant groups as they finish, adds 2 refill prompts per eviction,
  caps prompts in flight at ``max_inflight_gen_batches x train_batch_size``; once enough groups are ready it
  drains (waits for) the in-flight ones and discards every surplus group. ``max_num_gen_batches`` is ignored.

This module is the engine-agnostic part: :class:`BatchFiller`, a small state machine that both engines drive the
same way, and the keep/drop predicate it applies on a ``[B, G]`` accuracy tensor, also given as two pure functions
for analyses and tests (:func:`keep_groups`, :func:`group_filter_stats`; the engines go through the filler)::

    filler.begin_step(policy_version)
    while not filler.done:
        n = filler.next_round_size()                 # prompts to generate this round
        # draw candidates from the data loader, keep those filler.admit(keys) accepts, until n are accepted
        # (bound the draws, e.g. one epoch; every offer counts toward a skipped prompt's re-probe)
        groups, acc = generate_and_score(prompts)    # one opaque payload per prompt, acc: [n, G]
        kept = filler.add_round(groups, acc, keys)   # [n] bool: the groups it kept (the one keep/drop decision)
    batch, metrics = filler.end_step()               # exactly train_batch_size payloads
    versions = filler.last_batch_versions            # each payload's policy version (for a staleness correction;
                                                     # neither engine here applies one)

``groups`` may also be a function ``groups(kept_indices) -> payloads`` that builds the payloads of the kept groups
only (an engine that computes log-probabilities per payload then spends nothing on dropped groups).
:attr:`BatchFiller.ready_payloads` and :attr:`BatchFiller.carried_payloads` are read-only views of the groups in
the batch being filled and of those carried to the next step.

``prompt_keys`` must identify the prompt *content* (e.g. ``extra_info.index`` or a hash of the prompt text),
not a per-sample uid, so that the duplicated rows of DAPO-Math-17k share one saturation history.

Options (all off by default; with all off every round has ``gen_batch_size`` prompts and the filler behaves as
verl's V0 recipe, checked by ``bench/sim/sampling.py``):

1. ``adaptive``: the next round generates ``ceil(needed / f_hat * (1 + safety_margin))`` prompts, clamped to
   ``[min_gen_batch_size, gen_batch_size]``, where ``needed`` is the number of groups still missing and
   ``f_hat`` estimates the kept fraction. The estimator is a ratio of exponentially discounted counts over
   rounds (carried across steps):  ``K <- d*K + kept``, ``N <- d*N + generated``, ``f_hat = K / N`` with
   ``d = kept_frac_decay`` (default 0.5, i.e. about the last two rounds, weighted by their size, so a small
   top-up round moves it little). Before the first round ``f_hat = train_batch_size / gen_batch_size``, the
   fraction verl's 3x sizing implicitly assumes, so the first round has ``gen_batch_size`` prompts.
   ``min_gen_batch_size`` (default ``ceil(train_batch_size / 4)``) keeps the top-up rounds large enough that a
   few missing groups rarely need a third round. ``safety_margin`` defaults to 0.25: in
   ``bench/sim/sampling.py`` all options together needed a second round in up to 6% of the steps with 0.1,
   up to 0.7% with 0.2 (more rounds per step than verl's recipe where it needs one), at most 0.1% with 0.25.
   Its cost: without carry-over the extra groups are thrown away (adaptive alone saves less), with carry-over
   they train the next step, one policy version stale (about 20% of the batch in the bench).
2. ``carry_over``: kept groups beyond the train batch are kept for the next step instead of being thrown away,
   tagged with the policy version they were generated under. ``begin_step(v)`` brings in those with
   ``v - version <= max_carry_age`` (default 1) and drops older ones (``dapo/dropped_stale_groups``).
   Carried payloads are returned as they were; they are off-policy by up to ``max_carry_age`` versions, and
   the engine applies whatever importance-sampling correction it wants using ``last_batch_versions``.
3. ``skip_saturated``: a prompt whose last ``saturation_window`` sampled groups were all all-correct (or all
   all-wrong) is saturated; ``admit`` skips it ``reprobe_after`` times it is offered and then admits it once
   (a re-probe). A re-probe with mixed accuracy clears the prompt; a constant one keeps it saturated for
   another ``reprobe_after`` offers. No prompt is banned for good, and saturated prompts cost at most
   ``1 / (reprobe_after + 1)`` of the generation they would cost without the skip. Counting offers rather
   than policy versions makes the re-probe rate independent of dataset size and of duplicated rows.

Deviations from the paper and from verl, all deliberate:

1. A singleton group (G = 1) is constant by definition and is dropped. verl's filters keep it (V0:
   ``std > 0 or len == 1``; V1: only groups with more than one value are evicted). With G = 1 nothing could
   ever be kept, so :meth:`BatchFiller.add_round` refuses G < 2 and names the fix.
2. "Constant" is exact equality of the accuracies (``max == min`` per row), not ``np.std(values) > 0``, which can
   be a rounding residue for float metrics. A constant group counts as all-correct when its value is > 0
   (accuracy 1 / True, or verl's score +1), else all-wrong.
3. ``max_num_gen_batches`` counts rounds within one train step, as verl's V0 recipe does; the error comes
   from ``add_round`` right after the round that reached the limit with the batch still short, and shows the
   kept fraction of every round. V1 ignores the key; we keep it.
4. Metrics cover every round of the step (verl's V0 recipe resets its metrics each round, so it logs only
   the last round's generation statistics).
5. Options 1-3 above are ours, not the paper's nor verl's.

Metrics returned by :meth:`BatchFiller.end_step` (one step; counts are prompt groups): ``dapo/kept_group_frac``,
``dapo/filtered_all_correct``, ``dapo/filtered_all_wrong``, ``dapo/surplus_groups``, ``dapo/discarded_groups``,
``dapo/carried_groups``, ``dapo/dropped_stale_groups``, ``dapo/skipped_prompts``, ``dapo/saturated_prompts``,
``dapo/generated_prompts``, ``dapo/generated_per_trained``, ``dapo/kept_frac_estimate`` and verl's
``train/num_gen_batches``; what each means and what healthy looks like is in :data:`dapo.metrics.METRIC_DOCS`
(``docs/reference/metrics.md``).

Per-round figures (generated, filtered all-correct, filtered all-wrong, kept, surplus) are in
:attr:`BatchFiller.rounds` (a list of :class:`RoundStats` for the current step) and logged at DEBUG level.

Checkpointing: :meth:`BatchFiller.state_dict` holds everything needed to resume exactly: the estimator,
the saturation history, the counters, the in-progress step and the carried payloads. Save it with
``torch.save``; payloads must be picklable. ``torch.load``'s default ``weights_only=True`` accepts payloads
made of tensors and plain containers (dict, list, tuple, str, int, float, bool, None) and prompt keys of those
types; richer payloads (a verl ``DataProto``) need ``weights_only=False`` or
``torch.serialization.add_safe_globals``. The constructor arguments are not part of the state.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch

from dapo.settings import ConfigError, FilterSettings, SamplingSettings

logger = logging.getLogger(__name__)

_STATE_FORMAT = 1


class GroupFilterStats(NamedTuple):
    """Group counts of one batch: ``kept + all_correct + all_wrong == B``."""

    kept: int
    all_correct: int
    all_wrong: int


def _accuracy_matrix(acc: Any) -> torch.Tensor:
    acc = torch.as_tensor(acc)
    if acc.dim() != 2:
        raise ValueError(
            f"accuracies must be a [B, G] tensor (one row per prompt, one column per response), got shape "
            f"{tuple(acc.shape)}; reshape the flat [B*G] accuracies with .view(-1, rollout.n)"
        )
    if acc.dtype == torch.bool:
        acc = acc.to(torch.uint8)
    return acc  # [B, G]


def _classify(acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(kept, all_correct, all_wrong) as ``[B]`` bool tensors; exactly one is True per row."""
    lo = acc.amin(dim=1)  # [B]
    hi = acc.amax(dim=1)  # [B]
    constant = lo == hi  # [B]; always True for G = 1
    all_correct = constant & (hi > 0)  # [B]
    all_wrong = constant & ~(hi > 0)  # [B]
    return ~constant, all_correct, all_wrong


def keep_groups(acc: Any) -> torch.Tensor:
    """``[B]`` bool: True where the group's accuracy is not constant (paper Eq. 11).

    ``acc`` is ``[B, G]``, bool or numeric (0/1 accuracy). Singleton groups (G = 1) are always constant and
    therefore always dropped.
    """
    kept, _, _ = _classify(_accuracy_matrix(acc))
    return kept  # [B]


def group_filter_stats(acc: Any) -> GroupFilterStats:
    """How many of the ``[B, G]`` groups are kept, all-correct and all-wrong (a constant group with value > 0
    is all-correct). Singleton groups count as all-correct or all-wrong, never kept."""
    kept, all_correct, all_wrong = _classify(_accuracy_matrix(acc))
    return GroupFilterStats(int(kept.sum()), int(all_correct.sum()), int(all_wrong.sum()))


@dataclass(frozen=True)
class RoundStats:
    """One generation round. ``surplus`` is how many kept groups exceed the train batch after the round."""

    generated: int
    filtered_all_correct: int
    filtered_all_wrong: int
    kept: int
    surplus: int


_STEP_COUNTERS = ("generated", "all_correct", "all_wrong", "kept", "skipped", "carried_in", "dropped_stale")
_TOTALS = ("steps", "rounds", "generated", "kept", "trained", "discarded", "dropped_stale", "skipped")


def filter_metrics(generated: int, kept: int, all_correct: int, all_wrong: int) -> dict[str, float]:
    """The accuracy filter's counts of one step, as every engine and mode reports them: the groups generated (in
    verl's asynchronous modes, classified) this step and how many were kept or dropped as all correct / all wrong.
    ``dapo/kept_group_frac`` is NaN in a step that generated none (served by carried groups, or by asynchronous
    groups that finished before it): no fraction rather than a 0 that reads as everything filtered."""
    return {
        "dapo/generated_prompts": float(generated),
        "dapo/kept_group_frac": kept / generated if generated else float("nan"),
        "dapo/filtered_all_correct": float(all_correct),
        "dapo/filtered_all_wrong": float(all_wrong),
    }


class BatchFiller:
    """Accumulates groups with mixed accuracy over generation rounds until the train batch is full.

    Args:
        train_batch_size: prompt groups per train step (verl's ``data.train_batch_size``).
        gen_batch_size: prompts per round (``data.gen_batch_size``); with ``adaptive`` the largest round.
        max_num_gen_batches: rounds allowed per step before ``ValueError``; 0 = unbounded
            (``algorithm.filter_groups.max_num_gen_batches``).
        adaptive ... kept_frac_decay: the ``dapo.sampling.*`` options, each declared once (meaning and default)
            in :class:`dapo.settings.SamplingSettings`; how adaptive rounds and saturation work is in the module
            docstring.
    """

    def __init__(
        self,
        train_batch_size: int,
        gen_batch_size: int,
        max_num_gen_batches: int = FilterSettings.max_num_gen_batches,
        adaptive: bool = SamplingSettings.adaptive,
        min_gen_batch_size: int | None = SamplingSettings.min_gen_batch_size,
        safety_margin: float = SamplingSettings.safety_margin,
        carry_over: bool = SamplingSettings.carry_over,
        max_carry_age: int = SamplingSettings.max_carry_age,
        skip_saturated: bool = SamplingSettings.skip_saturated,
        saturation_window: int = SamplingSettings.saturation_window,
        reprobe_after: int = SamplingSettings.reprobe_after,
        *,
        kept_frac_decay: float = SamplingSettings.kept_frac_decay,
    ) -> None:
        # the defaults and the checks are those of dapo.settings (one set for both engines)
        if train_batch_size < 1:
            raise ConfigError(f"data.train_batch_size must be >= 1, got {train_batch_size}")
        if gen_batch_size < 1:
            raise ConfigError(
                f"data.gen_batch_size must be >= 1, got {gen_batch_size}; DAPO uses 3x data.train_batch_size"
            )
        self.max_num_gen_batches = FilterSettings(max_num_gen_batches=max_num_gen_batches).max_num_gen_batches
        settings = SamplingSettings(
            train_batch_size,
            gen_batch_size,
            adaptive,
            min_gen_batch_size,
            safety_margin,
            carry_over,
            max_carry_age,
            skip_saturated,
            saturation_window,
            reprobe_after,
            kept_frac_decay,
        )
        for name, value in asdict(settings).items():  # train_batch_size, gen_batch_size, adaptive, ...
            setattr(self, name, value)
        if min_gen_batch_size is None:
            self.min_gen_batch_size = min(gen_batch_size, math.ceil(train_batch_size / 4))

        # kept-fraction estimator: discounted kept / discounted generated, over rounds and steps
        self._kept_num = 0.0
        self._kept_den = 0.0
        # prompt key -> [sign, streak, skips]: sign +1 all-correct / -1 all-wrong streak of `streak` groups,
        # `skips` offers refused since it was last sampled. Prompts whose last group was mixed are absent.
        self._history: dict[Hashable, list[int]] = {}
        self._carried: list[tuple[Any, int]] = []  # (payload, version generated under), oldest first
        self._ready: list[tuple[Any, int]] = []  # kept groups of the current step, batch order
        self._in_step = False
        self._version = 0
        self._step = dict.fromkeys(_STEP_COUNTERS, 0)
        self.rounds: list[RoundStats] = []
        self.last_batch_versions: list[int] = []
        self.totals: dict[str, int] = dict.fromkeys(_TOTALS, 0)

    @classmethod
    def from_settings(cls, sampling: SamplingSettings, filter_groups: FilterSettings) -> BatchFiller:
        """The filler both engines build from :class:`dapo.settings.DapoSettings`."""
        return cls(
            sampling.train_batch_size,
            sampling.gen_batch_size,
            filter_groups.max_num_gen_batches,
            **sampling.filler_options(),
        )

    # ------------------------------------------------------------------ step protocol

    def begin_step(self, policy_version: int) -> None:
        """Start a train step under ``policy_version``; bring in carried groups young enough to train on."""
        if self._in_step:
            raise RuntimeError("begin_step() called twice; call end_step() to finish the previous step first")
        self._in_step = True
        self._version = int(policy_version)
        self._step = dict.fromkeys(_STEP_COUNTERS, 0)
        self.rounds = []
        fresh = [(p, v) for p, v in self._carried if self._version - v <= self.max_carry_age]
        fresh.sort(key=lambda item: item[1])  # stable: oldest version first, generation order within one
        self._step["dropped_stale"] = len(self._carried) - len(fresh)
        self._step["carried_in"] = len(fresh)
        self._ready = fresh
        self._carried = []

    @property
    def done(self) -> bool:
        """True once ``train_batch_size`` groups are ready."""
        return len(self._ready) >= self.train_batch_size

    @property
    def kept_frac_estimate(self) -> float:
        """The running kept-fraction estimate ``f_hat`` (prior ``train_batch_size / gen_batch_size``)."""
        if self._kept_den > 0:
            return self._kept_num / self._kept_den
        return min(1.0, self.train_batch_size / self.gen_batch_size)

    def next_round_size(self) -> int:
        """Prompts to generate in the next round: 0 when done, ``gen_batch_size`` unless adaptive."""
        self._require_step("next_round_size")
        needed = self.train_batch_size - len(self._ready)
        if needed <= 0:
            return 0
        if not self.adaptive:
            return self.gen_batch_size
        f_hat = self.kept_frac_estimate
        if f_hat <= 0.0:
            return self.gen_batch_size
        # the 1e-9 absorbs float error so that e.g. 10 / 0.5 * 1.1 = 22.000000000000004 gives 22, not 23
        size = math.ceil(needed / f_hat * (1.0 + self.safety_margin) - 1e-9)
        return max(self.min_gen_batch_size, min(self.gen_batch_size, size))

    def admit(self, prompt_keys: Sequence[Hashable]) -> list[bool]:
        """Which candidate prompts to generate (True = generate). All True unless ``skip_saturated``.

        Every refused offer counts toward the prompt's re-probe: after ``reprobe_after`` refusals the next
        offer is admitted.
        """
        if not self.skip_saturated:
            return [True] * len(prompt_keys)
        out = []
        for key in prompt_keys:
            entry = self._history.get(key)
            if entry is None or entry[1] < self.saturation_window or entry[2] >= self.reprobe_after:
                out.append(True)
            else:
                entry[2] += 1
                self._step["skipped"] += 1
                out.append(False)
        return out

    def add_round(
        self,
        groups: Sequence[Any] | Callable[[list[int]], Sequence[Any]],
        acc: Any,
        prompt_keys: Sequence[Hashable],
    ) -> torch.Tensor:
        """Record one generated round and return ``[B]`` bool, the groups kept (paper Eq. 11).

        ``groups[i]`` is prompt ``prompt_keys[i]``'s payload, ``acc[i]`` its ``[G]`` accuracies; or ``groups`` is a
        function of the kept indices returning their payloads, in that order. Keeps the mixed groups; raises
        ``ValueError`` when the round limit is reached with the batch still short."""
        self._require_step("add_round")
        acc = _accuracy_matrix(acc)  # [B, G]
        num_prompts, group_size = acc.shape
        num_payloads = num_prompts if callable(groups) else len(groups)
        if num_payloads != num_prompts or len(prompt_keys) != num_prompts:
            raise ValueError(
                f"add_round got {num_payloads} payloads, {len(prompt_keys)} prompt keys and accuracies for "
                f"{num_prompts} prompts; pass one payload, one key and one accuracy row per prompt"
            )
        if group_size < 2 and num_prompts > 0:
            raise ValueError(
                f"dynamic sampling needs at least 2 responses per prompt, got groups of {group_size}: a singleton "
                "group is always constant and dropped. Set actor_rollout_ref.rollout.n >= 2 or "
                "algorithm.filter_groups.enable=False"
            )
        kept, all_correct, all_wrong = _classify(acc)  # [B] each

        n_kept = int(kept.sum())
        n_correct = int(all_correct.sum())
        n_wrong = int(all_wrong.sum())
        if num_prompts > 0:
            d = self.kept_frac_decay
            self._kept_num = d * self._kept_num + n_kept
            self._kept_den = d * self._kept_den + num_prompts

        if self.skip_saturated:
            signs = (all_correct.long() - all_wrong.long()).tolist()  # [B]: +1 / -1 / 0 (mixed)
            for key, sign in zip(prompt_keys, signs):
                if sign == 0:
                    self._history.pop(key, None)
                    continue
                entry = self._history.get(key)
                if entry is None or entry[0] != sign:
                    self._history[key] = [sign, 1, 0]
                else:
                    entry[1] += 1
                    entry[2] = 0

        kept_indices = kept.nonzero().flatten().tolist()
        payloads = groups(kept_indices) if callable(groups) else [groups[i] for i in kept_indices]
        if len(payloads) != len(kept_indices):
            raise ValueError(
                f"the payload function returned {len(payloads)} payloads for {len(kept_indices)} kept groups"
            )
        self._ready.extend((payload, self._version) for payload in payloads)

        self._step["generated"] += num_prompts
        self._step["all_correct"] += n_correct
        self._step["all_wrong"] += n_wrong
        self._step["kept"] += n_kept
        stats = RoundStats(
            generated=num_prompts,
            filtered_all_correct=n_correct,
            filtered_all_wrong=n_wrong,
            kept=n_kept,
            surplus=max(0, len(self._ready) - self.train_batch_size),
        )
        self.rounds.append(stats)
        logger.debug("dynamic sampling round %d: %s", len(self.rounds), stats)

        if self.max_num_gen_batches > 0 and len(self.rounds) >= self.max_num_gen_batches and not self.done:
            raise ValueError(self._too_many_rounds_message())
        return kept

    def _too_many_rounds_message(self) -> str:
        history = ", ".join(f"{r.kept}/{r.generated}={r.kept / max(r.generated, 1):.2f}" for r in self.rounds)
        correct, wrong = self._step["all_correct"], self._step["all_wrong"]
        if wrong >= correct:
            cause = "most dropped groups were all wrong: the prompts are too hard for the policy; lower the difficulty"
        else:
            cause = (
                "most dropped groups were all correct: the prompts are too easy for the policy; raise their difficulty "
                "or skip solved prompts (skip_saturated)"
            )
        return (
            f"dynamic sampling has {len(self._ready)} of {self.train_batch_size} groups with mixed accuracy after "
            f"{len(self.rounds)} generation rounds, the limit algorithm.filter_groups.max_num_gen_batches="
            f"{self.max_num_gen_batches}. Kept fraction per round (kept/generated): [{history}]; dropped this step: "
            f"{correct} groups all correct, {wrong} all wrong. {cause}, raise "
            "algorithm.filter_groups.max_num_gen_batches, or set it to 0 for unbounded rounds."
        )

    def end_step(self) -> tuple[list[Any], dict[str, float]]:
        """Return exactly ``train_batch_size`` payloads (carried first, oldest first) and the step's metrics."""
        self._require_step("end_step")
        if not self.done:
            raise RuntimeError(
                f"end_step() with {len(self._ready)} of {self.train_batch_size} groups ready; "
                "call add_round() until filler.done"
            )
        batch = self._ready[: self.train_batch_size]
        surplus = self._ready[self.train_batch_size :]
        discarded = 0
        if self.carry_over:
            self._carried = surplus
        else:
            discarded = len(surplus)
            self._carried = []
        self._ready = []
        self._in_step = False
        self.last_batch_versions = [v for _, v in batch]

        s = self._step
        self.totals["steps"] += 1
        self.totals["rounds"] += len(self.rounds)
        self.totals["generated"] += s["generated"]
        self.totals["kept"] += s["kept"]
        self.totals["trained"] += len(batch)
        self.totals["discarded"] += discarded
        self.totals["dropped_stale"] += s["dropped_stale"]
        self.totals["skipped"] += s["skipped"]
        metrics = {
            **filter_metrics(s["generated"], s["kept"], s["all_correct"], s["all_wrong"]),
            "dapo/surplus_groups": float(len(surplus)),
            "dapo/discarded_groups": float(discarded),
            "dapo/carried_groups": float(min(s["carried_in"], self.train_batch_size)),
            "dapo/dropped_stale_groups": float(s["dropped_stale"]),
            "dapo/skipped_prompts": float(s["skipped"]),
            "dapo/saturated_prompts": float(self.num_saturated_prompts),
            "dapo/generated_per_trained": s["generated"] / self.train_batch_size,
            "dapo/kept_frac_estimate": self.kept_frac_estimate,
            "train/num_gen_batches": float(len(self.rounds)),
        }
        return [p for p, _ in batch], metrics

    @property
    def num_saturated_prompts(self) -> int:
        """Distinct prompts whose history currently marks them saturated."""
        return sum(1 for entry in self._history.values() if entry[1] >= self.saturation_window)

    @property
    def num_carried(self) -> int:
        """Groups waiting to be carried into the next step."""
        return len(self._carried)

    @property
    def ready_payloads(self) -> tuple[Any, ...]:
        """The payloads of the batch being filled, in batch order (after ``begin_step``: the carried-in groups)."""
        return tuple(p for p, _ in self._ready)

    @property
    def carried_payloads(self) -> tuple[Any, ...]:
        """The payloads carried to the next step (after ``end_step``, with ``carry_over``), oldest first."""
        return tuple(p for p, _ in self._carried)

    def _require_step(self, method: str) -> None:
        if not self._in_step:
            raise RuntimeError(f"{method}() outside a step; call begin_step(policy_version) first")

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly (see the module docstring for what ``torch.load`` accepts)."""
        return {
            "format": _STATE_FORMAT,
            "kept_frac_num": self._kept_num,
            "kept_frac_den": self._kept_den,
            "saturation_history": {key: list(entry) for key, entry in self._history.items()},
            "carried_payloads": [p for p, _ in self._carried],
            "carried_versions": [v for _, v in self._carried],
            "ready_payloads": [p for p, _ in self._ready],
            "ready_versions": [v for _, v in self._ready],
            "in_step": self._in_step,
            "policy_version": self._version,
            "step_counters": dict(self._step),
            "rounds": [list(_round_tuple(r)) for r in self.rounds],
            "last_batch_versions": list(self.last_batch_versions),
            "totals": dict(self.totals),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (the constructor arguments come from the new instance)."""
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(
                f"unknown BatchFiller state format {state.get('format')!r} (expected {_STATE_FORMAT}); "
                "the checkpoint was written by another version of dapo.sampling"
            )
        self._kept_num = float(state["kept_frac_num"])
        self._kept_den = float(state["kept_frac_den"])
        self._history = {key: list(entry) for key, entry in state["saturation_history"].items()}
        self._carried = list(zip(state["carried_payloads"], state["carried_versions"]))
        self._ready = list(zip(state["ready_payloads"], state["ready_versions"]))
        self._in_step = bool(state["in_step"])
        self._version = int(state["policy_version"])
        self._step = {name: int(state["step_counters"].get(name, 0)) for name in _STEP_COUNTERS}
        self.rounds = [RoundStats(*r) for r in state["rounds"]]
        self.last_batch_versions = list(state["last_batch_versions"])
        self.totals = {name: int(state["totals"].get(name, 0)) for name in _TOTALS}


def _round_tuple(r: RoundStats) -> tuple[int, int, int, int, int]:
    return (r.generated, r.filtered_all_correct, r.filtered_all_wrong, r.kept, r.surplus)


def starved_message(step: int, err: ValueError, last_step: Mapping[str, float], lr: float) -> str:
    """The stop line when dynamic sampling finds too few groups with signal (:meth:`BatchFiller.add_round`'s
    ``ValueError``), led by the learning rate when the previous step's update collapsed the policy
    (:func:`dapo.metrics.collapse_signs` on its metrics ``last_step``), which leaves every group all wrong."""
    from dapo.metrics import collapse_signs

    signs = collapse_signs(last_step)
    if not signs:
        return f"step {step}: {err}"
    return (
        f"step {step}: the policy collapsed in the step-{step - 1} update ({', '.join(signs)}; healthy: ppo_kl below "
        f"0.01, a few percent clipped): lower actor_rollout_ref.actor.optim.lr (now {lr:g}). What it left: {err}"
    )
