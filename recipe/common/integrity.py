"""Is a checkpoint's file whole? Read from the files' structure, not their content, so that a cut-short file is
found without loading it: a ``torch.save`` file (``.pt``) is a zip archive whose directory sits at its end, a
``.safetensors`` file declares in its header where every tensor ends, a ``.json`` file must parse. Both engines'
resume paths use it (the embedded checkpoint and verl's ``global_step_N`` layout)."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

TORCH_SUFFIXES = (".pt", ".pth")


def file_damage(path: Path) -> str | None:
    """What is wrong with one file (``None``: whole, or of a kind not checked)."""
    path = Path(path)
    if not path.is_file():
        return f"{path} is missing"
    if path.suffix in TORCH_SUFFIXES:
        try:
            with zipfile.ZipFile(path) as archive:
                archive.infolist()
        except (zipfile.BadZipFile, OSError) as err:
            return f"{path} is damaged ({err})"
    elif path.suffix == ".safetensors":
        problem = _safetensors_damage(path)
        if problem:
            return f"{path} is damaged ({problem})"
    elif path.suffix == ".json":
        try:
            json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError, OSError) as err:
            return f"{path} is damaged ({type(err).__name__}: {err})"
    return None


def directory_damage(directory: Path, required: tuple[str, ...] = ()) -> str | None:
    """The first problem of any file under ``directory`` (``required``: names that must exist in it)."""
    directory = Path(directory)
    for name in required:
        if not (directory / name).exists():
            return f"{directory / name} is missing"
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        problem = file_damage(path)
        if problem:
            return problem
    return None


def newest_intact(run_dir: Path, candidates: list[Path], damage, log=print) -> Path:
    """The first of ``candidates`` (the tracked checkpoint first, then the others newest first) that ``damage``
    finds nothing wrong with; each damaged one is named and skipped, and when every one is damaged the error says
    how to start over. Both engines' resume paths call it, each with its own layout's ``damage``."""
    from dapo.settings import ConfigError

    for candidate in candidates:
        problem = damage(candidate)
        if problem is None:
            if candidate != candidates[0]:
                log(f"resuming from {candidate}, the newest intact checkpoint")
            return candidate
        log(f"warning: checkpoint {candidate} is damaged and skipped: {problem}")
    raise ConfigError(
        f"every checkpoint in {run_dir} is damaged ({', '.join(c.name for c in candidates)}); set "
        "trainer.resume_mode=disable to start over there, or trainer.default_local_dir=<new directory>"
    )


def _safetensors_damage(path: Path) -> str | None:
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            header_len = struct.unpack("<Q", f.read(8))[0]
            if 8 + header_len > size:
                return f"its header claims {header_len} bytes, the file has {size}"
            header = json.loads(f.read(header_len))
    except (struct.error, ValueError, UnicodeDecodeError) as err:
        return f"unreadable header: {err}"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end != size:
        return f"{size} bytes, its header describes {8 + header_len + end}"
    return None
