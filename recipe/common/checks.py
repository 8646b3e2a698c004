"""Checks of what a run is given, made before any expensive work (the warm-up, a model load, Ray), shared by both
engines.

- :func:`check_data_files`: every local data file exists, is not empty, is a readable parquet file with rows and
  verl's columns; a bad file is named with the key that gave it and the fix, never with a raw ``ArrowInvalid``.
- :func:`load_reward_function`: ``reward.custom_reward_function.{path,name}`` imports, is callable and returns a
  finite number (or a dict with a finite ``score``) on a probe built from the first training row; the function is
  returned wrapped in :class:`CheckedReward`, which stops the run the first time it returns a non-finite number.
Both engines run them before any expensive work (the embedded engine before its warm-up, the verl entry point before
Ray). A bad input is a :class:`~dapo.settings.ConfigError`: one line, no traceback, exit status 2; a reward function
that fails during training is a :class:`~recipe.common.rundir.RunStopped`, exit status 1.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
from pathlib import Path

from dapo.settings import ConfigError
from recipe.common.rundir import RunStopped

REQUIRED_COLUMNS = ("reward_model",)
SCHEMA = (
    "verl's schema: data_source, prompt[{role, content}], ability, reward_model{ground_truth, style}, "
    "extra_info (scripts/prepare_data.py writes it)"
)


def _as_list(files) -> list[str]:
    if files in (None, "", []):
        return []
    return [str(files)] if isinstance(files, str) else [str(f) for f in files]


def check_data_files(files, key: str, *, prompt_key: str = "prompt", reward_fn_key: str = "data_source") -> None:
    """Raise naming ``key`` and the file unless every local file of ``files`` is a parquet file with rows and the
    columns the engines read (remote paths, ``hdfs://`` and the like, are left to the reader)."""
    for name in _as_list(files):
        if "://" in name:
            continue
        path = Path(os.path.expanduser(name))
        if not path.exists():
            raise ConfigError(f"{key}: no such file {name!r}; set {key} to an existing parquet file in {SCHEMA}")
        if path.is_dir():
            raise ConfigError(f"{key}: {name!r} is a directory; set {key} to a parquet file (or a list of them)")
        if not os.access(path, os.R_OK):
            raise ConfigError(f"{key}: {name!r} is not readable by this user; fix its permissions")
        if path.stat().st_size == 0:
            raise ConfigError(
                f"{key}: {name!r} is an empty file (0 bytes); write the data again or point {key} at another file"
            )
        if path.suffix not in (".parquet", ".pq"):
            continue  # json and the other formats RLHFDataset reads: its own reader reports on them
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            metadata = pq.ParquetFile(path).metadata
        except (pa.ArrowException, OSError) as err:
            raise ConfigError(
                f"{key}: {name!r} is not a readable parquet file ({err}); write it with "
                "pandas.DataFrame.to_parquet or scripts/prepare_data.py"
            ) from None
        columns = metadata.schema.to_arrow_schema().names
        missing = [c for c in dict.fromkeys((prompt_key, reward_fn_key, *REQUIRED_COLUMNS)) if c not in columns]
        if missing:
            raise ConfigError(
                f"{key}: {name!r} lacks column(s) {missing}; it has {columns}. Rows must follow {SCHEMA} (or point "
                "data.prompt_key / data.reward_fn_key at the columns that hold the chat prompt and the data source)"
            )
        if metadata.num_rows == 0:
            raise ConfigError(f"{key}: {name!r} has no rows; point {key} at a file with prompts")
        table = pq.read_table(path, columns=list(dict.fromkeys((prompt_key, "reward_model"))))
        check_rows(
            table.column(prompt_key).to_pylist(),
            table.column("reward_model").to_pylist(),
            f"{key}: {name!r}",
            prompt_key,
        )


def check_rows(messages: list, reward_models: list, where: str, prompt_key: str = "prompt") -> None:
    """Every row has chat messages ``[{role, content}, ...]`` under ``prompt_key`` and a non-empty
    ``reward_model.ground_truth``; else :class:`ConfigError` naming ``where``, the rows and the fix."""
    no_truth = []
    for row, reward_model in enumerate(reward_models):
        truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
        if truth is None or (isinstance(truth, str) and not truth.strip()):
            no_truth.append(row)
    if no_truth:
        raise ConfigError(
            f"{where}: {len(no_truth)} of {len(reward_models)} rows have no reward_model.ground_truth "
            f"(rows {no_truth[:5]}{' ...' if len(no_truth) > 5 else ''}); every row needs the answer the scorer "
            "compares with: fill reward_model.ground_truth or drop those rows"
        )
    bad_prompt = [
        row
        for row, m in enumerate(messages)
        if not (isinstance(m, list) and m and all(isinstance(x, dict) and "role" in x and "content" in x for x in m))
    ]
    if bad_prompt:
        raise ConfigError(
            f"{where}: column {prompt_key!r} must hold chat messages [{{role, content}}, ...]; rows "
            f"{bad_prompt[:5]} do not (set data.prompt_key to the column that does)"
        )


def first_row(files) -> dict | None:
    """The first row of the first local parquet file (for the reward probe), or ``None``."""
    for name in _as_list(files):
        path = Path(os.path.expanduser(name))
        if "://" in name or path.suffix not in (".parquet", ".pq") or not path.is_file():
            continue
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=1):
            rows = batch.to_pylist()
            if rows:
                return rows[0]
    return None


# ---------------------------------------------------------------------------------------------------- reward


def describe_row(call: dict) -> str:
    """A response's row in words, for an error: its data source, ground truth and the start of the response."""
    response = str(call.get("solution_str", ""))
    excerpt = response if len(response) <= 80 else response[:77] + "..."
    source, truth = call.get("data_source"), call.get("ground_truth")  # numpy strings from verl's batches
    return (
        f"data_source={None if source is None else str(source)!r}, "
        f"ground truth {None if truth is None else str(truth)!r}, response {excerpt!r}"
    )


def reward_failure(
    label: str, where: str, *, timeout_s: float | None = None, error: Exception | None = None, result=None
) -> str:
    """One wording, for every engine, of a reward function that timed out, raised or returned no finite score
    ``where`` (``on the row ...``, ``on a probe (...)``)."""
    if timeout_s is not None:
        return (
            f"{label} did not return within dapo.reward_timeout_s={timeout_s:g} s {where}; fix the function (or "
            "raise the limit)"
        )
    if error is not None:
        return f"{label} raised {type(error).__name__}: {error} {where}; fix the function"
    return (
        f"{label} returned {result!r} {where}; a reward must be a finite number or a dict with a finite 'score'. "
        "Fix the function"
    )


def finite_score(result) -> float | None:
    """The score of one call's result if it is a finite number, else ``None``."""
    value = result.get("score") if isinstance(result, dict) else result
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class CheckedReward:
    """A reward function that stops the run, naming itself, the response's row and what went wrong, the first time
    it raises, returns a non-finite score (a NaN reward would make every group look constant to dynamic sampling,
    or every gradient non-finite) or takes longer than ``timeout_s`` (``dapo.reward_timeout_s``; enforced with
    ``SIGALRM`` when called from the main thread, as the embedded engine calls it)."""

    def __init__(self, fn, label: str, timeout_s: float | None = None) -> None:
        self.fn, self.label, self.timeout_s = fn, label, timeout_s

    def __call__(self, data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        row = {"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth}
        result, failure = _call(
            self.fn,
            self.label,
            lambda: f"on the row {describe_row(row)}",
            self.timeout_s,
            data_source,
            solution_str,
            ground_truth,
            extra_info,
            **kwargs,
        )
        if failure is not None:
            raise RunStopped(f"{failure}; the run stopped, its last checkpoint is intact")
        return result


def _call(fn, label: str, where, timeout_s: float | None, *args, **kwargs):
    """``(fn(*args, **kwargs), None)`` under ``timeout_s``, or ``(None, why)`` when it timed out, raised or returned
    no finite score (:func:`reward_failure`'s words; ``where()`` names the row, built only then)."""
    try:
        with _time_limit(timeout_s):
            result = fn(*args, **kwargs)
    except _RewardTimeout:
        return None, reward_failure(label, where(), timeout_s=timeout_s)
    except (RunStopped, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001 - the user's function: its failure is named, not traced back
        return None, reward_failure(label, where(), error=err)
    if finite_score(result) is None:
        return None, reward_failure(label, where(), result=result)
    return result, None


class _RewardTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    """Raise :class:`_RewardTimeout` in the main thread after ``seconds`` (no limit elsewhere, or with None)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _RewardTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def load_reward_function(
    path: str | None, name: str, reward_kwargs: dict, train_files, timeout_s: float | None = None
) -> CheckedReward:
    """``reward.custom_reward_function.{path,name}`` (``path`` unset: the DAPO scorer), checked on a probe."""
    if not path:
        from dapo.reward import compute_score

        return CheckedReward(compute_score, "the DAPO scorer (dapo.reward.compute_score)", timeout_s)
    label = f"reward.custom_reward_function ({path}:{name})"
    if not Path(os.path.expanduser(path)).is_file():
        raise ConfigError(
            f"reward.custom_reward_function.path={path!r}: no such file; set it to a python file that "
            "defines the reward function"
        )
    from verl.utils.import_utils import load_extern_object

    try:
        fn = load_extern_object(os.path.expanduser(path), name)
    except AttributeError:
        raise ConfigError(
            f"reward.custom_reward_function.name={name!r}: {path} defines no such function; set "
            "reward.custom_reward_function.name to the function's name"
        ) from None
    except Exception as err:  # noqa: BLE001 - any error while importing the user's file is theirs to fix
        cause = err.__cause__ or err  # verl wraps the import error in a RuntimeError of its own
        raise ConfigError(
            f"reward.custom_reward_function.path={path!r} fails to import "
            f"({type(cause).__name__}: {cause}); fix the file"
        ) from None
    if not callable(fn):
        raise ConfigError(
            f"reward.custom_reward_function.name={name!r} in {path} is a {type(fn).__name__}, not a "
            "function; point it at compute_score(data_source, solution_str, ground_truth, extra_info)"
        )

    row = first_row(train_files) or {}
    truth = (
        (row.get("reward_model") or {}).get("ground_truth", "1") if isinstance(row.get("reward_model"), dict) else "1"
    )
    source, extra = row.get("data_source", "probe"), row.get("extra_info")
    for response in (f"Answer: {truth}", ""):
        row = {"data_source": source, "solution_str": response, "ground_truth": truth}
        _, failure = _call(
            fn,
            label,
            lambda: f"on a probe ({describe_row(row)})",
            timeout_s,
            source,
            response,
            truth,
            extra,
            **reward_kwargs,
        )
        if failure is not None:
            raise ConfigError(failure)
    return CheckedReward(fn, label, timeout_s)


def check_model_path(key: str, path) -> None:
    """A local model path must exist; ``org/name`` is a hub id, left to the loader (remote paths too)."""
    if not path or "://" in str(path):
        return
    text = str(path)
    hub_id = text.count("/") == 1 and not text.startswith(("/", "~", ".")) and not os.path.exists(text)
    if hub_id or os.path.exists(os.path.expanduser(text)):
        return
    raise ConfigError(
        f"{key}={text!r}: no such directory; point it at a model saved with save_pretrained (or a "
        "hub id org/name where the hub is reachable)"
    )


def tokenizer_size(path: str) -> int:
    """Tokens of the tokenizer saved in ``path`` (its vocabulary and added tokens)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        return len(AutoTokenizer.from_pretrained(path))
    except (OSError, ValueError):  # a tokenizer saved from plain `tokenizers` (the tiny task's)
        return len(PreTrainedTokenizerFast.from_pretrained(path))
