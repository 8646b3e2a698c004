"""Math in words, solved step by step: the real-model task (SmolLM2-135M-Instruct, ``make model``).

A problem is a short story about one person and one kind of thing: a starting count, then one to ``max_ops``
events, each one arithmetic operation on the running count::

    Mia has 7 shells. She finds 5 more shells. Then she gives away 3 shells. How many shells does Mia have now?

The worked solution (what the supervised warm-up teaches, ``extra_info.solution``) has one sentence per event,
with the operation written out, then the answer line the DAPO scorer reads::

    Mia starts with 7 shells.
    She finds 5 more: 7 + 5 = 12.
    She gives away 3: 12 - 3 = 9.
    Answer: 9

Events: finding or buying ``x`` more (``+``), giving away or losing ``x`` (``-``), getting ``k`` boxes of ``x``
(``k * x = y``, then ``+``: two operations in one sentence) and doubling (``* 2``). Every running count stays in
1..:data:`MAX_VALUE`, so each step is arithmetic a small model can learn. With the SmolLM2 tokenizer (one token per
digit) worked solutions run from 27 to 49 tokens for one event and from 82 to 149 for four (the default
``max_ops = 4``), so a response budget of 128 binds for the longest problems (truncation, the overlong filter and
the soft punishment all act) while most solutions fit.

Rows are in verl's parquet schema with the DAPO instruction (``recipe.common.word_problems.row``); problems are
drawn from a seeded generator, distinct, the first ``val_size`` held out for validation and the next ``sft_size``
kept apart for the warm-up, so neither validation nor DAPO's training prompts were seen in the warm-up.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from dapo.reward import DAPO_INSTRUCTION

DATA_SOURCE = "word_problems"
MAX_VALUE = 200  # every running count stays in 1..MAX_VALUE
SPLITS = ("train", "val", "sft")

_NAMES = [
    ("Mia", "She"),
    ("Leo", "He"),
    ("Ava", "She"),
    ("Sam", "He"),
    ("Zoe", "She"),
    ("Max", "He"),
    ("Ivy", "She"),
    ("Ben", "He"),
    ("Ella", "She"),
    ("Noah", "He"),
    ("Lily", "She"),
    ("Omar", "He"),
]
_THINGS = ["apples", "shells", "stickers", "marbles", "coins", "cards", "pencils", "books", "stamps", "beads"]
_CONTAINERS = ["boxes", "bags", "packs", "jars"]


@dataclass(frozen=True)
class Event:
    """One operation of a problem: ``kind`` in ``add``, ``sub``, ``groups`` (``count`` containers of ``size``),
    ``double``."""

    kind: str
    amount: int = 0
    count: int = 0
    container: str = ""

    def apply(self, value: int) -> int:
        return {
            "add": value + self.amount,
            "sub": value - self.amount,
            "double": value * 2,
            "groups": value + self.count * self.amount,
        }[self.kind]


@dataclass(frozen=True)
class Problem:
    name: str
    pronoun: str
    thing: str
    start: int
    events: tuple[Event, ...]

    @property
    def answer(self) -> int:
        value = self.start
        for event in self.events:
            value = event.apply(value)
        return value

    def text(self) -> str:
        sentences = [f"{self.name} has {self.start} {self.thing}."]
        for i, e in enumerate(self.events):
            then = "Then " + self.pronoun.lower() if i else self.pronoun
            sentences.append(f"{then} {_story(e, self.thing)}.")
        sentences.append(f"How many {self.thing} does {self.name} have now?")
        return " ".join(sentences)

    def solution(self) -> str:
        lines, value = [f"{self.name} starts with {self.start} {self.thing}."], self.start
        for e in self.events:
            new = e.apply(value)
            if e.kind == "add":
                work = f"{value} + {e.amount} = {new}"
            elif e.kind == "sub":
                work = f"{value} - {e.amount} = {new}"
            elif e.kind == "double":
                work = f"{value} * 2 = {new}"
            else:
                work = f"{e.count} * {e.amount} = {e.count * e.amount}, and {value} + {e.count * e.amount} = {new}"
            lines.append(f"{self.pronoun} {_story(e, self.thing, short=True)}: {work}.")
            value = new
        lines.append(f"Answer: {value}")
        return "\n".join(lines)


def _story(e: Event, thing: str, short: bool = False) -> str:
    if e.kind == "add":
        return f"finds {e.amount} more" + ("" if short else f" {thing}")
    if e.kind == "sub":
        return f"gives away {e.amount}" + ("" if short else f" {thing}")
    if e.kind == "double":
        return "doubles the number" + ("" if short else f" of {thing}")
    return f"gets {e.count} {e.container} with {e.amount}" + ("" if short else f" {thing}") + " each"


def _event(rng: random.Random, value: int) -> Event:
    kinds = ["add", "sub", "groups"] + (["double"] if 2 * value <= MAX_VALUE else [])
    while True:
        kind = rng.choice(kinds)
        if kind == "add":
            e = Event("add", amount=rng.randint(1, 20))
        elif kind == "sub":
            if value <= 1:
                continue
            e = Event("sub", amount=rng.randint(1, min(20, value - 1)))
        elif kind == "groups":
            e = Event("groups", amount=rng.randint(2, 9), count=rng.randint(2, 5), container=rng.choice(_CONTAINERS))
        else:
            e = Event("double")
        if 1 <= e.apply(value) <= MAX_VALUE:
            return e


@dataclass(frozen=True)
class WordProblemTask:
    """``val_size`` validation, ``sft_size`` warm-up and ``train_size`` DAPO training problems, distinct, with
    ``min_ops`` to ``max_ops`` events each (uniform), from ``seed``."""

    min_ops: int = 1
    max_ops: int = 4
    val_size: int = 256
    sft_size: int = 400
    train_size: int = 4000
    seed: int = 0

    def problems(self) -> list[Problem]:
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"word problems need 1 <= min_ops <= max_ops, got {self.min_ops} and {self.max_ops}")
        if min(self.val_size, self.sft_size, self.train_size) < 1:
            raise ValueError(
                "word problems need val_size, sft_size and train_size >= 1, got "
                f"{self.val_size}, {self.sft_size} and {self.train_size}"
            )
        rng = random.Random(self.seed)
        wanted = self.val_size + self.sft_size + self.train_size
        seen: set[str] = set()
        out: list[Problem] = []
        while len(out) < wanted:
            name, pronoun = rng.choice(_NAMES)
            value = start = rng.randint(2, 30)
            events = []
            for _ in range(rng.randint(self.min_ops, self.max_ops)):
                events.append(_event(rng, value))
                value = events[-1].apply(value)
            problem = Problem(name, pronoun, rng.choice(_THINGS), start, tuple(events))
            if problem.text() not in seen:
                seen.add(problem.text())
                out.append(problem)
        return out

    def split(self, name: str) -> list[Problem]:
        problems = self.problems()
        bounds = {
            "val": (0, self.val_size),
            "sft": (self.val_size, self.val_size + self.sft_size),
            "train": (self.val_size + self.sft_size, len(problems)),
        }
        if name not in bounds:
            raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
        lo, hi = bounds[name]
        return problems[lo:hi]

    def rows(self, split: str) -> list[dict]:
        return [row(i, split, p) for i, p in enumerate(self.split(split))]

    def write_parquet(self, out_dir: Path) -> dict[str, Path]:
        """``train.parquet``, ``val.parquet`` and ``sft.parquet`` under ``out_dir``."""
        import pandas as pd

        out_dir.mkdir(parents=True, exist_ok=True)
        paths = {}
        for split in SPLITS:
            paths[split] = out_dir / f"{split}.parquet"
            pd.DataFrame(self.rows(split)).to_parquet(paths[split], index=False)
        return paths


def row(index: int, split: str, problem: Problem) -> dict:
    """One problem in verl's parquet schema; ``extra_info`` carries the worked solution and the event count."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": DAPO_INSTRUCTION.format(problem=problem.text())}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(problem.answer), "style": "rule-lighteval/MATH_v2"},
        "extra_info": {
            "index": index,
            "split": split,
            "raw_problem": problem.text(),
            "solution": problem.solution(),
            "num_ops": len(problem.events),
        },
    }
