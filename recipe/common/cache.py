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
