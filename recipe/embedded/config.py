"""What the embedded engine reads from the composed config (verl's keys), checked once, as plain values.

The engine reads the Hydra config in one place, here, and validates it with errors that name the key to set.
Everything else in the engine takes these plain values. What DAPO decides (the loss, dynamic sampling, overlong
filtering and shaping) is :class:`dapo.settings.DapoSettings`, built from the config exactly as the verl engine
builds it; the rest (model, data, rollout, optimizer, trainer) is read here. Meanings are verl's:
``data.train_batch_size`` and ``actor.ppo_mini_batch_size`` count prompts (a prompt brings ``rollout.n``
responses), while ``actor.ppo_micro_batch_size_per_gpu`` and ``rollout.log_prob_micro_batch_size_per_gpu`` count
responses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from dapo.settings import ConfigError, DapoSettings, check_float, check_int, divisor_near

__all__ = ["ConfigError", "EngineConfig", "ignored_verl_keys", "read_config"]


@dataclass(frozen=True)
class EngineConfig:
    dapo: DapoSettings  # the loss, dynamic sampling, overlong filtering and shaping: shared with the verl engine
    # data
    train_files: list[str] | None  # None: the embedded synthetic task
    val_files: list[str] | None
    train_max_samples: int
    val_max_samples: int
    prompt_key: str
    reward_fn_key: str
    max_prompt_length: int
    max_response_length: int
    val_batch_size: int | None  # prompts per validation sampling call (None: all)
    shuffle: bool
    data_seed: int
    filter_overlong_prompts: bool
    truncation: str
    apply_chat_template_kwargs: dict
    # rollout
    n: int
    temperature: float
    top_p: float
    top_k: int
    val_n: int
    val_temperature: float
    val_top_p: float
    val_top_k: int
    val_do_sample: bool
    max_num_seqs: int
    log_prob_micro_batch_size: int  # responses
    bypass_mode: bool  # old log-probs from the sampling pass, no recomputation (algorithm.rollout_correction)
    # actor
    ppo_mini_batch_size: int  # prompts
    ppo_micro_batch_size: int  # responses
    ppo_epochs: int
    grad_clip: float  # actor.optim.clip_grad
    lr: float
    lr_warmup_steps: int
    weight_decay: float
    betas: tuple[float, float]
    entropy_coeff: float
    # model
    model_path: str | None  # None: the embedded tiny Qwen2, warmed up
    tokenizer_path: str | None
    custom_chat_template: str | None
    trust_remote_code: bool
    gradient_checkpointing: bool
    # algorithm and reward
    norm_adv_by_std_in_grpo: bool
    reward_path: str | None
    reward_name: str
    reward_kwargs: dict
    reward_timeout_s: float | None  # dapo.reward_timeout_s: one reward call longer than this stops the run
    # trainer
    total_training_steps: int | None  # None: total_epochs over the train set
    total_epochs: int
    test_freq: int
    save_freq: int
    logger: tuple[str, ...]
    project_name: str
    experiment_name: str
    run_dir: str
    resume_mode: str
    resume_from_path: str | None
    val_before_train: bool
    val_only: bool
    max_ckpt_to_keep: int | None
    # embedded
    seed: int
    device: str
    dtype: str
    num_threads: int | None  # None: torch's default
    cache_dir: str
    task: dict
    tiny_model: dict
    warmup: dict
    progress_bar: bool

    @property
    def train_batch_size(self) -> int:  # prompts per step
        return self.dapo.sampling.train_batch_size

    @property
    def gen_batch_size(self) -> int:  # prompts per generation round
        return self.dapo.sampling.gen_batch_size


def _get(cfg: DictConfig, key: str, default: Any = None) -> Any:
    value = OmegaConf.select(cfg, key, default=default, throw_on_missing=False)
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _files(value) -> list[str] | None:
    if value is None or value == "" or value == []:
        return None
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _positive(name: str, value, hint: str = "") -> int:
    return check_int(name, value, minimum=1, hint=hint)


def read_config(cfg: DictConfig) -> EngineConfig:
    """Pull the engine's settings out of the composed config; raise :class:`ConfigError` naming the key to fix."""
    actor = "actor_rollout_ref.actor"
    rollout = "actor_rollout_ref.rollout"

    if _get(cfg, "algorithm.adv_estimator", "grpo") != "grpo":
        raise ConfigError(
            f"algorithm.adv_estimator={_get(cfg, 'algorithm.adv_estimator')!r}: the embedded engine implements "
            "DAPO's group-relative advantage only; set algorithm.adv_estimator=grpo"
        )
    if _get(cfg, f"{actor}.use_kl_loss", False) or _get(cfg, "algorithm.use_kl_in_reward", False):
        raise ConfigError(
            "the embedded engine has no reference model (DAPO drops the KL term); set "
            f"{actor}.use_kl_loss=false and algorithm.use_kl_in_reward=false"
        )

    settings = DapoSettings.from_config(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False))
    run = settings.run  # rollout.n, sampling, lengths, optimizer, schedule: checked alike by both engines
    n, mini = run.n, run.ppo_mini_batch_size
    micro = _get(cfg, f"{actor}.ppo_micro_batch_size_per_gpu") or mini * n
    micro = _positive(f"{actor}.ppo_micro_batch_size_per_gpu", micro)
    if (mini * n) % micro:
        raise ConfigError(
            f"a mini-batch of {mini} prompts x {n} responses = {mini * n} responses is not divisible by "
            f"{actor}.ppo_micro_batch_size_per_gpu={micro} (it counts responses); choose one that divides "
            f"{mini * n}, e.g. {divisor_near(mini * n, micro)}"
        )
    log_prob_micro = _get(cfg, f"{rollout}.log_prob_micro_batch_size_per_gpu") or micro

    for key in ("trainer.resume_mode",):
        if _get(cfg, key) not in ("auto", "disable", "resume_path"):
            raise ConfigError(f"{key} must be auto, disable or resume_path; got {_get(cfg, key)!r}")
    if _get(cfg, "trainer.resume_mode") == "resume_path" and not _get(cfg, "trainer.resume_from_path"):
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoint dir>")
    if _get(cfg, "data.truncation", "error") not in ("error", "left", "right", "middle"):
        raise ConfigError(
            f"data.truncation must be one of error, left, right, middle; got {_get(cfg, 'data.truncation')!r}"
        )

    logger = _get(cfg, "trainer.logger", ["console"]) or []
    logger = (logger,) if isinstance(logger, str) else tuple(logger)
    seed = check_int("embedded.seed", _get(cfg, "embedded.seed", 0), minimum=0)
    data_seed = _get(cfg, "data.seed")
    data_seed = seed if data_seed is None else check_int("data.seed", data_seed, minimum=0)
    val_do_sample = bool(_get(cfg, f"{rollout}.val_kwargs.do_sample", True))
    val_n = run.val_n
    if not val_do_sample and val_n != 1:
        raise ConfigError(
            f"greedy validation ({rollout}.val_kwargs.do_sample=false) gives the same response every time; "
            f"set {rollout}.val_kwargs.n=1 (got {val_n}) or do_sample=true"
        )
    device = str(_get(cfg, "embedded.device", "auto"))
    num_threads = _get(cfg, "embedded.num_threads")

    return EngineConfig(
        dapo=settings,
        train_files=_files(_get(cfg, "data.train_files")),
        val_files=_files(_get(cfg, "data.val_files")),
        train_max_samples=int(_get(cfg, "data.train_max_samples", -1) or -1),
        val_max_samples=int(_get(cfg, "data.val_max_samples", -1) or -1),
        prompt_key=_get(cfg, "data.prompt_key", "prompt"),
        reward_fn_key=_get(cfg, "data.reward_fn_key", "data_source"),
        max_prompt_length=run.max_prompt_length,
        max_response_length=run.max_response_length,
        val_batch_size=_get(cfg, "data.val_batch_size"),
        shuffle=bool(_get(cfg, "data.shuffle", True)),
        data_seed=data_seed,
        filter_overlong_prompts=bool(_get(cfg, "data.filter_overlong_prompts", False)),
        truncation=_get(cfg, "data.truncation", "error"),
        apply_chat_template_kwargs=_get(cfg, "data.apply_chat_template_kwargs", {}) or {},
        n=n,
        temperature=run.temperature,
        top_p=run.top_p,
        top_k=max(0, run.top_k),
        val_n=val_n,
        val_temperature=run.val_temperature,
        val_top_p=run.val_top_p,
        val_top_k=max(0, check_int(f"{rollout}.val_kwargs.top_k", _get(cfg, f"{rollout}.val_kwargs.top_k", -1),
                                   minimum=-1)),
        val_do_sample=val_do_sample,
        max_num_seqs=_positive(f"{rollout}.max_num_seqs", _get(cfg, f"{rollout}.max_num_seqs", 1024)),
        log_prob_micro_batch_size=_positive(f"{rollout}.log_prob_micro_batch_size_per_gpu", log_prob_micro),
        bypass_mode=bool(_get(cfg, "algorithm.rollout_correction.bypass_mode", False)),
        ppo_mini_batch_size=mini,
        ppo_micro_batch_size=micro,
        ppo_epochs=run.ppo_epochs,
        # verl's FSDP engine clips with optim.clip_grad (optim.grad_clip, deprecated, overrides it when set)
        grad_clip=_grad_clip(cfg, actor),
        lr=run.lr,
        lr_warmup_steps=max(0, check_int(f"{actor}.optim.lr_warmup_steps",
                                         _get(cfg, f"{actor}.optim.lr_warmup_steps", -1) or 0, minimum=-1)),
        weight_decay=run.weight_decay,
        betas=run.betas,
        entropy_coeff=check_float(f"{actor}.entropy_coeff", _get(cfg, f"{actor}.entropy_coeff", 0.0) or 0.0),
        model_path=_get(cfg, "actor_rollout_ref.model.path"),
        tokenizer_path=_get(cfg, "actor_rollout_ref.model.tokenizer_path"),
        custom_chat_template=_get(cfg, "actor_rollout_ref.model.custom_chat_template"),
        trust_remote_code=bool(_get(cfg, "actor_rollout_ref.model.trust_remote_code", False)),
        gradient_checkpointing=bool(_get(cfg, "actor_rollout_ref.model.enable_gradient_checkpointing", False)),
        norm_adv_by_std_in_grpo=bool(_get(cfg, "algorithm.norm_adv_by_std_in_grpo", True)),
        reward_path=_get(cfg, "reward.custom_reward_function.path"),
        reward_name=_get(cfg, "reward.custom_reward_function.name", "compute_score") or "compute_score",
        reward_kwargs=_get(cfg, "reward.custom_reward_function.reward_kwargs", {}) or {},
        reward_timeout_s=_reward_timeout(cfg),
        total_training_steps=run.total_training_steps,
        total_epochs=run.total_epochs,
        test_freq=run.test_freq,
        save_freq=run.save_freq,
        logger=logger,
        project_name=str(_get(cfg, "trainer.project_name", "dapo")),
        experiment_name=str(_get(cfg, "trainer.experiment_name", "embedded")),
        run_dir=os.path.expanduser(str(_get(cfg, "trainer.default_local_dir"))),
        resume_mode=_get(cfg, "trainer.resume_mode"),
        resume_from_path=_get(cfg, "trainer.resume_from_path"),
        val_before_train=bool(_get(cfg, "trainer.val_before_train", True)),
        val_only=bool(_get(cfg, "trainer.val_only", False)),
        max_ckpt_to_keep=_get(cfg, "trainer.max_actor_ckpt_to_keep"),
        seed=seed,
        device=device,
        dtype=str(_get(cfg, "embedded.dtype", "auto")),
        num_threads=None if num_threads is None else _positive("embedded.num_threads", num_threads),
        cache_dir=os.path.expanduser(str(_get(cfg, "embedded.cache_dir", "~/.cache/dapo-verl"))),
        task=_get(cfg, "embedded.task", {}) or {},
        tiny_model=_get(cfg, "embedded.model", {}) or {},
        warmup=_get(cfg, "embedded.warmup", {}) or {},
        progress_bar=bool(_get(cfg, "embedded.progress_bar", True)),
    )


# verl keys the embedded engine does not act on (one process, its own decode loop, no parallelism), and why
IGNORED_VERL_KEYS = {
    "actor_rollout_ref.actor.use_dynamic_bsz": "micro-batches are ppo_micro_batch_size_per_gpu responses",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "no dynamic batching",
    "actor_rollout_ref.actor.shuffle": "mini-batches are taken in batch order",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": "one process",
    "actor_rollout_ref.actor.fsdp_config.param_offload": "no FSDP",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "no FSDP",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "its own decode loop, one device",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "no vLLM",
    "actor_rollout_ref.rollout.enforce_eager": "no vLLM",
    "data.dataloader_num_workers": "prompts are read in the training process",
    "trainer.n_gpus_per_node": "one device (embedded.device)",
    "trainer.nnodes": "one machine",
}


def ignored_verl_keys(cfg: DictConfig) -> list[str]:
    """``key=value (default D: why)`` for each of :data:`IGNORED_VERL_KEYS` set to something else than verl
    0.9.1's default, so that the engine can say it does not act on it instead of ignoring it silently."""
    import verl

    defaults = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    out = []
    for key, why in IGNORED_VERL_KEYS.items():
        value, default = _get(cfg, key), OmegaConf.select(defaults, key, default=None)
        if value != default:
            out.append(f"{key}={value} (verl's default {default}; {why})")
    return out


def _reward_timeout(cfg: DictConfig) -> float | None:
    value = _get(cfg, "dapo.reward_timeout_s")
    if value is None:
        return None
    value = check_float("dapo.reward_timeout_s", value, hint=" (seconds; null: no limit)")
    if value <= 0:
        raise ConfigError(f"dapo.reward_timeout_s must be > 0 seconds (null: no limit), got {value!r}")
    return value


def _grad_clip(cfg: DictConfig, actor: str) -> float:
    key = f"{actor}.optim.grad_clip" if _get(cfg, f"{actor}.optim.grad_clip") else f"{actor}.optim.clip_grad"
    value = check_float(key, _get(cfg, key, 1.0))
    if value <= 0:
        raise ConfigError(f"{key} must be > 0 (the largest gradient norm an update keeps), got {value!r}; the paper "
                          "uses 1.0")
    return value
