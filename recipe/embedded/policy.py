"""The policy the embedded engine trains: the model, its tokenizer, its end tokens, where and in what precision it
computes, and the low-precision copy that samples.

:func:`load_policy` loads it (from a checkpoint when resuming, else ``model.path``, else the warmed-up tiny model);
:func:`device_and_dtypes` reads ``embedded.device`` / ``embedded.dtype``; :func:`bf16_compute` is the same rule
for tools that measure the engine (the benches) and fall back to float32 where the engine would refuse.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dapo.settings import eos_token_ids
from recipe.common.cpu import cpu_has_bf16
from recipe.embedded.attention import use_cpu_attention
from recipe.embedded.config import ConfigError, EngineConfig
from recipe.embedded.fused_decoder import FusedDecoder, unsupported_reason

logger = logging.getLogger(__name__)


@dataclass
class Policy:
    model: torch.nn.Module
    tokenizer: object
    eos_ids: torch.Tensor  # [E] every token that ends a response
    pad_id: int
    device: torch.device
    autocast_dtype: torch.dtype | None  # bf16 compute over fp32 weights (a GPU, or a CPU with native bf16)
    fast_path: bool = False  # embedded.fast_path: sample with the fused decoder where the model is supported
    _sampler: torch.nn.Module | FusedDecoder | None = field(default=None, repr=False)
    _said_fallback: bool = field(default=False, repr=False)  # the fast path's fallback is said once

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def sampler(self) -> torch.nn.Module | FusedDecoder:
        """What generates: with ``fast_path`` and a supported model, a :class:`FusedDecoder` over the policy's weights
        (in ``autocast_dtype`` where set); otherwise the policy itself in full precision, or with low-precision
        compute a copy held in ``autocast_dtype`` (:func:`low_precision_copy`). Kept in step by
        :meth:`sync_sampler`."""
        if self._sampler is None:
            dtype = self.autocast_dtype or next(self.model.parameters()).dtype
            reason = unsupported_reason(self.model) if self.fast_path else None
            if self.fast_path and reason is None:
                self._sampler = FusedDecoder(self.model, dtype)
                return self._sampler
            if reason is not None and not self._said_fallback:
                self._said_fallback = True
                logger.warning("embedded.fast_path: sampling with the model's own forward (slower): %s", reason)
            if self.autocast_dtype is not None:
                self._sampler = low_precision_copy(self.model, self.autocast_dtype)
            else:
                return self.model
        return self._sampler

    def sync_sampler(self) -> None:
        """After an optimizer step: what generates takes the policy's new weights, cast to its dtype."""
        if isinstance(self._sampler, FusedDecoder):
            self._sampler.refresh()
        elif self._sampler is not None:
            with torch.no_grad():
                for low, full in zip(self._sampler.parameters(), self.model.parameters(), strict=True):
                    low.copy_(full)


def low_precision_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen copy of ``model`` for generation with its parameters in ``dtype`` (buffers such as the rotary
    frequencies stay as they are), as verl's rollout serves bf16 weights while the actor keeps fp32 ones.

    Autocast casts every weight at every call: in a decode loop, one forward per token, the casts cost more than
    the matrix products (SmolLM2-135M on 2 CPU cores, 12 prompts x 4 responses of 64 tokens: 23-30 s under
    autocast, 9 s with this copy)."""
    low = copy.deepcopy(model).eval()
    low.requires_grad_(False)
    for param in low.parameters():
        param.data = param.data.to(dtype)
    return low


def device_and_dtypes(c: EngineConfig) -> tuple[torch.device, torch.dtype, torch.dtype | None]:
    """(device, parameter dtype, autocast dtype) from ``embedded.device`` / ``embedded.dtype``."""
    if c.embedded.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(c.embedded.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"embedded.device={c.embedded.device!r} but no CUDA device is visible; set embedded.device=auto"
            )
    name = c.embedded.dtype
    if name == "auto":
        name = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if name not in ("float32", "float64", "bfloat16", "float16"):
        raise ConfigError(
            f"embedded.dtype must be auto, float32, float64, bfloat16 or float16; got {c.embedded.dtype!r}"
        )
    if name == "float64":
        return device, torch.float64, None
    if name == "float32":
        return device, torch.float32, None
    if device.type != "cuda" and (name == "float16" or not cpu_has_bf16()):
        raise ConfigError(
            f"embedded.dtype={name} needs a GPU{'' if name == 'float16' else ' or a CPU with AVX-512 BF16 or AMX'}; "
            "on this CPU use float32 (or auto)"
        )
    return device, torch.float32, getattr(torch, name)  # fp32 master weights, low-precision compute


def bf16_compute(c: EngineConfig) -> bool:
    """Whether the engine computes in bf16 on this machine for config ``c`` (``embedded.dtype=bfloat16`` on a CPU
    with native bf16, or ``auto``/``bfloat16`` on a GPU with it). The engine refuses a bf16 config where bf16 is
    missing (:func:`device_and_dtypes`); the benches use this to sample as the engine does and run float32 there."""
    try:
        return device_and_dtypes(c)[2] == torch.bfloat16
    except ConfigError:
        return False


def policy_tokenizer(c: EngineConfig, resume_from: Path | None):
    """The policy's tokenizer, as the engine uses it (chat template checked, left padding), without the model: from a
    checkpoint when resuming, else ``model.tokenizer_path`` / ``model.path``, else the tiny task's (built before the
    warm-up, so that prompts are checked before it runs)."""
    if resume_from is not None:
        tokenizer_dir = resume_from / "actor"
    elif c.model.path is not None:
        tokenizer_dir = c.model.tokenizer_path or c.model.path
    else:
        tokenizer_dir = c.tiny.task_dir() / "tokenizer"
    try:
        tokenizer = load_tokenizer(tokenizer_dir, c.model.trust_remote_code)
    except OSError as err:
        raise ConfigError(
            f"cannot load the tokenizer of {str(tokenizer_dir)!r} ({err}); set actor_rollout_ref.model.path (or "
            "tokenizer_path) to a local directory saved with save_pretrained"
        ) from None
    if c.model.custom_chat_template:
        tokenizer.chat_template = c.model.custom_chat_template
    if not tokenizer.chat_template:
        raise ConfigError(
            f"the tokenizer of {tokenizer_dir} has no chat template; set actor_rollout_ref.model.custom_chat_template"
        )
    tokenizer.padding_side = "left"
    return tokenizer


def load_policy(c: EngineConfig, resume_from: Path | None, tokenizer) -> Policy:
    """The model (from a checkpoint when resuming, else ``model.path``, else the warmed-up tiny model) with the
    tokenizer :func:`policy_tokenizer` gave."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    device, param_dtype, autocast_dtype = device_and_dtypes(c)
    if resume_from is not None:
        model_dir = resume_from / "actor"
    elif c.model.path is not None:
        model_dir = c.model.path
    else:
        model_dir = c.tiny.model_dir(device, progress_bar=c.embedded.progress_bar)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=param_dtype, trust_remote_code=c.model.trust_remote_code
        )
    except OSError as err:
        raise ConfigError(
            f"cannot load actor_rollout_ref.model.path={str(model_dir)!r} ({err}); give a local directory saved with "
            "save_pretrained, or a hub id with network access (nothing is downloaded in tests)"
        ) from None
    eos = eos_token_ids(tokenizer.eos_token_id, model.generation_config.eos_token_id)  # shared with verl's engine
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    model.generation_config = GenerationConfig(eos_token_id=list(eos), pad_token_id=pad_id)  # no hub defaults
    for module in model.modules():  # dropout off: old and new log-probs must see the same network
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.0
    if c.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.to(device)
    if c.embedded.fast_path:
        use_cpu_attention(model)  # a CPU model with sdpa / eager attention: fp32 products (recipe.embedded.attention)
    return Policy(model, tokenizer, torch.tensor(eos), int(pad_id), device, autocast_dtype, c.embedded.fast_path)


def load_tokenizer(path, trust_remote_code: bool = False):
    """``AutoTokenizer``, except for a directory saved from a plain ``tokenizers`` tokenizer (the embedded one):
    given a ``config.json`` of model type qwen2, transformers 5 would load it as ``Qwen2Tokenizer`` and replace its
    pre-tokenizer, changing every token id."""
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(path) / "tokenizer_config.json"
    if config.is_file() and json.loads(config.read_text()).get("tokenizer_class") in (
        "TokenizersBackend",
        "PreTrainedTokenizerFast",
    ):
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
