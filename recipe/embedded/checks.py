"""Checks of what a run is given, made before any expensive work (the warm-up, a model load, Ray), and the guards
that stop a run which has stopped learning.

- :func:`check_data_files`: every local data file exists, is not empty, is a readable parquet file with rows and
  verl's columns; a bad file is named with the key that gave it and the fix, never with a raw ``ArrowInvalid``.
- :func:`load_reward_function`: ``reward.custom_reward_function.{path,name}`` imports, is callable and returns a
  finite number (or a dict with a finite ``score``) on a probe built from the first training row; the function is
  returned wrapped in :class:`CheckedReward`, which stops the run the first time it returns a non-finite number.
- :class:`UpdateGuard`: a step whose every optimizer update was skipped for a non-finite loss or gradient stops
  the run, and so does a run that ends having applied no update; neither exits 0 after training nothing.

Each failure is a :class:`~recipe.embedded.config.ConfigError`: one line, no traceback, exit status 2.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from recipe.embedded.config import ConfigError

REQUIRED_COLUMNS = ("reward_model",)
SCHEMA = ("verl's schema: data_source, prompt[{role, content}], ability, reward_model{ground_truth, style}, "
          "extra_info (scripts/prepare_data.py writes it)")


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
            raise ConfigError(f"{key}: {name!r} is an empty file (0 bytes); write the data again or point {key} "
                              "at another file")
        if path.suffix not in (".parquet", ".pq"):
            continue  # json and the other formats RLHFDataset reads: its own reader reports on them
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            metadata = pq.ParquetFile(path).metadata
        except (pa.ArrowException, OSError) as err:
            raise ConfigError(f"{key}: {name!r} is not a readable parquet file ({err}); write it with "
                              "pandas.DataFrame.to_parquet or scripts/prepare_data.py") from None
        columns = metadata.schema.to_arrow_schema().names
        missing = [c for c in dict.fromkeys((prompt_key, reward_fn_key, *REQUIRED_COLUMNS)) if c not in columns]
        if missing:
            raise ConfigError(
                f"{key}: {name!r} lacks column(s) {missing}; it has {columns}. Rows must follow {SCHEMA} (or point "
                "data.prompt_key / data.reward_fn_key at the columns that hold the chat prompt and the data source)"
            )
        if metadata.num_rows == 0:
            raise ConfigError(f"{key}: {name!r} has no rows; point {key} at a file with prompts")


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


def _finite_score(result) -> float | None:
    """The score of one call's result if it is a finite number, else ``None``."""
    value = result.get("score") if isinstance(result, dict) else result
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class CheckedReward:
    """A reward function that stops the run, naming itself, the first time it returns a non-finite score: a NaN
    reward would otherwise make every group look constant to dynamic sampling, or every gradient non-finite."""

    def __init__(self, fn, label: str) -> None:
        self.fn, self.label = fn, label

    def __call__(self, data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        result = self.fn(data_source, solution_str, ground_truth, extra_info, **kwargs)
        if _finite_score(result) is None:
            raise ConfigError(
                f"{self.label} returned {result!r} for a response of data_source={data_source!r}, ground truth "
                f"{ground_truth!r}; a reward must be a finite number or a dict with a finite 'score'. Fix the "
                "function; the run stopped before training on it"
            )
        return result


def load_reward_function(path: str | None, name: str, reward_kwargs: dict, train_files) -> CheckedReward:
    """``reward.custom_reward_function.{path,name}`` (``path`` unset: the DAPO scorer), checked on a probe."""
    if not path:
        from dapo.reward import compute_score

        return CheckedReward(compute_score, "the DAPO scorer (dapo.reward.compute_score)")
    label = f"reward.custom_reward_function ({path}:{name})"
    if not Path(os.path.expanduser(path)).is_file():
        raise ConfigError(f"reward.custom_reward_function.path={path!r}: no such file; set it to a python file that "
                          "defines the reward function")
    from verl.utils.import_utils import load_extern_object

    try:
        fn = load_extern_object(os.path.expanduser(path), name)
    except AttributeError:
        raise ConfigError(f"reward.custom_reward_function.name={name!r}: {path} defines no such function; set "
                          "reward.custom_reward_function.name to the function's name") from None
    except Exception as err:  # noqa: BLE001 - any error while importing the user's file is theirs to fix
        cause = err.__cause__ or err  # verl wraps the import error in a RuntimeError of its own
        raise ConfigError(f"reward.custom_reward_function.path={path!r} fails to import "
                          f"({type(cause).__name__}: {cause}); fix the file") from None
    if not callable(fn):
        raise ConfigError(f"reward.custom_reward_function.name={name!r} in {path} is a {type(fn).__name__}, not a "
                          "function; point it at compute_score(data_source, solution_str, ground_truth, extra_info)")

    row = first_row(train_files) or {}
    truth = (row.get("reward_model") or {}).get("ground_truth", "1") if isinstance(row.get("reward_model"), dict) \
        else "1"
    source, extra = row.get("data_source", "probe"), row.get("extra_info")
    for response in (f"Answer: {truth}", ""):
        try:
            result = fn(source, response, truth, extra, **reward_kwargs)
        except Exception as err:  # noqa: BLE001
            raise ConfigError(f"{label} raised {type(err).__name__}: {err} on a probe (data_source={source!r}, "
                              f"response {response!r}, ground truth {truth!r}); fix the function") from None
        if _finite_score(result) is None:
            raise ConfigError(f"{label} returned {result!r} on a probe (data_source={source!r}, response "
                              f"{response!r}, ground truth {truth!r}); a reward must be a finite number or a dict "
                              "with a finite 'score'")
    return CheckedReward(fn, label)


# ---------------------------------------------------------------------------------------------------- updates


class UpdateGuard:
    """Counts optimizer updates applied and skipped (non-finite gradient norm); :meth:`end_step` stops a run whose
    step skipped every update, :meth:`end_run` one that ends having applied none."""

    def __init__(self) -> None:
        self.applied = self.skipped = 0
        self._step_applied = self._step_skipped = 0

    def record(self, applied: bool) -> None:
        if applied:
            self.applied, self._step_applied = self.applied + 1, self._step_applied + 1
        else:
            self.skipped, self._step_skipped = self.skipped + 1, self._step_skipped + 1

    def end_step(self, step: int, lr_key: str = "actor_rollout_ref.actor.optim.lr") -> None:
        applied, skipped = self._step_applied, self._step_skipped
        self._step_applied = self._step_skipped = 0
        if skipped and not applied:
            raise ConfigError(
                f"step {step}: all {skipped} policy updates were skipped for a non-finite loss or gradient norm, so "
                f"the policy no longer trains. Rewards were finite (they are checked), so the model diverged: lower "
                f"{lr_key}, or resume from the last checkpoint with embedded.dtype=float32"
            )

    @staticmethod
    def diverged(err: RuntimeError, step: int, lr_key: str = "actor_rollout_ref.actor.optim.lr") -> Exception:
        """The error to raise for ``err`` from inside a step: sampling from a policy whose weights have diverged
        fails in ``torch.multinomial`` with a message about ``inf``/``nan``; that becomes a one-line error naming
        the learning rate, any other error is returned unchanged."""
        if "inf" in str(err) and "nan" in str(err):
            return ConfigError(
                f"step {step}: the policy's probabilities are no longer finite ({err}), so its weights diverged in "
                f"an earlier update; lower {lr_key} (or actor_rollout_ref.actor.optim.clip_grad) and start over, or "
                "resume from an earlier checkpoint"
            )
        return err

    def end_run(self, steps: int) -> None:
        if steps > 0 and self.applied == 0:
            raise ConfigError(f"{steps} steps ran but no policy update was applied; the run trained nothing")
