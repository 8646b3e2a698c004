"""Prompt data: verl's parquet schema read through verl's own ``RLHFDataset``, checked, chat-templated.

A row is ``data_source, prompt[{role, content}], ability, reward_model{ground_truth, style}, extra_info``. The
files go through ``verl.utils.dataset.rl_dataset.RLHFDataset`` (what verl's trainers read them with: local or
HDFS paths, parquet/json, ``*_max_samples``); this module then checks what the engine needs and says how to fix
what is wrong, tokenizes every prompt once with the chat template, and applies verl's over-long prompt options
(``data.filter_overlong_prompts``, ``data.truncation``), reporting how many prompts they touched.

:class:`PromptStream` is the data position: a seeded permutation per epoch and an offset into it, so that a
resumed run draws exactly the prompts the uninterrupted run would have drawn.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass

import torch

from recipe.embedded.config import ConfigError

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("reward_model",)


@dataclass
class PromptSet:
    """Tokenized prompts and what scoring needs, one entry per row."""

    prompt_ids: list[torch.Tensor]  # chat-templated prompt tokens, 1-D each
    ground_truths: list[str]
    data_sources: list[str]
    extra_infos: list[dict]
    keys: list[str]  # a hash of the prompt content: the dynamic-sampling saturation key

    def __len__(self) -> int:
        return len(self.prompt_ids)


def _as_list(files) -> list[str]:
    if files is None:
        return []
    if isinstance(files, str):
        return [files]
    return [str(f) for f in files]


def load_prompts(
    files,
    tokenizer,
    *,
    files_key: str,
    prompt_key: str,
    reward_fn_key: str,
    max_prompt_length: int,
    filter_overlong_prompts: bool,
    truncation: str,
    max_samples: int = -1,
    seed: int = 0,
    apply_chat_template_kwargs: dict | None = None,
) -> PromptSet:
    """Read verl-schema files and return their :class:`PromptSet`; ``files_key`` names the config key in errors."""
    paths = _as_list(files)
    if not paths:
        raise ConfigError(f"{files_key} is empty; set it to one or more parquet files in verl's schema")
    for path in paths:
        if "://" not in path and not os.path.exists(os.path.expanduser(path)):
            raise ConfigError(f"{files_key}: no such file {path!r}; set {files_key} to an existing parquet file")
    paths = [os.path.expanduser(p) for p in paths]

    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    dataset_config = OmegaConf.create(
        {
            "prompt_key": prompt_key,
            "max_prompt_length": max_prompt_length,
            "filter_overlong_prompts": False,
            "shuffle": True,
            "seed": seed,
            "cache_dir": os.path.expanduser("~/.cache/verl/rlhf"),
        }
    )
    frame = RLHFDataset(paths, tokenizer, dataset_config, max_samples=max_samples).dataframe

    missing = [c for c in (prompt_key, reward_fn_key, *REQUIRED_COLUMNS) if c not in frame.column_names]
    if missing:
        raise ConfigError(
            f"{files_key} ({', '.join(paths)}) lacks column(s) {missing}; it has {frame.column_names}. "
            "Rows must follow verl's schema: data_source, prompt[{role, content}], ability, "
            "reward_model{ground_truth, style}, extra_info (or point data.prompt_key / data.reward_fn_key at "
            "the columns that hold the chat prompt and the data source)"
        )
    if len(frame) == 0:
        raise ConfigError(f"{files_key} ({', '.join(paths)}) has no rows")

    # plain lists, read once: indexing a datasets column row by row costs about a millisecond a row
    wanted = [
        c for c in dict.fromkeys((prompt_key, reward_fn_key, "reward_model", "extra_info")) if c in frame.column_names
    ]
    columns = frame.select_columns(wanted).to_dict()
    messages = columns[prompt_key]
    reward_models = columns["reward_model"]
    data_sources = [str(s) for s in columns[reward_fn_key]]
    extra_infos = columns["extra_info"] if "extra_info" in columns else [None] * len(frame)

    from recipe.common.checks import check_rows

    check_rows(messages, reward_models, files_key, prompt_key)  # the rule check_data_files applied before start
    ground_truths = [str(rm["ground_truth"]) for rm in reward_models]
    kwargs = dict(apply_chat_template_kwargs or {})
    for key in ("tokenize", "return_dict", "return_tensors"):
        kwargs.pop(key, None)
    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False, **kwargs) for m in messages]
    token_lists = tokenizer(texts, add_special_tokens=False)["input_ids"]

    lengths = [len(t) for t in token_lists]
    overlong = [row for row, n in enumerate(lengths) if n > max_prompt_length]
    keep = list(range(len(token_lists)))
    if overlong:
        longest = max(lengths)
        if filter_overlong_prompts:
            keep = [row for row in keep if lengths[row] <= max_prompt_length]
            logger.warning(
                "%s: filtered out %d of %d prompts longer than data.max_prompt_length=%d tokens "
                "(data.filter_overlong_prompts=True; longest %d)",
                files_key,
                len(overlong),
                len(lengths),
                max_prompt_length,
                longest,
            )
            print(
                f"{files_key}: filtered out {len(overlong)} of {len(lengths)} prompts longer than "
                f"data.max_prompt_length={max_prompt_length} tokens"
            )
            if not keep:
                raise ConfigError(
                    f"{files_key}: all {len(lengths)} prompts are longer than data.max_prompt_length="
                    f"{max_prompt_length} tokens (shortest {min(lengths)}); raise data.max_prompt_length"
                )
        elif truncation == "error":
            raise ConfigError(
                f"{files_key}: {len(overlong)} of {len(lengths)} prompts are longer than data.max_prompt_length="
                f"{max_prompt_length} tokens (longest {longest}, row {lengths.index(longest)}). Raise "
                f"data.max_prompt_length to {longest}, or set data.filter_overlong_prompts=True to drop them, or "
                "data.truncation=left|right|middle to cut them"
            )
        else:
            token_lists = [truncate(t, max_prompt_length, truncation) for t in token_lists]
            print(f"{files_key}: truncated {len(overlong)} prompts to {max_prompt_length} tokens ({truncation})")

    def content_key(m) -> str:
        return hashlib.sha1(json.dumps(list(m), sort_keys=True, default=str).encode()).hexdigest()[:16]

    return PromptSet(
        prompt_ids=[torch.tensor(token_lists[row], dtype=torch.long) for row in keep],
        ground_truths=[ground_truths[row] for row in keep],
        data_sources=[data_sources[row] for row in keep],
        extra_infos=[extra_infos[row] for row in keep],
        keys=[content_key(messages[row]) for row in keep],
    )


def truncate(tokens: list[int], length: int, side: str) -> list[int]:
    """verl's ``data.truncation``: keep the last (``left``), first (``right``) or both ends (``middle``)."""
    if len(tokens) <= length:
        return tokens
    if side == "left":
        return tokens[-length:]
    if side == "right":
        return tokens[:length]
    if side == "middle":
        head = length // 2
        return tokens[:head] + tokens[len(tokens) - (length - head) :]
    raise ConfigError(f"data.truncation must be one of error, left, right, middle; got {side!r}")


class PromptStream:
    """An endless sequence of row indices: each epoch a fresh seeded permutation (or the file order)."""

    def __init__(self, num_rows: int, *, shuffle: bool, seed: int) -> None:
        self.num_rows = num_rows
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_rows))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_rows, generator=generator).tolist()

    def next(self) -> int:
        if self.position == self.num_rows:
            self.epoch += 1
            self.position = 0
            self._order = self._permutation()
        index = self._order[self.position]
        self.position += 1
        return index

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation()
