"""Cached build products (the warmed-up tiny model, the real model's stages, the task files): a content key and a
directory built under a temporary name and renamed when complete, so that a killed build never looks finished."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path


def digest(obj) -> str:
    """12 hex digits of the SHA-256 of ``obj`` as sorted JSON: the cache key of a build's settings."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:12]


def build_atomically(final: Path, build: Callable[[Path], dict]) -> Path:
    """``final`` if it holds ``done.json``; else ``build(tmp)`` into a temporary sibling, its returned info written
    to ``done.json``, and the directory renamed to ``final``. If another process finished first, theirs is kept."""
    if (final / "done.json").is_file():
        return final
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    info = build(tmp)
    (tmp / "done.json").write_text(json.dumps(info, indent=1))
    try:
        os.replace(tmp, final)
    except OSError:  # another process finished the same build first: use theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def link_atomically(target: Path, link: Path) -> None:
    """``link`` -> ``target`` (resolved), replaced in one step: a concurrent reader sees the old or the new link."""
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target.resolve())
    os.replace(tmp, link)


def cache_root() -> Path:
    """The project's cache directory: the top-level ``cache_dir`` of ``configs/dapo_trainer.yaml`` (its only
    spelling), ``$DAPO_CACHE_DIR`` when set; for the tools that compose no config (``python -m recipe.smollm2``)."""
    from omegaconf import OmegaConf

    from recipe.config import config_dir

    return Path(str(OmegaConf.load(config_dir() / "dapo_trainer.yaml").cache_dir)).expanduser()
