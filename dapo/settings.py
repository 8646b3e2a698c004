"""The DAPO contract: what both engines decide from the config, built and checked once, in one typed object.

Each engine composes its Hydra config, turns it into a plain nested mapping (``OmegaConf.to_container``) and calls
:meth:`DapoSettings.from_config` (or the ``from_config`` of one concern) on it; neither reads these keys any other
way. One frozen dataclass per concern, each owning its defaults and its validation:

* :class:`LossSettings`      ``actor_rollout_ref.actor.{policy_loss.loss_mode, clip_ratio*, loss_agg_mode, ...}``
* :class:`FilterSettings`    ``algorithm.filter_groups.{enable, metric, max_num_gen_batches}`` (dynamic sampling)
* :class:`SamplingSettings`  ``data.{train_batch_size, gen_batch_size}`` and ``dapo.sampling.*`` (the batch filler)
* :class:`OverlongSettings`  ``dapo.overlong_filter`` and ``reward.reward_kwargs.{max_resp_len, overlong_buffer_cfg}``
* :class:`EntropyWatchSettings` ``dapo.entropy_watch.*``: when both engines warn of entropy collapse
* :class:`RunSettings`       the verl keys every run sets (``rollout.n``, sampling, lengths, optimizer, batch
  division, schedule), checked first and alike by both entry points, so a bad value is refused before a warm-up or
  Ray starts, naming the key the user set

plus :func:`eos_token_ids`, the one rule for what ends a response (and so what "truncated" means for overlong
filtering). A bad value raises :class:`ConfigError` naming the verl key and the fix, before any expensive work.

Keys are verl's (``configs/dapo_trainer.yaml``); a key missing from the mapping takes the default declared here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from dapo.loss import CLIP_RATIO_C, LOSS_AGG_MODES, LOSS_MODES


class ConfigError(ValueError):
    """A bad setting; the message names the key and what to set. Entry points print it without a traceback."""


ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"

# Dynamic sampling's filter metric: the per-response value whose constancy over a group drops the group.
# Both engines accept exactly these (DAPO filters on accuracy, paper Eq. 11).
FILTER_METRICS: dict[str, str] = {
    "acc": "accuracy of the response (the scorer's 'acc'): the paper's rule",
    "score": "the scorer's correctness score (+1 / -1 for the DAPO scorer), before any length shaping",
}
# Refused in both engines: the length-shaped reward makes an all-wrong group look mixed when its responses only
# differ in length, so groups without a learning signal get through (verl's built-in filter defaults to "reward").
SHAPED_REWARD_METRICS = ("reward", "seq_reward", "seq_final_reward")


def select(config: Mapping, key: str, default: Any = None, *, required: bool = False) -> Any:
    """``config["a"]["b"]["c"]`` for ``key="a.b.c"``; ``default`` when a level is missing or the value is None.

    The one key getter of the project. ``required=True``: a missing level raises :class:`ConfigError` instead (the
    composed config declares every key the engines read, so a missing one is a config not composed from
    ``configs/``); a key present with value null still gives ``default``."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            if required:
                raise ConfigError(
                    f"{key} is missing from the config; compose it from configs/ (dapo-train "
                    "--config-name NAME) or add the key"
                )
            return default
        node = node[part]
    return default if node is None else node


def check_int(key: str, value: Any, *, minimum: int | None, hint: str = "") -> int:
    """``value`` as an int >= ``minimum`` (``None``: any int), else :class:`ConfigError` naming ``key``."""
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok and isinstance(value, float) and value.is_integer():
        value, ok = int(value), True
    if not ok and isinstance(value, str):
        try:
            value, ok = int(value), True
        except ValueError:
            ok = False
    if not ok or (minimum is not None and value < minimum):
        what = "a positive integer" if minimum == 1 else "an integer" if minimum is None else f"an integer >= {minimum}"
        raise ConfigError(f"{key} must be {what}, got {value!r}{hint}")
    return int(value)


def divisor_near(total: int, wanted: int) -> int:
    """The divisor of ``total`` closest to ``wanted`` (the smaller on a tie), for error messages."""
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    return min(divisors, key=lambda d: (abs(d - wanted), d))


def check_float(key: str, value: Any, *, hint: str = "") -> float:
    """``value`` as a finite float, else :class:`ConfigError` naming ``key``."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = math.nan
    if isinstance(value, bool) or not math.isfinite(out):
        raise ConfigError(f"{key} must be a finite number, got {value!r}{hint}")
    return out


def check_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------------- the loss


@dataclass(frozen=True)
class LossSettings:
    """The policy loss: which one (``dapo.loss.LOSS_MODES``), its clip range and its aggregation."""

    loss_mode: str = field(default="dapo", metadata={"help": f"{ACTOR}.policy_loss.loss_mode: dapo, vanilla, gspo"})
    clip_ratio_low: float = field(default=0.2, metadata={"help": "eps_low: the ratio is clipped below at 1 - it"})
    clip_ratio_high: float = field(default=0.28, metadata={"help": "eps_high (Clip-Higher): clipped above at 1 + it"})
    clip_ratio_c: float = field(default=CLIP_RATIO_C, metadata={"help": "dual-clip bound for A < 0 (> 1)"})
    loss_agg_mode: str = field(default="token-mean", metadata={"help": "verl's agg_loss mode (DAPO: token-mean)"})
    loss_scale_factor: float | None = field(default=None, metadata={"help": "seq-mean-token-sum-norm's divisor"})

    def __post_init__(self) -> None:
        if self.loss_mode not in LOSS_MODES:
            raise ConfigError(
                f"{ACTOR}.policy_loss.loss_mode={self.loss_mode!r} is unknown; use one of {', '.join(LOSS_MODES)} "
                "(DAPO: dapo)"
            )
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ConfigError(
                f"{ACTOR}.loss_agg_mode={self.loss_agg_mode!r} is unknown; use one of {', '.join(LOSS_AGG_MODES)} "
                "(DAPO: token-mean)"
            )
        if not 0.0 <= self.clip_ratio_low < 1.0:
            raise ConfigError(
                f"{ACTOR}.clip_ratio_low must be in [0, 1) (the ratio is clipped below at 1 - clip_ratio_low), got "
                f"{self.clip_ratio_low}; DAPO uses 0.2"
            )
        if self.clip_ratio_high < 0.0:
            raise ConfigError(
                f"{ACTOR}.clip_ratio_high must be >= 0 (the ratio is clipped above at 1 + clip_ratio_high), got "
                f"{self.clip_ratio_high}; DAPO uses 0.28"
            )
        if self.clip_ratio_c <= 1.0:
            raise ConfigError(
                f"{ACTOR}.clip_ratio_c must be > 1 (dual clip lower bound), got {self.clip_ratio_c}; "
                f"set it to {CLIP_RATIO_C} (verl's default) or 10.0 (the paper's 32B run)"
            )
        if self.loss_scale_factor is not None and not self.loss_scale_factor > 0:
            raise ConfigError(f"{ACTOR}.loss_scale_factor must be > 0 or null, got {self.loss_scale_factor}")

    @classmethod
    def from_actor(cls, actor: Mapping) -> LossSettings:
        """From the actor section (``actor_rollout_ref.actor``, or the fields of verl's ``ActorConfig``).

        As verl does: ``clip_ratio_low`` / ``clip_ratio_high`` left null fall back to ``clip_ratio``."""
        d = cls.__dataclass_fields__
        clip = select(actor, "clip_ratio")
        low = select(actor, "clip_ratio_low", clip)
        high = select(actor, "clip_ratio_high", clip)
        factor = select(actor, "loss_scale_factor")
        return cls(
            loss_mode=str(select(actor, "policy_loss.loss_mode", d["loss_mode"].default)),
            clip_ratio_low=check_float(f"{ACTOR}.clip_ratio_low", d["clip_ratio_low"].default if low is None else low),
            clip_ratio_high=check_float(
                f"{ACTOR}.clip_ratio_high", d["clip_ratio_high"].default if high is None else high
            ),
            clip_ratio_c=check_float(f"{ACTOR}.clip_ratio_c", select(actor, "clip_ratio_c", d["clip_ratio_c"].default)),
            loss_agg_mode=str(select(actor, "loss_agg_mode", d["loss_agg_mode"].default)),
            loss_scale_factor=None if factor is None else check_float(f"{ACTOR}.loss_scale_factor", factor),
        )

    @classmethod
    def from_config(cls, config: Mapping) -> LossSettings:
        return cls.from_actor(select(config, ACTOR, {}))

    def loss_kwargs(self) -> dict[str, Any]:
        """The keyword arguments every ``dapo.loss.LOSS_MODES`` function takes from the settings."""
        return {
            "clip_ratio_low": self.clip_ratio_low,
            "clip_ratio_high": self.clip_ratio_high,
            "clip_ratio_c": self.clip_ratio_c,
            "loss_agg_mode": self.loss_agg_mode,
            "loss_scale_factor": self.loss_scale_factor,
        }


# ---------------------------------------------------------------------------------------------------- dynamic sampling


@dataclass(frozen=True)
class FilterSettings:
    """Dynamic sampling's group filter, verl's ``algorithm.filter_groups``."""

    enable: bool = field(default=False, metadata={"help": "drop groups whose metric is constant, regenerate"})
    metric: str = field(default="acc", metadata={"help": f"one of {', '.join(FILTER_METRICS)}"})
    max_num_gen_batches: int = field(default=0, metadata={"help": "generation rounds per step (0 = unbounded)"})

    def __post_init__(self) -> None:
        key = "algorithm.filter_groups"
        if self.max_num_gen_batches < 0:
            raise ConfigError(
                f"{key}.max_num_gen_batches must be >= 0 (0 = unbounded), got {self.max_num_gen_batches}; DAPO uses 10"
            )
        if not self.enable:
            return
        if self.metric in SHAPED_REWARD_METRICS:
            raise ConfigError(
                f"{key}.metric={self.metric!r} filters on the length-shaped reward, which keeps all-wrong groups whose "
                f"responses differ only in length; DAPO filters on accuracy: set {key}.metric=acc"
            )
        if self.metric not in FILTER_METRICS:
            raise ConfigError(
                f"{key}.metric={self.metric!r} is unknown; use one of {', '.join(FILTER_METRICS)} (DAPO: acc)"
            )

    @classmethod
    def from_config(cls, config: Mapping) -> FilterSettings:
        key = "algorithm.filter_groups"
        d = cls.__dataclass_fields__
        return cls(
            enable=check_bool(f"{key}.enable", select(config, f"{key}.enable", d["enable"].default)),
            metric=str(select(config, f"{key}.metric", d["metric"].default)),
            max_num_gen_batches=check_int(
                f"{key}.max_num_gen_batches",
                select(config, f"{key}.max_num_gen_batches", 0),
                minimum=0,
                hint=" (0 = unbounded; DAPO uses 10)",
            ),
        )


def setting(key: str, help: str, default: Any = MISSING) -> Any:  # noqa: A002 (dataclasses' own word)
    """A field read from the config key ``key`` (verl's, or a ``dapo.*`` knob): its one declaration (key, meaning,
    default), which the embedded engine's sections (:func:`shared_declaration`) and the configuration reference
    (``docs/_ext/references.py``) reuse instead of writing it again."""
    return field(default=default, metadata={"key": key, "help": help})


def engine_setting(key: str, help: str) -> Any:  # noqa: A002 (dataclasses' own word)
    """A field of a section that one engine alone reads (the embedded engine's, the tiny model's ``tiny.*``): its
    config key and meaning, with no default (the composed config gives every value)."""
    return field(metadata={"key": key, "help": help, "shared": False})


def shared_declaration(key: str) -> tuple[str, str]:
    """``(key, help)`` of the :func:`setting` that reads ``key`` in :class:`RunSettings`, :class:`SamplingSettings`
    or :class:`EntrySettings` (the settings both engines read); ``KeyError`` for a key none of them declares."""
    for cls in (RunSettings, SamplingSettings, EntrySettings):
        for f in fields(cls):
            if f.metadata.get("key") == key:
                return key, f.metadata["help"]
    raise KeyError(f"{key} is not declared in dapo.settings")


@dataclass(frozen=True)
class SamplingSettings:
    """Batch sizes and the batch filler's options (``dapo.sampling.*``, see :class:`dapo.sampling.BatchFiller`)."""

    train_batch_size: int = setting("data.train_batch_size", "prompt groups per train step (dynamic sampling's kept)")
    gen_batch_size: int = setting("data.gen_batch_size", "prompts per generation round (null: the train batch)")
    adaptive: bool = setting(
        "dapo.sampling.adaptive",
        "size each generation round from the running kept-group fraction instead of a fixed data.gen_batch_size",
        False,
    )
    min_gen_batch_size: int | None = setting(
        "dapo.sampling.min_gen_batch_size", "smallest adaptive round (null: ceil(train_batch_size / 4))", None
    )
    safety_margin: float = setting("dapo.sampling.safety_margin", "extra prompts per adaptive round, a fraction", 0.25)
    carry_over: bool = setting(
        "dapo.sampling.carry_over",
        "keep surplus groups with signal for the next step instead of discarding them",
        False,
    )
    max_carry_age: int = setting(
        "dapo.sampling.max_carry_age",
        "policy versions a carried group may lag; its rollout log-probs are its behaviour policy",
        1,
    )
    skip_saturated: bool = setting(
        "dapo.sampling.skip_saturated",
        "skip prompts whose recent groups were all correct / all wrong, re-probe them later (embedded engine only: "
        "verl's trainer draws its prompts itself, and the verl engine refuses it with an error)",
        False,
    )
    saturation_window: int = setting(
        "dapo.sampling.saturation_window", "constant groups in a row that make a prompt saturated", 2
    )
    reprobe_after: int = setting(
        "dapo.sampling.reprobe_after", "skipped offers before a saturated prompt is generated again", 4
    )
    kept_frac_decay: float = setting(
        "dapo.sampling.kept_frac_decay", "discount per round of the adaptive kept-fraction estimate", 0.5
    )

    def __post_init__(self) -> None:
        s = "dapo.sampling"
        if self.min_gen_batch_size is not None and not 1 <= self.min_gen_batch_size <= self.gen_batch_size:
            raise ConfigError(
                f"{s}.min_gen_batch_size must be in [1, data.gen_batch_size={self.gen_batch_size}], got "
                f"{self.min_gen_batch_size}; leave it null for ceil(data.train_batch_size / 4)"
            )
        if not (self.safety_margin >= 0 and math.isfinite(self.safety_margin)):
            raise ConfigError(
                f"{s}.safety_margin must be a finite number >= 0 (0.25 = 25% extra), got {self.safety_margin}"
            )
        if self.max_carry_age < 0:
            raise ConfigError(f"{s}.max_carry_age must be >= 0 policy versions, got {self.max_carry_age}")
        if self.saturation_window < 1:
            raise ConfigError(f"{s}.saturation_window must be >= 1 sampled groups, got {self.saturation_window}")
        if self.reprobe_after < 1:
            raise ConfigError(
                f"{s}.reprobe_after must be >= 1 skipped offers, got {self.reprobe_after}; "
                f"to never skip, set {s}.skip_saturated=false"
            )
        if not 0.0 <= self.kept_frac_decay < 1.0:
            raise ConfigError(f"{s}.kept_frac_decay must be in [0, 1), got {self.kept_frac_decay}")

    @classmethod
    def from_config(cls, config: Mapping) -> SamplingSettings:
        train = check_int("data.train_batch_size", select(config, "data.train_batch_size"), minimum=1)
        gen = select(config, "data.gen_batch_size")
        gen = (
            train
            if gen is None
            else check_int(
                "data.gen_batch_size",
                gen,
                minimum=1,
                hint=" (null: data.train_batch_size; DAPO: 3 x data.train_batch_size)",
            )
        )
        opts = dict(select(config, "dapo.sampling", {}))
        known = [f.name for f in fields(cls)][2:]
        unknown = sorted(set(opts) - set(known))
        if unknown:
            raise ConfigError(f"unknown key(s) {unknown} under dapo.sampling; known: {', '.join(known)}")
        d = cls.__dataclass_fields__
        value = {name: d[name].default if opts.get(name) is None else opts[name] for name in known}
        s = "dapo.sampling"
        return cls(
            train_batch_size=train,
            gen_batch_size=gen,
            adaptive=check_bool(f"{s}.adaptive", value["adaptive"]),
            min_gen_batch_size=None
            if value["min_gen_batch_size"] is None
            else check_int(f"{s}.min_gen_batch_size", value["min_gen_batch_size"], minimum=1),
            safety_margin=check_float(f"{s}.safety_margin", value["safety_margin"]),
            carry_over=check_bool(f"{s}.carry_over", value["carry_over"]),
            max_carry_age=check_int(f"{s}.max_carry_age", value["max_carry_age"], minimum=0),
            skip_saturated=check_bool(f"{s}.skip_saturated", value["skip_saturated"]),
            saturation_window=check_int(f"{s}.saturation_window", value["saturation_window"], minimum=1),
            reprobe_after=check_int(f"{s}.reprobe_after", value["reprobe_after"], minimum=1),
            kept_frac_decay=check_float(f"{s}.kept_frac_decay", value["kept_frac_decay"]),
        )

    def filler_options(self) -> dict[str, Any]:
        """The :class:`dapo.sampling.BatchFiller` keyword arguments beyond the batch sizes."""
        return {f.name: getattr(self, f.name) for f in fields(self)[2:]}


# ---------------------------------------------------------------------------------------------------- overlong


@dataclass(frozen=True)
class OverlongSettings:
    """Overlong filtering (``dapo.overlong_filter``) and the soft overlong punishment (paper Eq. 13)."""

    filter: bool = setting(
        "dapo.overlong_filter",
        "overlong filtering: responses without EOS within data.max_response_length carry no loss and no token count",
        False,
    )
    buffer_enable: bool = field(default=False, metadata={"help": "overlong_buffer_cfg.enable: Eq. 13's penalty"})
    max_resp_len: int | None = field(default=None, metadata={"help": "L_max (null: data.max_response_length)"})
    buffer_len: int | None = field(default=None, metadata={"help": "overlong_buffer_cfg.len: L_cache"})
    penalty_factor: float = field(default=1.0, metadata={"help": "overlong_buffer_cfg.penalty_factor"})
    log: bool = field(default=False, metadata={"help": "overlong_buffer_cfg.log: overlong_reward in extra info"})

    def __post_init__(self) -> None:
        if not self.buffer_enable:
            return
        key = "reward.reward_kwargs.overlong_buffer_cfg"
        if self.buffer_len is None:
            raise ConfigError(
                f"{key}.enable=true needs {key}.len (the paper: 4096 of 20480 tokens); set it, or disable the soft "
                "overlong punishment with enable=false"
            )
        from dapo.shaping import validate_overlong_params

        try:
            validate_overlong_params(self.max_resp_len, self.buffer_len, self.penalty_factor)
        except ValueError as err:
            raise ConfigError(str(err)) from None

    @classmethod
    def from_config(cls, config: Mapping) -> OverlongSettings:
        key = "reward.reward_kwargs"
        max_resp_len = select(config, f"{key}.max_resp_len", select(config, "data.max_response_length"))
        buffer_len = select(config, f"{key}.overlong_buffer_cfg.len")
        return cls(
            filter=check_bool("dapo.overlong_filter", select(config, "dapo.overlong_filter", False)),
            buffer_enable=check_bool(
                f"{key}.overlong_buffer_cfg.enable", select(config, f"{key}.overlong_buffer_cfg.enable", False)
            ),
            max_resp_len=None if max_resp_len is None else check_int(f"{key}.max_resp_len", max_resp_len, minimum=1),
            buffer_len=None
            if buffer_len is None
            else check_int(f"{key}.overlong_buffer_cfg.len", buffer_len, minimum=0),
            penalty_factor=check_float(
                f"{key}.overlong_buffer_cfg.penalty_factor",
                select(config, f"{key}.overlong_buffer_cfg.penalty_factor", 1.0),
            ),
            log=check_bool(f"{key}.overlong_buffer_cfg.log", select(config, f"{key}.overlong_buffer_cfg.log", False)),
        )


def eos_token_ids(
    tokenizer_eos: int | Sequence[int] | None, generation_eos: int | Sequence[int] | None
) -> tuple[int, ...]:
    """The tokens that end a response: the tokenizer's ``eos_token_id`` plus the generation config's (sorted).

    An instruct model often stops on two tokens (e.g. ``<|im_end|>`` in its generation config, ``<|endoftext|>`` as
    the tokenizer's EOS); a response ending on either is complete, not truncated. Both engines call this.
    """
    ids: set[int] = set()
    for value in (tokenizer_eos, generation_eos):
        if value is None:
            continue
        ids.update(int(v) for v in ([value] if isinstance(value, int) else value) if v is not None)
    if not ids:
        raise ConfigError(
            "neither the tokenizer nor the model's generation config defines an end-of-sequence token, so no response "
            "could ever end; use a tokenizer with eos_token set (actor_rollout_ref.model.tokenizer_path)"
        )
    return tuple(sorted(ids))


# ---------------------------------------------------------------------------------------------------- the run


def _check_range(
    key: str, value: Any, *, low: float, high: float, low_open: bool, high_open: bool, hint: str = ""
) -> float:
    """``value`` as a float in the interval, else :class:`ConfigError` naming ``key`` and the interval."""
    out = check_float(key, value, hint=hint)
    if (out <= low if low_open else out < low) or (out >= high if high_open else out > high):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ConfigError(f"{key} must be in {interval}, got {value!r}{hint}")
    return out


@dataclass(frozen=True)
class RunSettings:
    """The verl keys every DAPO run sets, with the ranges both engines accept (verl checks some of them only inside
    its Ray workers, after minutes of start-up)."""

    n: int = setting(f"{ROLLOUT}.n", "responses per prompt (a group; >= 2: advantages compare them)", 16)
    temperature: float = setting(f"{ROLLOUT}.temperature", "training sampling temperature, > 0", 1.0)
    top_p: float = setting(f"{ROLLOUT}.top_p", "training nucleus sampling, in (0, 1]", 1.0)
    top_k: int = setting(f"{ROLLOUT}.top_k", "training top-k: -1 or 0 off, else >= 1", -1)
    val_n: int = setting(f"{ROLLOUT}.val_kwargs.n", "responses per validation prompt (mean@val_n), >= 1", 1)
    val_temperature: float = setting(
        f"{ROLLOUT}.val_kwargs.temperature", "validation temperature, > 0 when val_kwargs.do_sample", 1.0
    )
    val_top_p: float = setting(f"{ROLLOUT}.val_kwargs.top_p", "validation nucleus sampling, in (0, 1]", 1.0)
    max_prompt_length: int = setting("data.max_prompt_length", "prompt tokens after the chat template, >= 1", 512)
    max_response_length: int = setting("data.max_response_length", "L_max: the response budget in tokens", 512)
    lr: float = setting(f"{ACTOR}.optim.lr", "AdamW learning rate, > 0", 1e-6)
    betas: tuple[float, float] = setting(f"{ACTOR}.optim.betas", "AdamW betas, each in [0, 1)", (0.9, 0.999))
    weight_decay: float = setting(f"{ACTOR}.optim.weight_decay", "AdamW weight decay, >= 0", 0.01)
    ppo_mini_batch_size: int = setting(
        f"{ACTOR}.ppo_mini_batch_size", "prompts per optimizer step; divides data.train_batch_size (unset: all)", 1
    )
    ppo_epochs: int = setting(f"{ACTOR}.ppo_epochs", "passes over the train batch, >= 1", 1)
    total_training_steps: int | None = setting(
        "trainer.total_training_steps", "steps, >= 1 (null: trainer.total_epochs over the data)", None
    )
    total_epochs: int = setting(
        "trainer.total_epochs", "epochs over the train set when total_training_steps is null, >= 1", 1
    )
    test_freq: int = setting("trainer.test_freq", "steps between validations (<= 0: never)", -1)
    save_freq: int = setting("trainer.save_freq", "steps between checkpoints (<= 0: never)", -1)

    @classmethod
    def from_config(cls, config: Mapping) -> RunSettings:
        declared = {f.name: f for f in fields(cls)}

        def get(name: str) -> Any:  # the field's verl key, its default when the key is missing or null
            return select(config, declared[name].metadata["key"], declared[name].default)

        n = check_int(f"{ROLLOUT}.n", get("n"), minimum=1)
        if n < 2:
            raise ConfigError(
                f"{ROLLOUT}.n={n}: DAPO's advantages compare the responses of a prompt with each other, and dynamic "
                "sampling keeps groups whose accuracy differs, so a group needs at least 2; the paper uses 16"
            )
        temperature = check_float(f"{ROLLOUT}.temperature", get("temperature"))
        if temperature <= 0:
            raise ConfigError(
                f"{ROLLOUT}.temperature must be > 0, got {temperature!r}: training samples its "
                "responses (the paper: 1.0); greedy decoding is for validation only"
            )
        val = f"{ROLLOUT}.val_kwargs"
        do_sample = select(config, f"{val}.do_sample", True)
        val_temperature = check_float(f"{val}.temperature", get("val_temperature"))
        if do_sample and val_temperature <= 0:
            raise ConfigError(
                f"{val}.temperature must be > 0 when {val}.do_sample=true, got {val_temperature!r}; "
                f"for greedy validation set {val}.do_sample=false (the paper: temperature 1.0)"
            )
        betas = get("betas")
        if not isinstance(betas, Sequence) or isinstance(betas, str) or len(betas) != 2:
            raise ConfigError(f"{ACTOR}.optim.betas must be a pair [beta1, beta2], got {betas!r}")
        betas = tuple(
            _check_range(f"{ACTOR}.optim.betas", b, low=0, high=1, low_open=False, high_open=True) for b in betas
        )
        lr = check_float(f"{ACTOR}.optim.lr", get("lr"))
        if lr <= 0:
            raise ConfigError(f"{ACTOR}.optim.lr must be > 0, got {lr!r}; the paper uses 1e-6")
        weight_decay = check_float(f"{ACTOR}.optim.weight_decay", get("weight_decay"))
        if weight_decay < 0:
            raise ConfigError(f"{ACTOR}.optim.weight_decay must be >= 0, got {weight_decay!r} (the paper: 0.1)")
        train = check_int("data.train_batch_size", select(config, "data.train_batch_size", 1), minimum=1)
        mini = check_int(
            f"{ACTOR}.ppo_mini_batch_size", select(config, f"{ACTOR}.ppo_mini_batch_size", train), minimum=1
        )  # unset: one mini-batch, the whole train batch
        if train % mini:
            raise ConfigError(
                f"data.train_batch_size={train} is not divisible by {ACTOR}.ppo_mini_batch_size={mini} "
                "(both count prompts); choose a mini-batch size that divides it, e.g. "
                f"{divisor_near(train, mini)}"
            )
        steps = select(config, "trainer.total_training_steps")
        return cls(
            n=n,
            temperature=temperature,
            top_p=_check_range(f"{ROLLOUT}.top_p", get("top_p"), low=0, high=1, low_open=True, high_open=False),
            top_k=check_int(f"{ROLLOUT}.top_k", get("top_k"), minimum=-1, hint=" (-1 or 0: no top-k)"),
            val_n=check_int(f"{val}.n", get("val_n"), minimum=1),
            val_temperature=val_temperature,
            val_top_p=_check_range(f"{val}.top_p", get("val_top_p"), low=0, high=1, low_open=True, high_open=False),
            max_prompt_length=check_int("data.max_prompt_length", get("max_prompt_length"), minimum=1),
            max_response_length=check_int("data.max_response_length", get("max_response_length"), minimum=1),
            lr=lr,
            betas=betas,
            weight_decay=weight_decay,
            ppo_mini_batch_size=mini,
            ppo_epochs=check_int(f"{ACTOR}.ppo_epochs", get("ppo_epochs"), minimum=1),
            total_training_steps=None
            if steps is None
            else check_int(
                "trainer.total_training_steps", steps, minimum=1, hint=" (null: trainer.total_epochs over the data)"
            ),
            total_epochs=check_int("trainer.total_epochs", get("total_epochs"), minimum=1),
            test_freq=check_int(
                "trainer.test_freq",
                get("test_freq"),
                minimum=None,
                hint=" (an integer; <= 0: never)",
            ),
            save_freq=check_int(
                "trainer.save_freq",
                get("save_freq"),
                minimum=None,
                hint=" (an integer; <= 0: never)",
            ),
        )


# ---------------------------------------------------------------------------------------------------- entropy watch


@dataclass(frozen=True)
class EntropyWatchSettings:
    """``dapo.entropy_watch.*``: when both engines warn of entropy collapse (:class:`dapo.metrics.EntropyWatch`)."""

    fraction: float = setting(
        "dapo.entropy_watch.fraction",
        "warn of entropy collapse when actor/entropy falls below this fraction of its value window steps earlier "
        "(once, again only after it recovers; the warning names the knobs that counter it)",
        0.3,
    )
    window: int = setting(
        "dapo.entropy_watch.window", "steps back to the entropy it is compared with (the first step's before that)", 20
    )

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction < 1.0:
            raise ConfigError(f"dapo.entropy_watch.fraction must be in (0, 1), got {self.fraction!r}")

    @classmethod
    def from_config(cls, config: Mapping) -> EntropyWatchSettings:
        key, d = "dapo.entropy_watch", {f.name: f.default for f in fields(cls)}
        return cls(
            fraction=check_float(f"{key}.fraction", select(config, f"{key}.fraction", d["fraction"])),
            window=check_int(f"{key}.window", select(config, f"{key}.window", d["window"]), minimum=1),
        )


# ---------------------------------------------------------------------------------------------------- the entry


@dataclass(frozen=True)
class EntrySettings:
    """``dapo.engine`` and ``dapo.reward_timeout_s``: the engine ``dapo-train`` runs, the bound on a reward call."""

    engine: str = setting(
        "dapo.engine",
        "which engine dapo-train runs: verl (configs/dapo_trainer.yaml's default) or embedded (configs/embedded.yaml)",
        "verl",
    )
    reward_timeout_s: float | None = setting(
        "dapo.reward_timeout_s",
        "one reward-function call that takes longer stops the run, naming the function and the row (null: no limit)",
        60.0,
    )

    @classmethod
    def from_config(cls, config: Mapping) -> EntrySettings:
        section = select(config, "dapo", {})
        timeout = section.get("reward_timeout_s", cls.reward_timeout_s)  # null: no limit
        if timeout is not None:
            timeout = check_float("dapo.reward_timeout_s", timeout, hint=" (seconds; null: no limit)")
            if timeout <= 0:
                raise ConfigError(f"dapo.reward_timeout_s must be > 0 seconds (null: no limit), got {timeout!r}")
        return cls(engine=str(section.get("engine") or cls.engine), reward_timeout_s=timeout)


# ---------------------------------------------------------------------------------------------------- all of it


@dataclass(frozen=True)
class DapoSettings:
    """Every DAPO decision both engines make from the config."""

    loss: LossSettings
    filter: FilterSettings
    sampling: SamplingSettings
    overlong: OverlongSettings
    run: RunSettings
    entropy_watch: EntropyWatchSettings

    @classmethod
    def from_config(cls, config: Mapping) -> DapoSettings:
        """From the composed config as a plain nested mapping (``OmegaConf.to_container(cfg, resolve=True)``).
        The run's keys are checked first: a value the user set is named before any key derived from it (a
        response budget of 0 is ``data.max_response_length``, not the ``max_resp_len`` interpolated from it)."""
        run = RunSettings.from_config(config)
        return cls(
            run=run,
            loss=LossSettings.from_config(config),
            filter=FilterSettings.from_config(config),
            sampling=SamplingSettings.from_config(config),
            overlong=OverlongSettings.from_config(config),
            entropy_watch=EntropyWatchSettings.from_config(config),
        )
