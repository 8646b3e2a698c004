#!/usr/bin/env python3
"""Prepare DAPO-Math-17k (training) and AIME 2024 (validation) in verl's parquet schema.

    python scripts/prepare_data.py                                  # both from the Hugging Face hub
    python scripts/prepare_data.py --train /path/dapo-math-17k.parquet --val tests/data/aime-2024.parquet
    python scripts/prepare_data.py --val none --no-dedup            # training set only, every row kept

A source is a hub dataset id (default ``BytedTsinghua-SIA/DAPO-Math-17k`` and ``BytedTsinghua-SIA/AIME-2024``,
read with ``datasets`` when the hub is reachable) or a local ``.parquet``, ``.jsonl`` or ``.json`` file, or
``none`` to skip it. Rows may already be in verl's schema (``prompt`` + ``reward_model.ground_truth``, as the
hub files are) or raw (``problem``/``question`` + ``answer``/``ground_truth``), which get the DAPO instruction.

Output (``--out-dir``, default ``~/data/dapo``): ``dapo-math-17k.parquet`` and ``aime-2024.parquet`` with
``data_source`` ("math_dapo"), ``prompt`` ([{role: user, content}]), ``ability`` ("MATH"), ``reward_model``
({ground_truth, style}) and ``extra_info`` ({index, raw_problem, split, source_index}).

Deduplication (on by default, ``--no-dedup`` to keep every row): DAPO-Math-17k repeats each of its ~17k prompts
about 100 times (1.79M rows) and AIME 2024 repeats each of its 30 problems 32 times. Rows with the same prompt
text are kept once (the first); the counts are printed. The configs sample 32 responses per AIME problem
(``actor_rollout_ref.rollout.val_kwargs.n=32``), so the deduplicated AIME file gives avg@32 directly; with
``--no-dedup`` set ``val_kwargs.n=1`` instead (mean@1 over 32 copies is the same avg@32).

A row without a ground truth is an error naming the rows (``--drop-invalid`` drops such rows instead, with a
count), as is a row without a prompt. Exit status 0 on success, 1 on bad input, with a message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from dapo.reward import DAPO_INSTRUCTION

HUB_TRAIN = "BytedTsinghua-SIA/DAPO-Math-17k"
HUB_VAL = "BytedTsinghua-SIA/AIME-2024"
OUT_NAMES = {"train": "dapo-math-17k.parquet", "val": "aime-2024.parquet"}
DATA_SOURCE = "math_dapo"  # what verl's default scorer and our metrics key on (val-core/math_dapo/acc/mean@32)
STYLE = "rule-lighteval/MATH_v2"
# the instruction of DAPO-Math-17k and AIME 2024 (BytedTsinghua-SIA), for raw problem/answer rows
DAPO_TEMPLATE = DAPO_INSTRUCTION
PROBLEM_KEYS = ("problem", "question")
ANSWER_KEYS = ("answer", "ground_truth")


class DataError(Exception):
    """Bad input: the message says what and how to fix it."""


def load_source(source: str) -> pd.DataFrame:
    """A local parquet / jsonl / json file, or a hub dataset id (train split)."""
    path = Path(os.path.expanduser(source))
    if path.suffix in (".parquet", ".jsonl", ".json"):
        if not path.is_file():
            raise DataError(f"{source}: no such file")
        try:
            if path.suffix == ".parquet":
                return pd.read_parquet(path)
            return pd.read_json(path, lines=path.suffix == ".jsonl", dtype=False)
        except Exception as err:  # pandas raises ValueError, pyarrow its own types, for a malformed file
            raise DataError(f"{source}: cannot read it as {path.suffix[1:]} ({type(err).__name__}: {err})") from err
    if path.exists():
        raise DataError(
            f"{source}: unsupported input {path.suffix or '(no extension)'!r}; give a .parquet, .jsonl "
            "or .json file, or a hub dataset id"
        )
    try:
        import datasets

        return datasets.load_dataset(source, split="train").to_pandas()
    except Exception as err:
        raise DataError(
            f"{source}: not a local file and the hub dataset could not be loaded ({type(err).__name__}: {err}). "
            f"Download it where the hub is reachable (huggingface-cli download --repo-type dataset {source} "
            "--local-dir DIR) and pass the parquet file under DIR"
        ) from err


def _value(row: dict, key: str) -> Any:
    value = row.get(key)
    return None if value is None or (isinstance(value, float) and pd.isna(value)) else value


def _messages(prompt: Any) -> list[dict] | None:
    """A verl prompt as a plain list of {role, content}, or None when it is missing or empty."""
    if prompt is None:
        return None
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}] if prompt.strip() else None
    messages = [dict(m) for m in list(prompt)]
    if not messages or not all("content" in m and "role" in m for m in messages):
        return None
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]


def normalise_row(row: dict) -> tuple[list[dict] | None, str | None, str | None]:
    """(messages, ground truth, raw problem) of one input row, verl-schema or raw; None where missing."""
    reward_model = _value(row, "reward_model")
    truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    problem = next((_value(row, k) for k in PROBLEM_KEYS if _value(row, k) is not None), None)
    if truth is None:
        truth = next((_value(row, k) for k in ANSWER_KEYS if _value(row, k) is not None), None)
    messages = _messages(_value(row, "prompt"))
    if messages is None and problem is not None and str(problem).strip():
        messages = [{"role": "user", "content": DAPO_TEMPLATE.format(problem=str(problem).strip())}]
    extra = _value(row, "extra_info")
    if problem is None and isinstance(extra, dict):
        problem = extra.get("raw_problem")
    truth = None if truth is None or not str(truth).strip() else str(truth).strip()
    return messages, truth, None if problem is None else str(problem)


def convert(df: pd.DataFrame, *, name: str, split: str, dedup: bool, drop_invalid: bool) -> pd.DataFrame:
    """Rows of ``df`` in verl's schema; raises :class:`DataError` for rows without prompt or ground truth."""
    if df.empty:
        raise DataError(f"{name}: the file holds no rows")
    records = df.to_dict("records")
    rows, missing_truth, missing_prompt = [], [], []
    for position, record in enumerate(records):
        messages, truth, problem = normalise_row(record)
        if messages is None:
            missing_prompt.append(position)
        elif truth is None:
            missing_truth.append(position)
        else:
            rows.append((position, messages, truth, problem, record))
    for positions, what, fix in (
        (missing_prompt, "no prompt", "a 'prompt' (list of {role, content}) or a 'problem' column"),
        (missing_truth, "no ground truth", "reward_model.ground_truth (verl schema) or an 'answer' column"),
    ):
        if positions and not drop_invalid:
            shown = ", ".join(str(p) for p in positions[:10]) + (", ..." if len(positions) > 10 else "")
            raise DataError(
                f"{name}: {len(positions)} of {len(records)} rows have {what} (rows {shown}); every row needs {fix}. "
                "Fix the file, or pass --drop-invalid to drop those rows"
            )
        if positions:
            print(f"{name}: dropped {len(positions)} rows with {what} (--drop-invalid)")
    if not rows:
        raise DataError(f"{name}: no valid rows left")

    if dedup:
        first: dict[str, tuple[int, str]] = {}
        unique, conflicts = [], 0
        for row in rows:
            key = "\n".join(m["content"] for m in row[1])
            if key in first:
                conflicts += first[key][1] != row[2]
                continue
            first[key] = (row[0], row[2])
            unique.append(row)
        print(
            f"{name}: deduplicated {len(rows)} rows to {len(unique)} unique prompts "
            f"({len(rows) - len(unique)} repeats dropped)"
        )
        if conflicts:
            print(
                f"{name}: warning: {conflicts} repeats had a different ground truth than the first copy "
                "(kept the first)"
            )
        rows = unique
    else:
        print(f"{name}: kept all {len(rows)} rows (--no-dedup)")

    out = []
    for index, (position, messages, truth, problem, record) in enumerate(rows):
        source_extra = _value(record, "extra_info")
        source_index = source_extra.get("index") if isinstance(source_extra, dict) else None
        out.append(
            {
                "data_source": str(_value(record, "data_source") or DATA_SOURCE),
                "prompt": messages,
                "ability": str(_value(record, "ability") or "MATH"),
                "reward_model": {"ground_truth": truth, "style": STYLE},
                "extra_info": {
                    "index": index,
                    "raw_problem": problem or "",
                    "split": split,
                    "source_index": str(position if source_index is None else source_index),
                },
            }
        )
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", default=HUB_TRAIN, help=f"training source (default {HUB_TRAIN}; 'none' to skip)")
    parser.add_argument("--val", default=HUB_VAL, help=f"validation source (default {HUB_VAL}; 'none' to skip)")
    parser.add_argument("--out-dir", default="~/data/dapo", help="output directory (default ~/data/dapo)")
    parser.add_argument(
        "--no-dedup",
        dest="dedup",
        action="store_false",
        help="keep repeated prompts (DAPO-Math-17k repeats each ~100x, AIME 2024 each 32x)",
    )
    parser.add_argument(
        "--drop-invalid", action="store_true", help="drop rows without prompt or ground truth instead of failing"
    )
    args = parser.parse_args(argv)

    out_dir = Path(os.path.expanduser(args.out_dir))
    jobs = [(split, source) for split, source in (("train", args.train), ("val", args.val)) if source != "none"]
    if not jobs:
        print("error: --train none and --val none leave nothing to prepare", file=sys.stderr)
        return 1
    try:
        for split, source in jobs:
            frame = convert(
                load_source(source), name=source, split=split, dedup=args.dedup, drop_invalid=args.drop_invalid
            )
            out_dir.mkdir(parents=True, exist_ok=True)
            target = out_dir / OUT_NAMES[split]
            frame.to_parquet(target, index=False)
            print(f"{split}: wrote {len(frame)} rows to {target}")
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(json.dumps({"out_dir": str(out_dir)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
