"""The embedded default: a synthetic verifiable math task, a tokenizer built here, a tiny Qwen2.

Everything is made locally, nothing is downloaded:

* the task: ``addition`` (the default), ``a + b`` with two ``digits``-digit operands, every pair enumerated once
  and split into disjoint train / validation sets, answered directly; or ``addition_steps`` (the ablation's,
  ``bench/ablation.py``), operands of 1 to ``digits`` digits answered after column-by-column working, so that
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
            raise ValueError(f"embedded.task.digits must be >= 1, got {self.digits}")
        low, high = 10 ** (self.digits - 1), 10**self.digits - 1
        pairs = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
        if not 0 < self.val_size < len(pairs):
            raise ValueError(
                f"embedded.task.val_size must be in (0, {len(pairs)}) for {self.digits}-digit operands, "
                f"got {self.val_size}"
            )
        random.Random(self.seed).shuffle(pairs)
        return pairs

    def rows(self, split: str) -> list[dict]:
        """The ``train`` or ``val`` rows in verl's parquet schema."""
        pairs = self.problems()
        chosen = pairs[: self.val_size] if split == "val" else pairs[self.val_size :]
        return [_row(index, split, a, b) for index, (a, b) in enumerate(chosen)]

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
            raise ValueError(f"embedded.task.digits must be >= 1, got {self.digits}")
        if self.val_size < 1 or self.train_size < 1:
            raise ValueError(
                f"embedded.task.val_size and embedded.task.train_size must be >= 1, got {self.val_size} and "
                f"{self.train_size}"
            )
        wanted = self.val_size + self.train_size
        available = (10**self.digits - 1) ** 2
        if wanted > available // 2:
            raise ValueError(
                f"embedded.task.val_size + train_size = {wanted} is more than half of the {available} pairs of "
                f"1..{self.digits}-digit operands; raise embedded.task.digits or ask for fewer problems"
            )
        rng = random.Random(self.seed)
        seen: set[tuple[int, int]] = set()
        pairs = []
        while len(pairs) < wanted:
            a, b = (rng.randint(10 ** (d - 1) if d > 1 else 0, 10**d - 1)
                    for d in (rng.randint(1, self.digits), rng.randint(1, self.digits)))
            if (a, b) not in seen:
                seen.add((a, b))
                pairs.append((a, b))
        return pairs

    def rows(self, split: str) -> list[dict]:
        pairs = self.problems()
        chosen = pairs[: self.val_size] if split == "val" else pairs[self.val_size :]
        return [_row(index, split, a, b, solution=worked_solution(a, b)) for index, (a, b) in enumerate(chosen)]

    write_parquet = AdditionTask.write_parquet


def _row(index: int, split: str, a: int, b: int, solution: str | None = None) -> dict:
    problem = f"What is {a} + {b}?"
    extra = {"index": index, "split": split, "raw_problem": problem}
    if solution is not None:
        extra["solution"] = solution  # what the warm-up teaches (absent: target_text of the ground truth)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": DAPO_INSTRUCTION.format(problem=problem)}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(a + b), "style": "rule-lighteval/MATH_v2"},
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


def build_model(tokenizer, *, hidden_size: int, intermediate_size: int, num_hidden_layers: int,
                num_attention_heads: int, num_key_value_heads: int, max_position_embeddings: int):
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
