"""The sampler's forward for Llama-family models (Llama, Qwen2): the model's own arithmetic, arranged for decoding.

A Hugging Face model decodes one token per row per call through a generic path: seven projections a layer, a
``DynamicCache`` grown by concatenation with every prompt's keys copied once per response, and ``sdpa`` attention
whose CPU kernel is built for long queries. On SmolLM2-135M (2 CPU cores, 12 prompts x 4 responses) that
attention was half of a decoding step, 3.5 ms a layer for one query per row. :class:`FusedDecoder` computes the
same layers (Hugging Face's ``modeling_llama`` / ``modeling_qwen2``, transformers 5.10: RMSNorm in fp32, the model's
own rotary embedding, grouped-query attention, SiLU-gated MLP, tied or untied head) in the shape decoding has:

1. fused projections: ``q|k|v`` one weight, ``gate|up`` one weight, four matrix products a layer instead of seven;
2. a preallocated KV cache in which each prompt's keys and values are stored once for its group (cascade
   attention): its ``n`` responses read them through one batched product, their own tokens' keys and values are
   written in place, one slot a step;
3. attention of one query per row as batched matrix products (scores, a softmax in fp32 over the prompt's and the
   response's scores together, the weighted values), as Hugging Face's ``eager`` attention computes it;
4. rows that end leave the batch: the projections run on the rows still writing, and the cache is compacted when
   rows leave.

Deviation: in bf16 the attention scores are rounded to bf16 before the softmax (``eager``'s order), where the
``sdpa`` kernel keeps them in fp32; the sampled log-probs then differ from the plain path's by bf16 rounding, the
size of the gap between the bf16 sampler and the fp32 actor that is already there (``recipe.embedded.policy``).
In float32 and float64 both paths compute the same values up to summation order
(``tests/embedded/test_fused_decoder.py`` holds greedy tokens, sampled tokens and log-probs to the plain path's).

:func:`fused_decoder_for` says whether a model is supported; the engine falls back to the plain path (the model's
own forward, ``recipe.embedded.decode``) for any other model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from recipe.common.log_probs import left_pad

# the architectures whose layers are exactly the ones computed here
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
# rotary embeddings whose cos / sin depend on the position alone (not on the sequence length seen so far)
STATIC_ROPE_TYPES = ("default", "linear", "llama3")


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why :class:`FusedDecoder` cannot compute ``model``'s forward (``None``: it can)."""
    name = type(model).__name__
    if name not in SUPPORTED_ARCHITECTURES:
        return f"{name} is not one of {', '.join(SUPPORTED_ARCHITECTURES)}"
    config = model.config
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act={config.hidden_act!r} (only silu)"
    if getattr(config, "mlp_bias", False):
        return "mlp_bias=true"
    if getattr(config, "pretraining_tp", 1) != 1:
        return f"pretraining_tp={config.pretraining_tp}"
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in STATIC_ROPE_TYPES:
        return f"rope_type={rope!r} (only {', '.join(STATIC_ROPE_TYPES)})"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "sliding-window layers"
    attention = model.model.layers[0].self_attn
    extra = {n for n, _ in attention.named_children()} - {"q_proj", "k_proj", "v_proj", "o_proj"}
    if extra:
        return f"attention has {', '.join(sorted(extra))}"
    if attention.o_proj.bias is not None:
        return "o_proj has a bias"
    return None


@dataclass
class _Layer:
    input_norm: torch.Tensor  # [d]
    qkv: torch.Tensor  # [(H + 2 KVH) * D, d]
    qkv_bias: torch.Tensor | None  # [(H + 2 KVH) * D]
    o: torch.Tensor  # [d, H * D]
    post_norm: torch.Tensor  # [d]
    gate_up: torch.Tensor  # [2 I, d] gate rows, then up rows
    down: torch.Tensor  # [d, I]


class FusedDecoder:
    """A model's weights in ``dtype``, arranged for decoding (:meth:`start` a batch, then :meth:`DecodeState.step`),
    kept current with the model by :meth:`refresh`. Weights that need no fusing and no cast are the model's own
    tensors (no copy); fused and cast ones are copies, refreshed in place."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"FusedDecoder cannot compute this model: {reason}")
        config = model.config
        self.dtype = dtype
        # attention (scores, softmax, weighted values) and its KV cache in fp32 for bf16 / fp16 weights: the sdpa
        # kernel's accumulation, and oneDNN's bf16 batched products rebuild their kernel for every new length
        self.attn_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        self.device = next(model.parameters()).device
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.eps = config.rms_norm_eps
        self.rotary = model.model.rotary_emb
        self._model = model
        self._cos = self._sin = None  # [positions, D] tables, grown on demand
        self._packs = _onednn_packs(dtype, self.device)
        self.refresh()

    def _own(self, tensor: torch.Tensor) -> torch.Tensor:
        """The model's tensor itself where it is already in ``dtype``, else a cast copy."""
        return tensor.detach() if tensor.dtype == self.dtype else tensor.detach().to(self.dtype)

    @torch.no_grad()
    def refresh(self) -> None:
        """Take the model's current weights (after an optimizer step)."""
        model, pack = self._model, self._pack
        layers = []
        for layer in model.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            qkv = (attention.q_proj, attention.k_proj, attention.v_proj)
            bias = None
            if attention.q_proj.bias is not None:
                bias = torch.cat([p.bias.detach() for p in qkv]).to(self.dtype)
            layers.append(
                _Layer(
                    input_norm=self._own(layer.input_layernorm.weight),
                    qkv=pack(torch.cat([p.weight.detach() for p in qkv])),
                    qkv_bias=bias,
                    o=pack(attention.o_proj.weight.detach()),
                    post_norm=self._own(layer.post_attention_layernorm.weight),
                    gate_up=pack(torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()])),
                    down=pack(mlp.down_proj.weight.detach()),
                )
            )
        self.layers = layers
        self.norm = self._own(model.model.norm.weight)
        self.embed = self._own(model.get_input_embeddings().weight)
        self.head = pack(model.get_output_embeddings().weight.detach())

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        """A ``[N, K]`` weight in ``dtype``, in oneDNN's blocked layout where oneDNN computes this dtype on this
        device (bf16 on a CPU: the same products, 1.2x to 2x faster at decoding's few rows, as vLLM-CPU packs its
        weights), else as a plain tensor (the model's own where no cast is needed)."""
        weight = weight if weight.dtype == self.dtype else weight.to(self.dtype)
        if self._packs:
            return torch.ops.mkldnn._reorder_linear_weight(weight, 64)  # the layout for about 64 rows
        return weight

    def rope_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[length, D]`` cos and sin in ``dtype``, from the model's rotary module (its scaling included)."""
        if self._cos is None or self._cos.shape[0] < length:
            size = max(length, 2 * (0 if self._cos is None else self._cos.shape[0]), 256)
            positions = torch.arange(size, device=self.device).unsqueeze(0)  # [1, S]
            probe = torch.empty(0, dtype=self.dtype, device=self.device)
            cos, sin = self.rotary(probe, positions)  # [1, S, D], cast to dtype as the model does
            self._cos, self._sin = cos[0], sin[0]
        return self._cos, self._sin

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``LlamaRMSNorm`` (normalised in fp32, then the weight) as one fused op: the same values in fp32 and fp64;
        in bf16 one rounding where ``LlamaRMSNorm`` rounds twice (before and after the weight)."""
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin ``[*positions.shape, D]`` for :func:`_rotate`."""
        cos, sin = self.rope_tables(int(positions.max()) + 1)
        cos, sin = cos[positions], sin[positions]
        half = cos.shape[-1] // 2
        return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)  # rotate_half's sign, folded in

    def rotation(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[A, H + KVH, D]`` cos and sin of each row's position for the fused ``q|k`` of a decoding step, the
        queries' scaled by 1/sqrt(D) (attention's scaling folded in: exact for a power-of-two D)."""
        cos, sin = self.rope(positions)  # [A, D]
        scale = torch.ones(self.num_heads + self.num_kv_heads, 1, dtype=cos.dtype, device=cos.device)
        scale[: self.num_heads] = self.head_dim**-0.5
        return cos.unsqueeze(1) * scale, sin.unsqueeze(1) * scale

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return _linear(self.rms_norm(h, self.norm), self.head)

    @torch.no_grad()
    def start(self, prompts: Sequence[torch.Tensor], n: int, max_new_tokens: int, pad_id: int):
        """Prefill the distinct ``prompts`` (each once), make room for ``n`` responses of each of at most
        ``max_new_tokens`` tokens; return the logits of every response's first token ``[U*n, V]`` and the
        :class:`DecodeState` that :meth:`DecodeState.step` advances."""
        ids, mask = left_pad(prompts, pad_id)  # [U, P]
        ids, mask = ids.to(self.device), mask.to(self.device).bool()
        u, p = ids.shape
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # [U, P] real tokens only
        self.rope_tables(p + max_new_tokens)
        cos, sin = (x.unsqueeze(1) for x in self.rope(positions))  # [U, 1, P, D]
        causal = torch.ones(p, p, dtype=torch.bool, device=self.device).tril()  # [P, P]
        allowed = causal & mask[:, None, None, :]  # [U, 1, P, P] a query sees earlier real keys
        allowed |= torch.eye(p, dtype=torch.bool, device=self.device)  # a pad query sees itself (no empty row)
        state = DecodeState(self, mask, n, max_new_tokens)
        h = F.embedding(ids, self.embed)  # [U, P, d]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(self.rms_norm(h, layer.input_norm), layer)  # [U, P, H|KVH, D]
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [U, H|KVH, P, D]
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            state.keys[i, :, :, :p], state.values[i, :, :, :p] = k, v
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)  # [U, H, P, D]
            h = h + _linear(out.transpose(1, 2).reshape(u, p, -1), layer.o)
            h = h + self._mlp(self.rms_norm(h, layer.post_norm), layer)
        logits = self.logits(h[:, -1])  # [U, V] the last position is each prompt's last real token
        return logits.repeat_interleave(n, dim=0), state

    def _qkv(self, x: torch.Tensor, layer: _Layer):
        """``[..., d]`` -> q ``[..., H, D]``, k and v ``[..., KVH, D]``."""
        qkv = _linear(x, layer.qkv, layer.qkv_bias)
        h, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = qkv.split([h * d, h_kv * d, h_kv * d], dim=-1)
        lead = x.shape[:-1]
        return q.view(*lead, h, d), k.view(*lead, h_kv, d), v.view(*lead, h_kv, d)

    @staticmethod
    def _mlp(x: torch.Tensor, layer: _Layer) -> torch.Tensor:
        gate, up = _linear(x, layer.gate_up).chunk(2, dim=-1)
        return _linear(F.silu(gate) * up, layer.down)


class DecodeState:
    """The KV cache of one batch, one block per group ``[L, G, KVH, P + n*T, D]``: the prompt's keys and values
    once, then its ``n`` responses' interleaved by step (slot ``P + t*n + j`` holds response ``j``'s token ``t``),
    so that what a step reads is one prefix of the block. A query sees its prompt's real tokens and its own
    response's slots (an additive mask); a group's rows are ``n * rep`` queries of one batched product."""

    def __init__(self, decoder: FusedDecoder, prompt_mask: torch.Tensor, n: int, max_new_tokens: int):
        self.dec, self.n = decoder, n
        groups, self.prompt_len = prompt_mask.shape
        width = self.prompt_len + n * max_new_tokens
        shape = (len(decoder.layers), groups, decoder.num_kv_heads, width, decoder.head_dim)
        # zeros: the slots of a row that ended stay 0, under the other rows' mask (never NaN from empty memory)
        self.keys = torch.zeros(shape, dtype=decoder.attn_dtype, device=decoder.device)  # [L, G, KVH, S, D]
        self.values = torch.zeros_like(self.keys)
        slot = torch.arange(width - self.prompt_len, device=decoder.device) % n  # [n*T] whose slot it is
        own = slot == torch.arange(n, device=decoder.device).unsqueeze(-1)  # [n, n*T]
        seen = torch.cat([prompt_mask.unsqueeze(1).expand(-1, n, -1), own.expand(groups, -1, -1)], dim=-1)
        self.bias = torch.zeros(seen.shape, dtype=decoder.attn_dtype, device=decoder.device)  # [G, n, S]
        self.bias.masked_fill_(~seen, torch.finfo(decoder.attn_dtype).min)  # 0 where a row looks, min elsewhere
        self.positions = prompt_mask.sum(-1).repeat_interleave(n)  # [A] position of each active row's next token
        self.group = torch.arange(groups, device=decoder.device).repeat_interleave(n)  # [A] each row's group
        self.member = torch.arange(n, device=decoder.device).repeat(groups)  # [A] its index in the group
        self.t = 0  # response tokens in the cache

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Feed one token per active row ``[A]``; ``keep`` (indices into the current active rows) first drops the rows
        that ended. Returns the logits of the next token ``[A, V]``."""
        if keep is not None:
            self._drop(keep)
        dec, n = self.dec, self.n
        a, g = tokens.shape[0], self.keys.shape[1]
        h_q, h_kv, d = dec.num_heads, dec.num_kv_heads, dec.head_dim
        rep = h_q // h_kv
        full = a == g * n  # every row of every group still writing: the grouped layout is the rows' own
        first = self.prompt_len + self.t * n  # this step's slots: first .. first + n - 1
        seen = first + n  # the prefix of the block a query reads
        bias = self.bias[:, :, :seen, None].transpose(2, 3).unsqueeze(1).expand(g, h_kv, n, rep, seen)
        bias = bias.reshape(g * h_kv, n * rep, seen)  # [G*KVH, n*rep, S_t]
        rows = self.group * n + self.member  # [A] each active row's place in the grouped layout
        slots = first + self.member  # [A]
        cos, sin = dec.rotation(self.positions)  # [A, H+KVH, D] each
        h = F.embedding(tokens, dec.embed)  # [A, d]
        for i, layer in enumerate(dec.layers):
            qkv = _linear(dec.rms_norm(h, layer.input_norm), layer.qkv, layer.qkv_bias)  # [A, (H+2KVH) D]
            qk = _rotate(qkv[:, : (h_q + h_kv) * d].view(a, h_q + h_kv, d), cos, sin)  # q scaled by 1/sqrt(D)
            q, k = qk[:, :h_q], qk[:, h_q:]  # [A, H, D], [A, KVH, D]
            v = qkv[:, (h_q + h_kv) * d :].view(a, h_kv, d)
            keys, values = self.keys[i], self.values[i]  # [G, KVH, S, D]
            if full:
                keys[:, :, first:seen] = k.view(g, n, h_kv, d).transpose(1, 2)
                values[:, :, first:seen] = v.view(g, n, h_kv, d).transpose(1, 2)
            else:  # the rows into the grouped layout, the ended ones' queries 0
                keys[self.group, :, slots] = k.to(keys.dtype)
                values[self.group, :, slots] = v.to(values.dtype)
                q = q.new_zeros(g * n, h_q, d).index_copy_(0, rows, q)
            grouped = torch.empty(g, h_kv, n, rep, d, dtype=dec.attn_dtype, device=q.device)
            grouped.copy_(q.view(g, n, h_kv, rep, d).transpose(1, 2))  # [G, KVH, n, rep, D], cast in the copy
            scores = torch.baddbmm(bias, grouped.view(g * h_kv, n * rep, d), keys[:, :, :seen].flatten(0, 1).mT)
            out = torch.bmm(scores.softmax(dim=-1), values[:, :, :seen].flatten(0, 1))  # [G*KVH, n*rep, D]
            attended = torch.empty(g, n, h_kv, rep * d, dtype=dec.dtype, device=q.device)
            attended.copy_(out.view(g, h_kv, n, rep * d).transpose(1, 2))  # [G, n, KVH, rep*D], cast in the copy
            attended = attended.view(g * n, h_q * d)
            if not full:
                attended = attended[rows]  # [A, H*D]
            h = h + _linear(attended, layer.o)
            h = h + dec._mlp(dec.rms_norm(h, layer.post_norm), layer)
        self.t += 1
        self.positions = self.positions + 1
        return dec.logits(h)  # [A, V]

    def _drop(self, keep: torch.Tensor) -> None:
        """Keep rows ``keep`` of the active rows. Groups with no row left leave the cache once they are half of it
        (a copy of what was written so far, at most about one cache's worth over a batch)."""
        self.positions, self.group, self.member = self.positions[keep], self.group[keep], self.member[keep]
        live, group = torch.unique(self.group, return_inverse=True)  # the groups still writing, in order
        if 2 * live.numel() <= self.keys.shape[1]:
            written = self.prompt_len + self.t * self.n
            keys = torch.zeros_like(self.keys[:, : live.numel()])
            values = torch.zeros_like(keys)
            keys[:, :, :, :written] = self.keys[:, live, :, :written]
            values[:, :, :, :written] = self.values[:, live, :, :written]
            self.keys, self.values, self.bias, self.group = keys, values, self.bias[live], group


def _onednn_packs(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether oneDNN can pack weights of ``dtype`` on ``device`` (bf16 on a CPU with oneDNN), tried once."""
    if device.type != "cpu" or dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    try:
        probe = torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2, dtype=dtype), 1)
        return bool(
            torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2, dtype=dtype), probe, None, "none", [], "")[0, 0] == 2
        )
    except (RuntimeError, AttributeError):  # a torch built without oneDNN's bf16 kernels
        return False


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` over a plain or a oneDNN-packed weight (:meth:`FusedDecoder._pack`)."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, Hugging Face's ``x * cos + rotate_half(x) * sin`` with ``rotate_half``'s sign folded into
    ``sin`` (:meth:`FusedDecoder.rotation`): ``rotate_half`` is a roll by half the head, negated in its first half."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)
