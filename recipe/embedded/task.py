"""The embedded default: a synthetic verifiable math task, a tokenizer built here, a tiny Qwen2.

Everything is made locally, nothing is downloaded:

* the task: ``a + b`` with two ``digits``-digit operands, every pair enumerated once and split into disjoint
  train / validation sets, written to parquet in verl's schema (``data_source, prompt[{role, content}], ability,
  reward_model{ground_truth, style}, extra_info{index, split, raw_problem}``) with the DAPO instruction, unshortened;
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

# The DAPO-Math-17k instruction (paper's data, and AIME 2024 as prepared by its authors), verbatim.
DAPO_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
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
        rows = []
        for index, (a, b) in enumerate(chosen):
            problem = f"What is {a} + {b}?"
            rows.append(
                {
                    "data_source": DATA_SOURCE,
                    "prompt": [{"role": "user", "content": DAPO_INSTRUCTION.format(problem=problem)}],
                    "ability": "MATH",
                    "reward_model": {"ground_truth": str(a + b), "style": "rule-lighteval/MATH_v2"},
                    "extra_info": {"index": index, "split": split, "raw_problem": problem},
                }
            )
        return rows

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


def build_tokenizer(task: AdditionTask, corpus_size: int = 2000):
    """A byte-level BPE trained on the task's chat-formatted prompts and answers (digits stay single tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = []
    for row in task.rows("train")[:corpus_size]:
        corpus.append(
            f"{BOS_TOKEN}user\n{row['prompt'][0]['content']}{EOS_TOKEN}\n{BOS_TOKEN}assistant\n"
            f"{target_text(row['reward_model']['ground_truth'])}{EOS_TOKEN}\n"
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
