"""The verl CPU run's model and data: the tiny warmed-up Qwen2 and its task (``tiny.*``, ``configs/tiny.yaml``).

``python -m recipe.dapo.cpu.prepare [key=value ...]`` composes the run's own config (``dapo_trainer`` with
``+experiment=cpu_tiny`` and the given overrides, e.g. ``tiny.warmup.steps=100``), builds or reuses the task and the
warm-up (:mod:`recipe.common.warmup`, cached by settings: the embedded engine's runs and this one share them) and
points ``<cache_dir>/verl-cpu/`` at them, where ``configs/experiment/cpu_tiny.yaml`` reads:

* ``model``: the warmed-up model (Hugging Face format);
* ``tokenizer``: the task's tokenizer directory, *without* a ``config.json``. transformers 5.19 loads a tokenizer
  directory that holds a Qwen2 ``config.json`` as ``Qwen2Tokenizer`` and applies Qwen2's pre-tokenizer, which
  turns the task's 20-token prompts into about 150 tokens; verl and vLLM are pointed here instead;
* ``train.parquet``, ``val.parquet``: the task in verl's schema.

``<cache_dir>`` is the config's top-level ``cache_dir`` (``$DAPO_CACHE_DIR`` when set).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from recipe.common.cache import link_atomically
from recipe.common.warmup import TinySettings
from recipe.config import compose

ASSETS = "verl-cpu"
EXPERIMENT = "cpu_tiny"


def prepare(overrides: list[str] | None = None, log=print) -> Path:
    """Build (or reuse) the warm-up and the task; return ``<cache_dir>/verl-cpu`` with its four links."""
    config = compose([f"+experiment={EXPERIMENT}", *(overrides or [])], "dapo_trainer")
    tiny = TinySettings.from_config(OmegaConf.to_container(config, resolve=True, throw_on_missing=False))
    torch.set_num_threads(1)  # the tiny model's ops are too small to split (the embedded engine runs it on one too)
    model_dir = tiny.model_dir(torch.device("cpu"), log=log)
    task_dir = tiny.task_dir()
    out = Path(tiny.cache_dir) / ASSETS
    out.mkdir(parents=True, exist_ok=True)
    link_atomically(model_dir, out / "model")
    link_atomically(task_dir / "tokenizer", out / "tokenizer")
    for split in ("train", "val"):
        link_atomically(task_dir / f"{split}.parquet", out / f"{split}.parquet")
    if (out / "tokenizer" / "config.json").exists():
        raise RuntimeError(
            f"{out / 'tokenizer'} holds a config.json; transformers 5.19 would load it as Qwen2Tokenizer"
        )
    return out


if __name__ == "__main__":
    print(f"verl-cpu assets: {prepare(sys.argv[1:])}")
