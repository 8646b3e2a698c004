"""What a run is, so that a checkpoint is resumed only by the run it belongs to.

A checkpoint records its run's identity (``run.json`` beside ``trainer_state.pt``): the model it started from
(``actor_rollout_ref.model.path``, and the folder it resolves to when it is a link, or the settings that build the
tiny model: ``tiny.task``, ``tiny.model``, ``tiny.warmup``), the data files (paths, row counts), every setting that
changes what a step computes (:data:`TRAINING_KEYS`, verl's names). Settings that only change how long, how often or
where a run reports (``trainer.total_training_steps``, ``trainer.test_freq``, ``trainer.logger``, micro-batch sizes,
threads) are not part of it, so a finished run can be extended and a resumed one watched differently.

Resuming into a checkpoint whose identity differs is refused before any model is loaded, naming the keys that
differ and the three ways out (a new ``trainer.experiment_name``, another ``trainer.default_local_dir``, or
``trainer.resume_mode=disable`` to start over in the same directory).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf

from dapo.settings import ConfigError, select

IDENTITY_FILE = "run.json"

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
TRAINING_KEYS = (  # the settings that change what a training step computes (verl's names)
    "data.train_batch_size",
    "data.gen_batch_size",
    "data.max_prompt_length",
    "data.max_response_length",
    "data.shuffle",
    "data.seed",
    "data.prompt_key",
    "data.reward_fn_key",
    "data.train_max_samples",
    "data.filter_overlong_prompts",
    "data.truncation",
    "data.apply_chat_template_kwargs",
    f"{ROLLOUT}.n",
    f"{ROLLOUT}.temperature",
    f"{ROLLOUT}.top_p",
    f"{ROLLOUT}.top_k",
    f"{ACTOR}.clip_ratio_low",
    f"{ACTOR}.clip_ratio_high",
    f"{ACTOR}.clip_ratio_c",
    f"{ACTOR}.loss_agg_mode",
    f"{ACTOR}.loss_scale_factor",
    f"{ACTOR}.policy_loss.loss_mode",
    f"{ACTOR}.ppo_mini_batch_size",
    f"{ACTOR}.ppo_epochs",
    f"{ACTOR}.entropy_coeff",
    f"{ACTOR}.optim.lr",
    f"{ACTOR}.optim.lr_warmup_steps",
    f"{ACTOR}.optim.weight_decay",
    f"{ACTOR}.optim.betas",
    f"{ACTOR}.optim.clip_grad",
    f"{ACTOR}.optim.grad_clip",
    "algorithm.adv_estimator",
    "algorithm.norm_adv_by_std_in_grpo",
    "algorithm.filter_groups.enable",
    "algorithm.filter_groups.metric",
    "algorithm.filter_groups.max_num_gen_batches",
    "reward.reward_kwargs",
    "reward.custom_reward_function.path",
    "reward.custom_reward_function.name",
    "reward.custom_reward_function.reward_kwargs",
    "dapo.overlong_filter",
    "dapo.sampling",
    "embedded.seed",
    "embedded.dtype",
)
MODEL_KEY = "actor_rollout_ref.model.path"
# the folder a model path that is (or passes through) a symbolic link resolves to: the same link to another model
# is another run; a checkpoint recorded before this key was kept is compared by the path alone
MODEL_TARGET = f"{MODEL_KEY} (target)"
TINY_MODEL_KEYS = ("tiny.task", "tiny.model", "tiny.warmup")
# labels that checkpoints written before the tiny model had its own section (configs/tiny.yaml) recorded
FORMER_LABELS = {"embedded.task": "tiny.task", "embedded.model": "tiny.model", "embedded.warmup": "tiny.warmup"}
DATA_KEYS = ("data.train_files", "data.val_files")


def _plain(value):
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    return json.loads(json.dumps(value, sort_keys=True, default=str))  # what run.json gives back


def _local_path(path: str) -> str:
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def _files(value) -> list[str] | None:
    if value in (None, "", []):
        return None
    return [_local_path(str(f)) for f in ([value] if isinstance(value, str) else value)]


def _parquet_rows(path: str) -> int | None:
    """The row count a parquet file's footer declares (``None``: not a local parquet file)."""
    if "://" in path or not path.endswith((".parquet", ".pq")) or not os.path.isfile(path):
        return None
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # noqa: BLE001 - an unreadable file is reported by the data checks, with its key
        return None


def run_identity(cfg: DictConfig) -> dict:
    """``{verl key: value}`` of what this run is: model, data files, the settings of :data:`TRAINING_KEYS`."""
    get = lambda key: _plain(select(cfg, key))  # noqa: E731
    model = get(MODEL_KEY)
    local = model and os.path.exists(os.path.expanduser(str(model)))
    identity: dict = {MODEL_KEY: _local_path(str(model)) if local else model}
    target = os.path.realpath(identity[MODEL_KEY]) if local else None
    if target and target != identity[MODEL_KEY]:  # a link, repointed by a rebuild (the verl CPU run's <cache_dir>)
        identity[MODEL_TARGET] = target
    if model is None:  # the tiny model: its build settings are what it is
        identity.update({key: get(key) for key in TINY_MODEL_KEYS})
    for key in DATA_KEYS:
        identity[key] = _files(get(key))
        if identity[key]:  # a file rewritten in place with other rows is other data
            identity[f"{key} (rows)"] = [_parquet_rows(path) for path in identity[key]]
    if identity["data.train_files"] is None or identity["data.val_files"] is None:  # the tiny task's files
        task = get("tiny.task") or {}
        identity["tiny.task"] = {k: v for k, v in task.items() if v is not None}  # null: unset (warmup._settings)
    identity.update({key: get(key) for key in TRAINING_KEYS})
    return identity


def write_identity(checkpoint_dir: Path, identity: dict) -> None:
    (checkpoint_dir / IDENTITY_FILE).write_text(json.dumps(identity, indent=1, sort_keys=True))


def read_identity(checkpoint_dir: Path) -> dict | None:
    """The identity a checkpoint recorded (its former labels renamed, :data:`FORMER_LABELS`), or ``None`` for a
    checkpoint written before identities were recorded."""
    path = checkpoint_dir / IDENTITY_FILE
    if not path.is_file():
        return None
    return {FORMER_LABELS.get(key, key): value for key, value in json.loads(path.read_text()).items()}


def differences(recorded: dict, current: dict) -> list[str]:
    """``key: recorded -> current`` for every key whose value differs."""
    keys = sorted(set(recorded) | set(current))
    return [
        f"{key}: {_short(recorded.get(key))} there, {_short(current.get(key))} now"
        for key in keys
        if recorded.get(key) != current.get(key)
        and not _unknown_rows(key, recorded, current)
        and not (key == MODEL_TARGET and key not in recorded)
    ]


def _unknown_rows(key: str, recorded: dict, current: dict) -> bool:
    """A row count that one side could not read (a file local to another node) is not a difference."""
    if not key.endswith(" (rows)"):
        return False
    a, b = recorded.get(key) or [], current.get(key) or []
    return len(a) != len(b) or None in a or None in b


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."


def check_same_run(checkpoint_dir: Path, current: dict) -> None:
    """Raise :class:`ConfigError` when ``checkpoint_dir`` belongs to a run other than ``current``."""
    recorded = read_identity(checkpoint_dir)
    if recorded is None:
        print(f"warning: {checkpoint_dir} records no run identity (written by an older version); resuming it as is")
        return
    changed = differences(recorded, current)
    if changed:
        shown = "; ".join(changed[:6]) + (f"; and {len(changed) - 6} more" if len(changed) > 6 else "")
        raise ConfigError(
            f"{checkpoint_dir} is a checkpoint of a different run ({shown}). Resuming it would train that run, not "
            "this one. To start this run elsewhere set trainer.experiment_name=<new name> or "
            "trainer.default_local_dir=<new directory>; to start over in this directory (its checkpoints are "
            "overwritten) set trainer.resume_mode=disable; to continue that run, drop the changed settings"
        )
