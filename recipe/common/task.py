"""The embedded default: a synthetic verifiable math task, a tokenizer built here, a tiny Qwen2.

Everything is made locally, nothing is downloaded:

* the task: ``addition`` (the default), ``a + b`` with two ``digits``-digit operands, every pair enumerated once
  and split into disjoint train / validation sets, answered directly; or ``addition_steps`` (the ablation's,
  ``bench/experiments/ablation/``), operands of 1 to ``digits`` digits answered after column-by-column working, so that
  responses vary in length and the longest ones meet the response-length budget. Both are written to parquet in
  verl's schema (``data_source, prompt[{role, content}], ability, reward_model{ground_truth, style},
  extra_info{index, split, raw_problem[, solution]}``) with the DAPO instruction, unshortened;
* the tokenizer: a byte-level BPE trained with the ``tokenizers`` library on the task's own chat-formatted prompts
  and answers, wrapped as a ``PreTrainedTokenizerFast`` with a Qwen-style chat template. Digits are always single
  tokens (so the model can learn arithmetic); the fixed instruction compresses to a handful of tokens, so the tiny
  model spends its compute on the problem rather than on 300 characters it cannot read anyway;
* the model: a randomly initialised ``Qwen2ForCausalLM`` of about a million parameters.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dapo.reward import DAPO_INSTRUCTION  # the prompts are in the DAPO-Math-17k format

DATA_SOURCE = "synthetic_addition"
PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class AdditionTask:
    """``a + b`` with ``digits``-digit operands; ``val_size`` pairs are held out for validation."""

    digits: int = 2
    val_size: int = 256
    seed: int = 0

    def problems(self) -> list[tuple[int, int]]:
        """Every operand pair once, in a seeded random order (validation first)."""
        if self.digits < 1:
            raise ValueError(f"tiny.task.digits must be >= 1, got {self.digits}")
        low, high = 10 ** (self.digits - 1), 10**self.digits - 1
        pairs = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
        if not 0 < self.val_size < len(pairs):
            raise ValueError(
                f"tiny.task.val_size must be in (0, {len(pairs)}) for {self.digits}-digit operands, got {self.val_size}"
            )
        random.Random(self.seed).shuffle(pairs)
        return pairs

    def rows(self, split: str) -> list[dict]:
        """The ``train`` or ``val`` rows in verl's parquet schema."""
        pairs = self.problems()
        chosen = pairs[: self.val_size] if split == "val" else pairs[self.val_size :]
        return [_addition_row(index, split, a, b) for index, (a, b) in enumerate(chosen)]

    def write_parquet(self, out_dir: Path) -> tuple[Path, Path]:
        """Write ``train.parquet`` and ``val.parquet`` under ``out_dir``; return their paths."""
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for split in ("train", "val"):
            path = out_dir / f"{split}.parquet"
            pd.DataFrame(self.rows(split)).to_parquet(path, index=False)
            paths.append(path)
        return paths[0], paths[1]


def target_text(ground_truth: str) -> str:
    """The response the supervised warm-up teaches: the answer line the DAPO scorer reads."""
    return f"Answer: {ground_truth}"


def worked_solution(a: int, b: int) -> str:
    """Schoolbook addition, least significant column first, then the answer line the DAPO scorer reads.

    ``worked_solution(47, 385)`` is ``"7+5=12\n4+8+1=13\n0+3+1=4\nAnswer: 432"``: one line per column (a missing
    digit is written 0, a carry in as ``+1``), so the response grows with the longer operand.
    """
    lines, carry = [], 0
    x, y = str(a)[::-1], str(b)[::-1]
    for i in range(max(len(x), len(y))):
        da, db = int(x[i]) if i < len(x) else 0, int(y[i]) if i < len(y) else 0
        total = da + db + carry
        lines.append(f"{da}+{db}{'+1' if carry else ''}={total}")
        carry = total // 10
    lines.append(target_text(str(a + b)))
    return "\n".join(lines)


@dataclass(frozen=True)
class StepsAdditionTask:
    """``a + b`` with operands of 1 to ``digits`` digits each (digit counts uniform and independent), answered
    after column-by-column working (:func:`worked_solution`); ``train_size`` + ``val_size`` distinct pairs, the first
    ``val_size`` held out for validation. The ground truth is the sum alone, so ``dapo.reward`` verifies it."""

    digits: int = 3
    val_size: int = 256
    train_size: int = 4000
    seed: int = 0

    def problems(self) -> list[tuple[int, int]]:
        """``val_size + train_size`` distinct operand pairs in a seeded random order (validation first)."""
        if self.digits < 1:
            raise ValueError(f"tiny.task.digits must be >= 1, got {self.digits}")
        if self.val_size < 1 or self.train_size < 1:
            raise ValueError(
                f"tiny.task.val_size and tiny.task.train_size must be >= 1, got {self.val_size} and {self.train_size}"
            )
        wanted = self.val_size + self.train_size
        available = (10**self.digits - 1) ** 2
        if wanted > available // 2:
            raise ValueError(
                f"tiny.task.val_size + train_size = {wanted} is more than half of the {available} pairs of "
                f"1..{self.digits}-digit operands; raise tiny.task.digits or ask for fewer problems"
            )
        rng = random.Random(self.seed)
        seen: set[tuple[int, int]] = set()
        pairs = []
        while len(pairs) < wanted:
            a, b = (
                rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1)
                for d in (rng.randint(1, self.digits), rng.randint(1, self.digits))
            )
            if (a, b) not in seen:
                seen.add((a, b))
                pairs.append((a, b))
        return pairs

    def rows(self, split: str) -> list[dict]:
        pairs = self.problems()
        chosen = pairs[: self.val_size] if split == "val" else pairs[self.val_size :]
        return [
            _addition_row(index, split, a, b, solution=worked_solution(a, b)) for index, (a, b) in enumerate(chosen)
        ]

    write_parquet = AdditionTask.write_parquet


CHAIN_MAX_VALUE = 99  # every running value of a chain stays in 0..99 (two digit tokens at most)


def chain_solution(start: int, operands: Sequence[int]) -> str:
    """The chain worked left to right, one line per operation, then the answer line the DAPO scorer reads.

    ``chain_solution(17, [5, -3, 8])`` (the problem ``17+5-3+8``) is ``"17+5=22\n22-3=19\n19+8=27\nAnswer: 27"``:
    each line copies the running value, applies the next operation of the problem and writes the new value, so
    the response grows by one line (about 8 tokens) per operation.
    """
    lines, value = [], start
    for operand in operands:
        new = value + operand
        lines.append(f"{value}{operand:+d}={new}")
        value = new
    lines.append(target_text(str(value)))
    return "\n".join(lines)


@dataclass(frozen=True)
class ChainTask:
    """A chain of ``min_steps`` to ``max_steps`` additions and subtractions of one-digit numbers to a start of 0 to
    99 (``What is 17+5-3+8?``), answered after one worked line per operation (:func:`chain_solution`), so correct
    responses range from about 13 tokens (one operation) to about 8 x ``max_steps`` tokens, and a response is right
    only if every line is. The number of operations is uniform over the range, the sign of each operation random
    but flipped where the running value would leave 0..99. ``train_size`` + ``val_size`` distinct problems, the
    first ``val_size`` held out for validation; the ground truth is the final value, verified by ``dapo.reward``."""

    min_steps: int = 1
    max_steps: int = 20
    val_size: int = 256
    train_size: int = 4000
    seed: int = 0

    def problems(self) -> list[tuple[int, tuple[int, ...]]]:
        """``val_size + train_size`` distinct ``(start, signed operands)``, seeded random order (validation first)."""
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(
                f"tiny.task.min_steps and max_steps must satisfy 1 <= min_steps <= max_steps, got "
                f"{self.min_steps} and {self.max_steps}"
            )
        if self.val_size < 1 or self.train_size < 1:
            raise ValueError(
                f"tiny.task.val_size and tiny.task.train_size must be >= 1, got {self.val_size} and {self.train_size}"
            )
        wanted = self.val_size + self.train_size
        # at least 100 starts x 9 digits per operation (one sign at worst) distinct chains of each length
        fewest = sum((CHAIN_MAX_VALUE + 1) * 9**k for k in range(self.min_steps, self.max_steps + 1))
        if wanted > fewest // 2:
            raise ValueError(
                f"tiny.task.val_size + train_size = {wanted} is more than half of the {fewest} chains of "
                f"{self.min_steps} to {self.max_steps} operations; raise tiny.task.max_steps or ask for fewer "
                "problems"
            )
        rng = random.Random(self.seed)
        seen: set[tuple[int, tuple[int, ...]]] = set()
        out = []
        while len(out) < wanted:
            value = start = rng.randint(0, CHAIN_MAX_VALUE)
            operands = []
            for _ in range(rng.randint(self.min_steps, self.max_steps)):
                operand = rng.randint(1, 9) * rng.choice((1, -1))
                if not 0 <= value + operand <= CHAIN_MAX_VALUE:
                    operand = -operand
                operands.append(operand)
                value += operand
            problem = (start, tuple(operands))
            if problem not in seen:
                seen.add(problem)
                out.append(problem)
        return out

    def rows(self, split: str) -> list[dict]:
        chains = self.problems()
        chosen = chains[: self.val_size] if split == "val" else chains[self.val_size :]
        return [
            _row(
                index,
                split,
                f"What is {start}{''.join(f'{x:+d}' for x in operands)}?",
                start + sum(operands),
                solution=chain_solution(start, operands),
            )
            for index, (start, operands) in enumerate(chosen)
        ]

    write_parquet = AdditionTask.write_parquet


def _addition_row(index: int, split: str, a: int, b: int, solution: str | None = None) -> dict:
    return _row(index, split, f"What is {a} + {b}?", a + b, solution=solution)


def _row(index: int, split: str, problem: str, answer: int, solution: str | None = None) -> dict:
    extra = {"index": index, "split": split, "raw_problem": problem}
    if solution is not None:
        extra["solution"] = solution  # what the warm-up teaches (absent: target_text of the ground truth)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": DAPO_INSTRUCTION.format(problem=problem)}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(answer), "style": "rule-lighteval/MATH_v2"},
        "extra_info": extra,
    }


def solution_text(row: dict) -> str:
    """The response the warm-up teaches for a task row: its worked solution, else the bare answer line."""
    extra = row.get("extra_info") or {}
    return extra.get("solution") or target_text(row["reward_model"]["ground_truth"])


def build_tokenizer(task, corpus_size: int = 2000):
    """A byte-level BPE trained on the task's chat-formatted prompts and answers (digits stay single tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = []
    for row in task.rows("train")[:corpus_size]:
        corpus.append(
            f"{BOS_TOKEN}user\n{row['prompt'][0]['content']}{EOS_TOKEN}\n{BOS_TOKEN}assistant\n"
            f"{solution_text(row)}{EOS_TOKEN}\n"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=[PAD_TOKEN, BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )


def build_model(
    tokenizer,
    *,
    hidden_size: int,
    intermediate_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    max_position_embeddings: int,
):
    """A randomly initialised Qwen2 causal LM sized for two CPU cores (call ``torch.manual_seed`` first)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2ForCausalLM(config)
