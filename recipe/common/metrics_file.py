"""``metrics.jsonl``, the one file format both engines log to: verl's ``file`` logger lines
(``verl/utils/tracking.py:FileLogger``), ``{"step": N, "data": {name: value, ...}}``, one per log call."""

from __future__ import annotations

import json
from pathlib import Path

METRICS_FILE = "metrics.jsonl"


def metrics_line(step: int, metrics: dict) -> str:
    """One line as verl's ``file`` logger writes it (compact, as its orjson does)."""
    return json.dumps({"step": step, "data": metrics}, separators=(",", ":")) + "\n"


def read_records(path: Path) -> list[dict]:
    """The records of ``path`` in file order, each flat: ``{"step": N, name: value, ...}``; none when the file does
    not exist. The flat lines the embedded engine wrote before it took verl's format are read as they are."""
    path = Path(path)
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"step": r["step"], **r["data"]} if "data" in r else r for r in records]
