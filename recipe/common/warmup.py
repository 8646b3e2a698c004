"""The tiny model and its task (``tiny.*``, ``configs/tiny.yaml``): task data, tokenizer and a supervised warm-up,
cached. Both engines start from it when no model and data are given: the embedded engine directly, the verl engine
on a CPU through the links of :mod:`recipe.dapo.cpu.prepare`.

A random model never answers correctly, so every group would be all-wrong and dynamic sampling would have
nothing to keep. A short supervised phase (teacher forcing on ``Answer: <sum>``, loss on the response tokens only)
brings the model to a modest, imperfect accuracy, where sampling G responses gives groups with mixed outcomes.

Both stages are cached under ``cache_dir``: the task files and tokenizer keyed by a hash of the task settings
(``tiny/task-<hash>``), the warmed-up model keyed by a hash of task + model + warm-up settings
(``tiny/warmup-<hash>``). A directory is built under a temporary name and renamed when complete, so an
interrupted build is redone and a completed one is reused by every later run with the same settings.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from dapo.settings import ConfigError, engine_setting, select
from recipe.common.cache import build_atomically, digest
from recipe.common.log_probs import sequence_log_probs
from recipe.common.task import AdditionTask, ChainTask, StepsAdditionTask, build_model, build_tokenizer, solution_text

_CACHE_VERSION = 1  # bump when the recipe of the cached artefacts changes

TASK_DEFAULTS = {"name": "addition", "digits": 2, "val_size": 256, "seed": 0}
TASKS = {  # tiny.task.name -> (task class, its settings' defaults)
    "addition": (AdditionTask, TASK_DEFAULTS),
    "addition_steps": (
        StepsAdditionTask,
        {"name": "addition_steps", "digits": 3, "val_size": 256, "train_size": 4000, "seed": 0},
    ),
    "chain": (
        ChainTask,
        {"name": "chain", "min_steps": 1, "max_steps": 20, "val_size": 256, "train_size": 4000, "seed": 0},
    ),
}
MODEL_DEFAULTS = {
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
WARMUP_DEFAULTS = {"steps": 220, "batch_size": 64, "lr": 2e-3, "seed": 0}
CACHE_SUBDIR = "tiny"  # <cache_dir>/tiny/{task,warmup}-<hash>


@dataclass(frozen=True)
class TinySettings:
    """``tiny.*`` and ``cache_dir``: the tiny Qwen2, its synthetic task and warm-up (``configs/tiny.yaml``), used
    when ``actor_rollout_ref.model.path`` and the data files are null; by both engines (the verl engine on a CPU
    through ``python -m recipe.dapo.cpu.prepare``)."""

    cache_dir: str = engine_setting("cache_dir", "where the project caches what it builds ($DAPO_CACHE_DIR when set)")
    task: dict = engine_setting("tiny.task", "the synthetic task when the data files are null (recipe/common/task.py)")
    model: dict = engine_setting("tiny.model", "the tiny Qwen2's shape when actor_rollout_ref.model.path is null")
    warmup: dict = engine_setting("tiny.warmup", "the tiny model's supervised warm-up (cached)")

    @classmethod
    def from_config(cls, config: Mapping) -> TinySettings:
        get = lambda key: select(config, key, required=True)  # noqa: E731
        return cls(
            cache_dir=os.path.expanduser(str(get("cache_dir"))),
            task=dict(get("tiny.task") or {}),
            model=dict(get("tiny.model") or {}),
            warmup=dict(get("tiny.warmup") or {}),
        )

    def task_dir(self) -> Path:
        """The task's files (:func:`task_files`): ``train.parquet``, ``val.parquet``, ``tokenizer/``."""
        return task_files(self.cache_dir, self.task)

    def model_dir(self, device="cpu", **options) -> Path:
        """The warmed-up tiny model (:func:`warm_model`; ``options``: its ``log`` and ``progress_bar``)."""
        return warm_model(self.cache_dir, self.task, self.model, self.warmup, device=device, **options)


def _settings(given: dict, defaults: dict, key: str) -> dict:
    """``defaults`` updated by ``given``; a null value counts as not given (so that a config can unset another
    task's knob inherited from configs/tiny.yaml, as configs/ablation_chain.yaml does with ``digits``)."""
    given = {k: v for k, v in given.items() if v is not None}
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        first = unknown[0]
        raise ConfigError(
            f"unknown key(s) {unknown} under {key}; known: {sorted(defaults)}. A key another setting of {key} "
            f"needs can be unset with {key}.{first}=null or deleted with ~{key}.{first}"
        )
    return {**defaults, **given}


def task_files(cache_dir: str, task: dict) -> Path:
    """The synthetic task's ``train.parquet``, ``val.parquet`` and ``tokenizer/`` (built once, then cached)."""
    name = task.get("name", "addition")
    if name not in TASKS:
        raise ConfigError(f"tiny.task.name={name!r} is unknown; the tasks are {', '.join(TASKS)}")
    task_class, defaults = TASKS[name]
    task = _settings(task, defaults, "tiny.task")
    spec = task_class(**{k: int(v) for k, v in task.items() if k != "name"})
    try:
        spec.problems()  # validates the settings before anything is written
    except ValueError as err:
        raise ConfigError(str(err)) from None

    def build(out: Path) -> dict:
        spec.write_parquet(out)
        build_tokenizer(spec).save_pretrained(out / "tokenizer")
        return {"task": task}

    return build_atomically(Path(cache_dir) / CACHE_SUBDIR / f"task-{digest([_CACHE_VERSION, task])}", build)


def warm_model(
    cache_dir: str, task: dict, model: dict, warmup: dict, *, device, log=print, progress_bar: bool = True
) -> Path:
    """The warmed-up tiny model (Hugging Face format, with its tokenizer); built once per settings, then cached.
    ``progress_bar``: a tqdm bar over the warm-up steps while it is built (``embedded.progress_bar``)."""
    task_dir = task_files(cache_dir, task)
    model = _settings(model, MODEL_DEFAULTS, "tiny.model")
    warmup = _settings(warmup, WARMUP_DEFAULTS, "tiny.warmup")
    key = digest([_CACHE_VERSION, json.loads((task_dir / "done.json").read_text()), model, warmup])
    final = Path(cache_dir) / CACHE_SUBDIR / f"warmup-{key}"
    if (final / "done.json").is_file():
        info = json.loads((final / "done.json").read_text())
        log(f"warm-up: reusing {final} (built in {info['seconds']:.0f} s)")
        return final

    def build(out: Path) -> dict:
        from transformers import AutoTokenizer

        log(f"warm-up: {warmup['steps']} supervised steps of {warmup['batch_size']} prompts (cached in {final})")
        start = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(task_dir / "tokenizer")
        # its own RNG stream: a run that builds the warm-up trains exactly like one that finds it cached
        with torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else []):
            torch.manual_seed(int(warmup["seed"]))
            policy = build_model(tokenizer, **model).to(device)
            loss = supervised_warmup(policy, tokenizer, task_dir / "train.parquet", **warmup, progress_bar=progress_bar)
        policy.save_pretrained(out)
        tokenizer.save_pretrained(out)
        seconds = time.perf_counter() - start
        log(f"warm-up: done in {seconds:.0f} s, final loss {loss:.3f}")
        return {"task_dir": str(task_dir), "model": model, "warmup": warmup, "seconds": seconds, "final_loss": loss}

    return build_atomically(final, build)


def supervised_warmup(
    model,
    tokenizer,
    train_file: Path,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    progress_bar: bool = False,
    autocast_dtype: torch.dtype | None = None,
) -> float:
    """Teacher-forced cross-entropy on the task's solution (``Answer: <ground truth>``, or the worked solution of
    ``addition_steps``) followed by EOS, for random train prompts; the last loss.

    ``autocast_dtype`` (e.g. bf16): the forward runs under ``torch.autocast`` of that dtype, one context per step.
    Never wrap the whole loop in one autocast context instead: autocast caches its low-precision copy of each
    weight for the context's lifetime, so later steps would compute with the first step's weights while the
    optimizer moves the fp32 ones (measured here: the batch loss fell to 0.08 while the saved model's rose to 18)."""
    import pandas as pd

    rows = pd.read_parquet(train_file)
    texts = [tokenizer.apply_chat_template(list(m), add_generation_prompt=True, tokenize=False) for m in rows["prompt"]]
    prompts = [torch.tensor(t) for t in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    targets = [
        torch.tensor(tokenizer(solution_text(row), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        for row in rows.to_dict("records")
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 10))  # 10-step warm-up
    generator = torch.Generator().manual_seed(seed)
    model.train()
    loss = torch.tensor(float("nan"))
    from tqdm import tqdm

    for _ in tqdm(range(steps), desc="warm-up", unit="step", disable=not progress_bar, dynamic_ncols=True):
        idx = torch.randint(len(prompts), (batch_size,), generator=generator).tolist()
        width = max(len(targets[i]) for i in idx)
        response = torch.full((batch_size, width), tokenizer.pad_token_id, dtype=torch.long)  # [B, T]
        mask = torch.zeros((batch_size, width), dtype=torch.long)  # [B, T]
        for row, i in enumerate(idx):
            response[row, : len(targets[i])] = targets[i]
            mask[row, : len(targets[i])] = 1
        device_type = next(model.parameters()).device.type
        with torch.autocast(device_type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            log_prob, _ = sequence_log_probs(
                model, [prompts[i] for i in idx], response, mask, temperature=1.0, pad_id=tokenizer.pad_token_id
            )  # [B, T]
        loss = -(log_prob * mask.to(log_prob.device)).sum() / mask.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    return float(loss.detach())
