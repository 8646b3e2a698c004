"""The verl CPU run's model and data: the embedded engine's tiny warmed-up Qwen2 and its addition task.

``python -m recipe.dapo.cpu.prepare [embedded overrides...]`` composes ``configs/embedded.yaml`` (with the given
overrides, e.g. ``embedded.warmup.steps=100``), builds or reuses the task and the warm-up through the embedded
engine's cache code (:mod:`recipe.common.warmup`, keyed by settings: the embedded engine's runs and this one
share them) and points ``<cache_dir>/verl-cpu/`` at them, where ``configs/experiment/cpu_tiny.yaml`` reads:

* ``model``: the warmed-up model (Hugging Face format);
* ``tokenizer``: the task's tokenizer directory, *without* a ``config.json``. transformers 5.19 loads a tokenizer
  directory that holds a Qwen2 ``config.json`` as ``Qwen2Tokenizer`` and applies Qwen2's pre-tokenizer, which
  turns the task's 20-token prompts into about 150 tokens; verl and vLLM are pointed here instead;
* ``train.parquet``, ``val.parquet``: the task in verl's schema.

``<cache_dir>`` is ``embedded.cache_dir`` (``$DAPO_CACHE_DIR``, default ``~/.cache/dapo-verl``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from dapo.settings import select
from recipe.common.warmup import task_files, warm_model
from recipe.config import compose

ASSETS = "verl-cpu"


def _link(target: Path, link: Path) -> None:
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target.resolve())
    os.replace(tmp, link)  # atomic: a concurrent run sees the old or the new link, never none


def prepare(overrides: list[str] | None = None, log=print) -> Path:
    """Build (or reuse) the warm-up and the task; return ``<cache_dir>/verl-cpu`` with its four links."""
    config = OmegaConf.to_container(compose(list(overrides or []), "embedded"), resolve=True, throw_on_missing=False)
    embedded = select(config, "embedded", required=True)  # the tiny model's and the task's settings
    cache_dir = os.path.expanduser(str(select(embedded, "cache_dir", required=True)))
    task = select(embedded, "task", required=True)
    torch.set_num_threads(max(1, int(select(embedded, "num_threads", 1))))
    model_dir = warm_model(
        cache_dir,
        task,
        select(embedded, "model", required=True),
        select(embedded, "warmup", required=True),
        device=torch.device("cpu"),
        log=log,
    )
    task_dir = task_files(cache_dir, task)
    out = Path(cache_dir) / ASSETS
    out.mkdir(parents=True, exist_ok=True)
    _link(model_dir, out / "model")
    _link(task_dir / "tokenizer", out / "tokenizer")
    for split in ("train", "val"):
        _link(task_dir / f"{split}.parquet", out / f"{split}.parquet")
    if (out / "tokenizer" / "config.json").exists():
        raise RuntimeError(
            f"{out / 'tokenizer'} holds a config.json; transformers 5.19 would load it as Qwen2Tokenizer"
        )
    return out


if __name__ == "__main__":
    print(f"verl-cpu assets: {prepare(sys.argv[1:])}")
