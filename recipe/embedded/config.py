"""What the embedded engine reads from the composed config (verl's keys), checked once, as typed frozen sections.

The engine reads the Hydra config in one place, here, and validates it with errors that name the key to set.
Everything else in the engine takes these objects. The pattern is :mod:`dapo.settings`' own: one frozen dataclass
per section, each field declaring its verl key and its meaning (``metadata``: ``key``, ``help``; the
configuration reference is generated from them), built by a ``from_config`` classmethod from the plain mapping
``OmegaConf.to_container`` gives, every key read with :func:`dapo.settings.select`:

* :class:`DataConfig`       ``data.*``                      files, columns, lengths, batch sizes, prompt shaping
* :class:`RolloutConfig`    ``actor_rollout_ref.rollout.*``   sampling for training and validation, batching
* :class:`ActorConfig`      ``actor_rollout_ref.actor.*``     mini- and micro-batches, epochs, optimizer
* :class:`ModelConfig`      ``actor_rollout_ref.model.*``     the model and tokenizer to load
* :class:`AlgorithmConfig`  ``algorithm.*``                   advantage normalisation, behaviour log-probs
* :class:`RewardConfig`     ``reward.custom_reward_function.*``, ``dapo.reward_timeout_s``
* :class:`TrainerConfig`    ``trainer.*``                     length, validation, checkpoints, logging, resume
* :class:`EmbeddedConfig`   ``embedded.*``                    the engine's own keys (device, dtype, threads)
* :class:`~recipe.common.warmup.TinySettings` ``tiny.*``, ``cache_dir`` the tiny model and its task (both engines)

:class:`EngineConfig` holds them, with :class:`dapo.settings.DapoSettings` (the loss, dynamic sampling, overlong
filtering and shaping), built from the config exactly as the verl engine builds it. Values both engines check
(``dapo.settings.RunSettings``: ``rollout.n``, sampling, lengths, optimizer, schedule) are declared there once
(``_shared``: key, meaning, check) and their values taken from there, not read twice. There are no fallback
defaults: the composed config carries verl's own YAML (``configs/dapo_trainer.yaml`` composes ``ppo_trainer``), so
a key the engine reads is always declared; a missing one, shared keys included (``dapo.settings`` alone would give
its default), is a config not composed from ``configs/`` and is refused naming the key. Meanings are verl's:
``data.train_batch_size`` and ``actor.ppo_mini_batch_size`` count prompts (a prompt brings ``rollout.n``
responses), while ``actor.ppo_micro_batch_size_per_gpu`` and ``rollout.log_prob_micro_batch_size_per_gpu`` count
responses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dapo.settings import (
    ConfigError,
    DapoSettings,
    EntrySettings,
    RunSettings,
    check_float,
    check_int,
    divisor_near,
    engine_setting,
    select,
    shared_declaration,
)
from recipe.common.warmup import TinySettings
from recipe.common.watchdog import WatchdogSettings

__all__ = [
    "ActorConfig",
    "AlgorithmConfig",
    "ConfigError",
    "DataConfig",
    "EmbeddedConfig",
    "EngineConfig",
    "ModelConfig",
    "RewardConfig",
    "RolloutConfig",
    "SECTIONS",
    "TrainerConfig",
    "ignored_verl_keys",
    "read_config",
]

ROLLOUT = "actor_rollout_ref.rollout"
ACTOR = "actor_rollout_ref.actor"
MODEL = "actor_rollout_ref.model"


def _shared(key: str) -> Any:
    """A section field both engines read: declared once in :mod:`dapo.settings` (:func:`dapo.settings.setting`,
    key, meaning, check), its value taken from there."""
    key, help = shared_declaration(key)  # noqa: A001
    return field(metadata={"key": key, "help": help, "shared": True})


def _get(config: Mapping, key: str, default: Any = None) -> Any:
    return select(config, key, default, required=True)


def _files(value) -> list[str] | None:
    if value is None or value == "" or value == []:
        return None
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _max_samples(config: Mapping, key: str) -> int:
    value = check_int(key, _get(config, key, -1), minimum=-1)
    return value or -1  # verl: 0 or -1 reads every row


def _positive(key: str, value) -> int:
    return check_int(key, value, minimum=1)


@dataclass(frozen=True)
class DataConfig:
    """``data.*``: the prompt files, their columns, lengths and batch sizes."""

    train_files: list[str] | None = engine_setting(
        "data.train_files",
        "parquet files in verl's schema (null: the synthetic task tiny.task, built under cache_dir)",
    )
    val_files: list[str] | None = engine_setting(
        "data.val_files", "held-out parquet files (null: the synthetic task's)"
    )
    train_max_samples: int = engine_setting("data.train_max_samples", "rows read from the train files (-1: all)")
    val_max_samples: int = engine_setting("data.val_max_samples", "rows read from the validation files (-1: all)")
    prompt_key: str = engine_setting("data.prompt_key", "the column holding the chat messages")
    reward_fn_key: str = engine_setting("data.reward_fn_key", "the column naming each row's data source")
    max_prompt_length: int = _shared("data.max_prompt_length")
    max_response_length: int = _shared("data.max_response_length")
    train_batch_size: int = _shared("data.train_batch_size")
    gen_batch_size: int = _shared("data.gen_batch_size")
    val_batch_size: int | None = engine_setting(
        "data.val_batch_size", "prompts per validation sampling call (null: all)"
    )
    shuffle: bool = engine_setting("data.shuffle", "draw train prompts in a seeded shuffled order each epoch")
    seed: int = engine_setting("data.seed", "the prompt order's seed (null: embedded.seed)")
    filter_overlong_prompts: bool = engine_setting(
        "data.filter_overlong_prompts", "drop prompts longer than max_prompt_length instead of refusing them"
    )
    truncation: str = engine_setting("data.truncation", "a prompt over max_prompt_length: error, left, right or middle")
    apply_chat_template_kwargs: dict = engine_setting(
        "data.apply_chat_template_kwargs", "extra keyword arguments of the tokenizer's apply_chat_template"
    )

    @classmethod
    def from_config(cls, config: Mapping, settings: DapoSettings, seed: int) -> DataConfig:
        truncation = _get(config, "data.truncation", "error")
        if truncation not in ("error", "left", "right", "middle"):
            raise ConfigError(f"data.truncation must be one of error, left, right, middle; got {truncation!r}")
        data_seed = _get(config, "data.seed")
        return cls(
            train_files=_files(_get(config, "data.train_files")),
            val_files=_files(_get(config, "data.val_files")),
            train_max_samples=_max_samples(config, "data.train_max_samples"),
            val_max_samples=_max_samples(config, "data.val_max_samples"),
            prompt_key=str(_get(config, "data.prompt_key")),
            reward_fn_key=str(_get(config, "data.reward_fn_key")),
            max_prompt_length=settings.run.max_prompt_length,
            max_response_length=settings.run.max_response_length,
            train_batch_size=settings.sampling.train_batch_size,
            gen_batch_size=settings.sampling.gen_batch_size,
            val_batch_size=_get(config, "data.val_batch_size"),
            shuffle=bool(_get(config, "data.shuffle")),
            seed=seed if data_seed is None else check_int("data.seed", data_seed, minimum=0),
            filter_overlong_prompts=bool(_get(config, "data.filter_overlong_prompts")),
            truncation=truncation,
            apply_chat_template_kwargs=_get(config, "data.apply_chat_template_kwargs", {}),
        )

    def prompt_kwargs(self) -> dict[str, Any]:
        """How prompts are read from a file (``recipe.embedded.data.load_prompts``' keywords): one place for every
        reader of this config's data."""
        return {
            "prompt_key": self.prompt_key,
            "reward_fn_key": self.reward_fn_key,
            "max_prompt_length": self.max_prompt_length,
            "filter_overlong_prompts": self.filter_overlong_prompts,
            "truncation": self.truncation,
            "seed": self.seed,
            "apply_chat_template_kwargs": self.apply_chat_template_kwargs,
        }


@dataclass(frozen=True)
class RolloutConfig:
    """``actor_rollout_ref.rollout.*``: how responses are sampled for training and for validation."""

    n: int = _shared(f"{ROLLOUT}.n")
    temperature: float = _shared(f"{ROLLOUT}.temperature")
    top_p: float = _shared(f"{ROLLOUT}.top_p")
    top_k: int = _shared(f"{ROLLOUT}.top_k")
    val_n: int = _shared(f"{ROLLOUT}.val_kwargs.n")
    val_temperature: float = _shared(f"{ROLLOUT}.val_kwargs.temperature")
    val_top_p: float = _shared(f"{ROLLOUT}.val_kwargs.top_p")
    val_top_k: int = engine_setting(f"{ROLLOUT}.val_kwargs.top_k", "validation top-k (0: off; -1 reads as 0)")
    val_do_sample: bool = engine_setting(
        f"{ROLLOUT}.val_kwargs.do_sample", "sample validation responses (false: greedy)"
    )
    max_num_seqs: int = engine_setting(f"{ROLLOUT}.max_num_seqs", "responses decoded at once (memory: the KV cache)")
    log_prob_micro_batch_size: int = engine_setting(
        f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu",
        "responses per forward when old log-probs are recomputed (null: the actor's micro-batch)",
    )

    @classmethod
    def from_config(cls, config: Mapping, run: RunSettings, actor_micro: int) -> RolloutConfig:
        do_sample = bool(_get(config, f"{ROLLOUT}.val_kwargs.do_sample"))
        if not do_sample and run.val_n != 1:
            raise ConfigError(
                f"greedy validation ({ROLLOUT}.val_kwargs.do_sample=false) gives the same response every time; "
                f"set {ROLLOUT}.val_kwargs.n=1 (got {run.val_n}) or do_sample=true"
            )
        val_top_k = check_int(
            f"{ROLLOUT}.val_kwargs.top_k", _get(config, f"{ROLLOUT}.val_kwargs.top_k", -1), minimum=-1
        )
        log_prob_micro = _get(config, f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", actor_micro)
        return cls(
            n=run.n,
            temperature=run.temperature,
            top_p=run.top_p,
            top_k=max(0, run.top_k),
            val_n=run.val_n,
            val_temperature=run.val_temperature,
            val_top_p=run.val_top_p,
            val_top_k=max(0, val_top_k),
            val_do_sample=do_sample,
            max_num_seqs=_positive(f"{ROLLOUT}.max_num_seqs", _get(config, f"{ROLLOUT}.max_num_seqs")),
            log_prob_micro_batch_size=_positive(f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", log_prob_micro),
        )


@dataclass(frozen=True)
class ActorConfig:
    """``actor_rollout_ref.actor.*``: how the policy update batches the train batch, and its optimizer."""

    ppo_mini_batch_size: int = _shared(f"{ACTOR}.ppo_mini_batch_size")
    ppo_micro_batch_size: int = engine_setting(
        f"{ACTOR}.ppo_micro_batch_size_per_gpu",
        "responses per forward/backward (gradients accumulate; the loss is unchanged)",
    )
    ppo_epochs: int = _shared(f"{ACTOR}.ppo_epochs")
    grad_clip: float = engine_setting(
        f"{ACTOR}.optim.clip_grad",
        "largest gradient norm an update keeps (optim.grad_clip, deprecated, overrides it when set)",
    )
    lr: float = _shared(f"{ACTOR}.optim.lr")
    lr_warmup_steps: int = engine_setting(f"{ACTOR}.optim.lr_warmup_steps", "linear warm-up steps (-1 or 0: none)")
    weight_decay: float = _shared(f"{ACTOR}.optim.weight_decay")
    betas: tuple[float, float] = _shared(f"{ACTOR}.optim.betas")
    entropy_coeff: float = engine_setting(f"{ACTOR}.entropy_coeff", "entropy bonus in the loss (DAPO: 0)")

    @classmethod
    def from_config(cls, config: Mapping, run: RunSettings) -> ActorConfig:
        n, mini = run.n, run.ppo_mini_batch_size
        micro = _positive(
            f"{ACTOR}.ppo_micro_batch_size_per_gpu", _get(config, f"{ACTOR}.ppo_micro_batch_size_per_gpu", mini * n)
        )
        if (mini * n) % micro:
            raise ConfigError(
                f"a mini-batch of {mini} prompts x {n} responses = {mini * n} responses is not divisible by "
                f"{ACTOR}.ppo_micro_batch_size_per_gpu={micro} (it counts responses); choose one that divides "
                f"{mini * n}, e.g. {divisor_near(mini * n, micro)}"
            )
        # verl's FSDP engine clips with optim.clip_grad (optim.grad_clip, deprecated and optional, overrides it)
        key = f"{ACTOR}.optim.grad_clip" if select(config, f"{ACTOR}.optim.grad_clip") else f"{ACTOR}.optim.clip_grad"
        grad_clip = check_float(key, select(config, key, required=True))
        if grad_clip <= 0:
            raise ConfigError(
                f"{key} must be > 0 (the largest gradient norm an update keeps), got {grad_clip!r}; the paper uses 1.0"
            )
        warmup = check_int(
            f"{ACTOR}.optim.lr_warmup_steps", _get(config, f"{ACTOR}.optim.lr_warmup_steps", -1), minimum=-1
        )
        return cls(
            ppo_mini_batch_size=mini,
            ppo_micro_batch_size=micro,
            ppo_epochs=run.ppo_epochs,
            grad_clip=grad_clip,
            lr=run.lr,
            lr_warmup_steps=max(0, warmup),
            weight_decay=run.weight_decay,
            betas=run.betas,
            entropy_coeff=check_float(f"{ACTOR}.entropy_coeff", _get(config, f"{ACTOR}.entropy_coeff", 0.0)),
        )


@dataclass(frozen=True)
class ModelConfig:
    """``actor_rollout_ref.model.*``: the policy to load."""

    path: str | None = engine_setting(
        f"{MODEL}.path", "a local Hugging Face folder or hub id (null: the embedded tiny Qwen2, warmed up)"
    )
    tokenizer_path: str | None = engine_setting(f"{MODEL}.tokenizer_path", "the tokenizer's folder (null: model.path)")
    custom_chat_template: str | None = engine_setting(
        f"{MODEL}.custom_chat_template", "a Jinja chat template replacing the tokenizer's"
    )
    trust_remote_code: bool = engine_setting(f"{MODEL}.trust_remote_code", "run the model folder's own Python code")
    gradient_checkpointing: bool = engine_setting(
        f"{MODEL}.enable_gradient_checkpointing", "recompute activations in the backward pass (less memory, slower)"
    )

    @classmethod
    def from_config(cls, config: Mapping) -> ModelConfig:
        return cls(
            path=_get(config, f"{MODEL}.path"),
            tokenizer_path=_get(config, f"{MODEL}.tokenizer_path"),
            custom_chat_template=_get(config, f"{MODEL}.custom_chat_template"),
            trust_remote_code=bool(_get(config, f"{MODEL}.trust_remote_code")),
            gradient_checkpointing=bool(_get(config, f"{MODEL}.enable_gradient_checkpointing")),
        )


@dataclass(frozen=True)
class AlgorithmConfig:
    """``algorithm.*``: the advantage and the behaviour policy's log-probs."""

    norm_adv_by_std_in_grpo: bool = engine_setting(
        "algorithm.norm_adv_by_std_in_grpo", "divide each group's advantages by its reward standard deviation"
    )
    bypass_mode: bool = engine_setting(
        "algorithm.rollout_correction.bypass_mode",
        "old log-probs from the sampling pass (true) or recomputed by the actor (false)",
    )

    @classmethod
    def from_config(cls, config: Mapping) -> AlgorithmConfig:
        estimator = _get(config, "algorithm.adv_estimator")
        if estimator != "grpo":
            raise ConfigError(
                f"algorithm.adv_estimator={estimator!r}: the embedded engine implements DAPO's group-relative "
                "advantage only; set algorithm.adv_estimator=grpo"
            )
        if _get(config, f"{ACTOR}.use_kl_loss") or _get(config, "algorithm.use_kl_in_reward"):
            raise ConfigError(
                "the embedded engine has no reference model (DAPO drops the KL term); set "
                f"{ACTOR}.use_kl_loss=false and algorithm.use_kl_in_reward=false"
            )
        return cls(
            norm_adv_by_std_in_grpo=bool(_get(config, "algorithm.norm_adv_by_std_in_grpo")),
            bypass_mode=bool(_get(config, "algorithm.rollout_correction.bypass_mode")),
        )


@dataclass(frozen=True)
class RewardConfig:
    """``reward.custom_reward_function.*``: the scorer (``dapo.reward.compute_score`` unless set)."""

    path: str | None = engine_setting(
        "reward.custom_reward_function.path",
        "a Python file with the scoring function (null: dapo.reward.compute_score)",
    )
    name: str = engine_setting("reward.custom_reward_function.name", "the function's name in that file")
    kwargs: dict = engine_setting(
        "reward.custom_reward_function.reward_kwargs", "keyword arguments passed to every call"
    )
    timeout_s: float | None = _shared("dapo.reward_timeout_s")

    @classmethod
    def from_config(cls, config: Mapping, entry: EntrySettings) -> RewardConfig:
        return cls(
            path=_get(config, "reward.custom_reward_function.path"),
            name=str(_get(config, "reward.custom_reward_function.name", "compute_score")),
            # optional in verl too (its loader reads it with .get(..., {}))
            kwargs=select(config, "reward.custom_reward_function.reward_kwargs", {}),
            timeout_s=entry.reward_timeout_s,
        )


# trainer.logger names: the engine's own sinks, then verl's tracking backends it hands metrics to (verl 0.9.1's
# Tracking.supported_backend, less wandb and console, which the engine runs itself with its offline fallback)
VERL_LOGGERS = ("tensorboard", "mlflow", "swanlab", "clearml", "trackio", "vemlp_wandb")
LOGGERS = ("console", "wandb", "file", *VERL_LOGGERS)


def _optional_path(value) -> str | None:
    return os.path.expanduser(str(value)) if value else None


@dataclass(frozen=True)
class TrainerConfig:
    """``trainer.*``: how long, how often to validate and save, where, and what to log."""

    total_training_steps: int | None = _shared("trainer.total_training_steps")
    total_epochs: int = _shared("trainer.total_epochs")
    test_freq: int = _shared("trainer.test_freq")
    save_freq: int = _shared("trainer.save_freq")
    logger: tuple[str, ...] = engine_setting(
        "trainer.logger",
        "console, wandb (offline without credentials), file (metrics.jsonl, always written), and through verl's "
        "Tracking tensorboard (into <run dir>/tensorboard unless TENSORBOARD_DIR), mlflow, swanlab, clearml, trackio",
    )
    project_name: str = engine_setting("trainer.project_name", "the W&B project")
    experiment_name: str = engine_setting("trainer.experiment_name", "the W&B run name")
    run_dir: str = engine_setting("trainer.default_local_dir", "the run directory: metrics.jsonl, plots, checkpoints")
    resume_mode: str = engine_setting(
        "trainer.resume_mode", "auto (the newest intact checkpoint of this run), disable or resume_path"
    )
    resume_from_path: str | None = engine_setting(
        "trainer.resume_from_path", "the checkpoint resume_mode=resume_path takes"
    )
    val_before_train: bool = engine_setting(
        "trainer.val_before_train", "validate the start model (skipped when resuming)"
    )
    val_only: bool = engine_setting("trainer.val_only", "validate and stop")
    validation_data_dir: str | None = engine_setting(
        "trainer.validation_data_dir",
        "where each validation's responses are written, <step>.jsonl (input, output, gts, score, acc); null: not",
    )
    max_ckpt_to_keep: int | None = engine_setting("trainer.max_actor_ckpt_to_keep", "checkpoints kept (null: all)")

    @classmethod
    def from_config(cls, config: Mapping, run: RunSettings) -> TrainerConfig:
        resume_mode = _get(config, "trainer.resume_mode")
        if resume_mode not in ("auto", "disable", "resume_path"):
            raise ConfigError(f"trainer.resume_mode must be auto, disable or resume_path; got {resume_mode!r}")
        resume_from = _get(config, "trainer.resume_from_path")
        if resume_mode == "resume_path" and not resume_from:
            raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoint dir>")
        logger = _get(config, "trainer.logger", [])
        logger = (logger,) if isinstance(logger, str) else tuple(logger)
        unknown = [name for name in logger if name not in LOGGERS]
        if unknown:
            raise ConfigError(
                f"trainer.logger has {', '.join(map(repr, unknown))}; the embedded engine logs to "
                f"{', '.join(LOGGERS)} (file: metrics.jsonl, always written; {', '.join(VERL_LOGGERS)} through verl's "
                "Tracking)"
            )
        return cls(
            total_training_steps=run.total_training_steps,
            total_epochs=run.total_epochs,
            test_freq=run.test_freq,
            save_freq=run.save_freq,
            logger=logger,
            project_name=str(_get(config, "trainer.project_name")),
            experiment_name=str(_get(config, "trainer.experiment_name")),
            run_dir=os.path.expanduser(str(_get(config, "trainer.default_local_dir"))),
            resume_mode=resume_mode,
            resume_from_path=resume_from,
            val_before_train=bool(_get(config, "trainer.val_before_train")),
            val_only=bool(_get(config, "trainer.val_only")),
            validation_data_dir=_optional_path(_get(config, "trainer.validation_data_dir")),
            max_ckpt_to_keep=_get(config, "trainer.max_actor_ckpt_to_keep"),
        )


@dataclass(frozen=True)
class EmbeddedConfig:
    """``embedded.*``: the engine's own keys (``configs/embedded.yaml``)."""

    seed: int = engine_setting("embedded.seed", "seeds Python, NumPy and torch (and the prompt order unless data.seed)")
    device: str = engine_setting("embedded.device", "auto (CUDA when visible, else CPU), cpu, cuda or cuda:N")
    dtype: str = engine_setting(
        "embedded.dtype",
        "auto, float32, float64 or bfloat16 (bf16 compute over fp32 weights, a bf16 copy for sampling) or float16",
    )
    num_threads: int | None = engine_setting("embedded.num_threads", "torch's CPU threads (null: torch's default)")
    progress_bar: bool = engine_setting(
        "embedded.progress_bar", "a progress bar on the terminal (off: one line per step)"
    )
    fast_path: bool = engine_setting(
        "embedded.fast_path",
        "Llama / Qwen2 models: the fused decoder samples, and on a CPU the update's attention runs as fp32 products "
        "and its head in chunks (false: the model's own forward throughout; the same distribution and loss)",
    )

    @classmethod
    def from_config(cls, config: Mapping) -> EmbeddedConfig:
        num_threads = _get(config, "embedded.num_threads")
        return cls(
            seed=check_int("embedded.seed", _get(config, "embedded.seed"), minimum=0),
            device=str(_get(config, "embedded.device")),
            dtype=str(_get(config, "embedded.dtype")),
            num_threads=None if num_threads is None else _positive("embedded.num_threads", num_threads),
            progress_bar=bool(_get(config, "embedded.progress_bar")),
            fast_path=bool(_get(config, "embedded.fast_path")),
        )


@dataclass(frozen=True)
class EngineConfig:
    """Everything the embedded engine reads, one typed section per part of the config."""

    dapo: DapoSettings  # the loss, dynamic sampling, overlong filtering and shaping: shared with the verl engine
    data: DataConfig
    rollout: RolloutConfig
    actor: ActorConfig
    model: ModelConfig
    algorithm: AlgorithmConfig
    reward: RewardConfig
    trainer: TrainerConfig
    embedded: EmbeddedConfig
    tiny: TinySettings  # tiny.* and cache_dir: the tiny model and its task, shared with the verl CPU run
    watchdog: WatchdogSettings  # dapo.watchdog.*: shared with the verl engine (recipe.common.watchdog)


SECTIONS = (
    DataConfig,
    RolloutConfig,
    ActorConfig,
    ModelConfig,
    AlgorithmConfig,
    RewardConfig,
    TrainerConfig,
    EmbeddedConfig,
    TinySettings,
)  # in the order of the configuration reference


def read_config(cfg: DictConfig | Mapping) -> EngineConfig:
    """Build the engine's sections from the composed config; raise :class:`ConfigError` naming the key to fix."""
    config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False) if isinstance(cfg, DictConfig) else cfg
    algorithm = AlgorithmConfig.from_config(config)  # the refusals of what the engine lacks come first
    for section in SECTIONS:  # dapo.settings has defaults for a plain mapping; this engine takes none
        for f in fields(section):
            if f.metadata["shared"]:
                _get(config, f.metadata["key"])
    settings = DapoSettings.from_config(config)
    run = settings.run  # rollout.n, sampling, lengths, optimizer, schedule: checked alike by both engines
    embedded = EmbeddedConfig.from_config(config)
    actor = ActorConfig.from_config(config, run)
    return EngineConfig(
        dapo=settings,
        data=DataConfig.from_config(config, settings, embedded.seed),
        rollout=RolloutConfig.from_config(config, run, actor.ppo_micro_batch_size),
        actor=actor,
        model=ModelConfig.from_config(config),
        algorithm=algorithm,
        reward=RewardConfig.from_config(config, EntrySettings.from_config(config)),
        trainer=TrainerConfig.from_config(config, run),
        embedded=embedded,
        tiny=TinySettings.from_config(config),
        watchdog=WatchdogSettings.from_config(config),
    )


# verl keys the embedded engine does not act on (one process, its own decode loop, no parallelism), and why
IGNORED_VERL_KEYS = {
    "actor_rollout_ref.actor.use_dynamic_bsz": "micro-batches are ppo_micro_batch_size_per_gpu responses",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "no dynamic batching",
    "actor_rollout_ref.actor.shuffle": "mini-batches are taken in batch order",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "one process",
    "actor_rollout_ref.actor.fsdp_config.param_offload": "no FSDP",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "no FSDP",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "its own decode loop (recipe.embedded.decode), one device",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "no vLLM",
    "actor_rollout_ref.rollout.enforce_eager": "no vLLM",
    "data.dataloader_num_workers": "prompts are read in the training process",
    "trainer.n_gpus_per_node": "one device (embedded.device)",
    "trainer.nnodes": "one machine",
}


def ignored_verl_keys(cfg: DictConfig | Mapping) -> list[str]:
    """``key=value (default D: why)`` for each of :data:`IGNORED_VERL_KEYS` set to something else than verl
    0.9.1's default, so that the engine can say it does not act on it instead of ignoring it silently."""
    import verl

    config = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False) if isinstance(cfg, DictConfig) else cfg
    defaults = OmegaConf.to_container(
        OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    )
    out = []
    for key, why in IGNORED_VERL_KEYS.items():
        value, default = select(config, key), select(defaults, key)
        if value != default:
            out.append(f"{key}={value} (verl's default {default}; {why})")
    return out
