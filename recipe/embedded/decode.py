"""The embedded engine's own decode loop and shared-prompt forward passes: the rollout path built for RL.

Two facts of a GRPO/DAPO batch that Hugging Face ``generate`` and a plain forward do not use:

1. The G responses of a group share their prompt (here about 70% of the tokens of every forward). The prompt is
   run once per group, its KV cache is expanded G ways (``DynamicCache.batch_repeat_interleave``), and only the
   response tokens go through the model G times: in generation (:func:`sample`), in the old log-prob pass and in
   the update's forward (:func:`shared_prompt_log_probs`, gradients flow back into the prompt's keys and values).
   For short rows the forward passes pack a group into one sequence instead, ``[prompt | response 1 | ... ]``
   under a block-causal mask: one model call per micro-batch instead of two (prefill, then responses).
2. The sampling pass already holds the logits of every sampled token: :func:`sample` returns
   ``log softmax(logits / temperature)`` of each sampled token, the same quantity the recomputation gives
   (``rollout.sequence_log_probs``), so the old log-prob pass can be skipped
   (``algorithm.rollout_correction.bypass_mode``, verl's name for "old log-probs are the rollout's").

The loop itself is a plain loop over ``model(...)`` with a KV cache: no logits-processor list, no stopping-criteria
objects; temperature, top-k and top-p are a handful of tensor ops (:func:`filter_logits`) applied exactly as
``generate`` applies them (temperature, then top-k, then top-p, ``-inf`` for removed tokens), then one token is drawn
from the softmax by inverse transform sampling (:func:`draw`: ``multinomial``'s distribution, one uniform per row
instead of one exponential per vocabulary entry). A row that ends leaves the batch and the KV cache at once
(``Cache.reorder_cache``), so a long-tailed batch spends its compute on the rows still writing; the loop stops when
every row has ended. Greedy decoding gives ``generate``'s tokens; sampling draws from the same distribution with
another RNG stream (tests/embedded/test_decode.py: greedy against ``generate``, sampled against a loop without a
cache drawing the same uniforms, and :func:`draw`'s frequencies).

The model is any Hugging Face causal LM that takes ``past_key_values`` (a ``DynamicCache``), ``position_ids`` and
``logits_to_keep``, and a 4-D attention mask as given (``sdpa`` / ``eager`` attention; other kernels use the cache
layout), as the decoder-only models of transformers 5 do.

Layout (as verl's): prompts left-padded, responses right-padded (the pad token after a row's end),
the G responses of a prompt in consecutive rows. Deviation: the KV cache is Hugging Face's ``DynamicCache`` (grown by
concatenation), not a preallocated one; on SmolLM2 (responses of up to 104 tokens) its concatenations were under a
tenth of a decoding step.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from dapo.metrics import entropy_from_logits
from recipe.common.log_probs import left_pad
from recipe.embedded.attention import NAME as ATTENTION
from recipe.embedded.attention import PackedRows
from recipe.embedded.fused_decoder import FusedDecoder
from recipe.embedded.head import token_log_probs
from recipe.embedded.rollout import SamplingParams, batched_log_probs, response_mask_from_eos, right_pad


def filter_logits(scores: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """``[N, V]`` fp32 logits -> temperature-scaled scores with the tokens outside top-k / top-p set to -inf
    (``generate``'s order and tie rules: top-k keeps every token >= the k-th score, top-p removes the low tail
    whose cumulative probability is <= 1 - top_p and always keeps the most likely token)."""
    if temperature != 1.0:
        scores = scores / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]  # [N, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)  # [N, V]
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)  # [N, V]
        remove_sorted = cumulative <= 1 - top_p
        remove_sorted[..., -1:] = False  # the most likely token is always kept
        remove = remove_sorted.scatter(-1, order, remove_sorted)  # [N, V] back to vocabulary order
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


def _group_runs(prompts: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Consecutive rows with the same prompt -> (the distinct prompts in order, ``[U]`` row counts)."""
    unique, counts = [], []
    for p in prompts:
        if unique and (p is unique[-1] or (p.shape == unique[-1].shape and torch.equal(p, unique[-1]))):
            counts[-1] += 1
        else:
            unique.append(p)
            counts.append(1)
    return unique, torch.tensor(counts)


def _prefill(model, prompts: Sequence[torch.Tensor], pad_id: int, device, logits_to_keep: int = 1):
    """One forward over the left-padded distinct prompts: (logits of the last position ``[U, 1, V]``, cache,
    ``[U, P]`` mask, ``[U]`` real lengths)."""
    from transformers import DynamicCache

    ids, mask = left_pad(prompts, pad_id)  # [U, P]
    ids, mask = ids.to(device), mask.to(device)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # [U, P] real tokens only
    cache = DynamicCache(config=model.config)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=logits_to_keep,
    )
    return out.logits, out.past_key_values, mask, mask.sum(-1)


@torch.no_grad()
def sample(
    model,
    prompts: Sequence[torch.Tensor],  # B prompts, 1-D token ids each
    *,
    n: int,
    params: SamplingParams,
    max_new_tokens: int,
    eos_ids: torch.Tensor,  # [E]
    pad_id: int,
    max_num_seqs: int,
    timing: GenerationTiming | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` responses per prompt (rows ``i*n .. i*n+n-1`` belong to prompt ``i``): ``[B*n, T]`` ids, mask and
    ``log softmax(logits / temperature)`` of each sampled token (0 past the end), in fp32 (fp64 for an fp64
    model). Each prompt is prefilled once and its cache expanded ``n`` ways; at most ``max_num_seqs`` responses
    (whole groups, at least one) decode together. ``model`` is a Hugging Face causal LM (its own forward, the
    plain path) or a :class:`~recipe.embedded.fused_decoder.FusedDecoder` over one (the same layers arranged for
    decoding). ``timing``, when given, accumulates where the call spent its time."""
    fused = isinstance(model, FusedDecoder)
    device = model.device if fused else next(model.parameters()).device
    was_training = not fused and model.training
    if not fused:
        model.eval()
    groups_per_chunk = max(1, max_num_seqs // n)
    eos = eos_ids.to(device)
    ids_chunks, logp_chunks = [], []
    for start in range(0, len(prompts), groups_per_chunk):
        chunk = prompts[start : start + groups_per_chunk]
        begin = time.perf_counter()
        if fused:
            logits, state = model.start(chunk, n, max_new_tokens, pad_id)
        else:
            logits, state = _PlainState.start(model, chunk, n, max_new_tokens, pad_id, device)
        if timing is not None:
            timing.prefill_s += time.perf_counter() - begin
            timing.prompt_tokens += sum(len(p) for p in chunk)
        ids, logp = _sample_chunk(logits, state, params, max_new_tokens, eos, pad_id, timing)
        ids_chunks.append(ids.cpu())
        logp_chunks.append(logp.cpu())
    if was_training:
        model.train()
    width = max(c.shape[1] for c in ids_chunks)
    response_ids = right_pad(ids_chunks, width, pad_id)  # [B*n, T]
    response_mask = response_mask_from_eos(response_ids, eos_ids.cpu())  # [B*n, T]
    log_probs = right_pad(logp_chunks, width, 0.0) * response_mask  # [B*n, T]
    return response_ids, response_mask, log_probs


def draw(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of ``[N, V]`` probabilities (zeros allowed) by inverse transform sampling: one uniform per
    row, scaled to the row's total, and the first token whose cumulative probability exceeds it. The same
    distribution as ``torch.multinomial(probs, 1)``, which draws an exponential variate for every token of the
    vocabulary: on SmolLM2's 49k tokens that was 30% of a decoding step on a CPU. A token of probability 0 is never
    drawn (its cumulative probability equals its predecessor's)."""
    cdf = probs.cumsum(dim=-1)  # [N, V]
    u = torch.rand((probs.shape[0], 1), dtype=cdf.dtype, device=probs.device) * cdf[:, -1:]  # [N, 1]
    index = torch.searchsorted(cdf, u, right=True).squeeze(-1)  # [N] first token with cumulative > u
    # a token found below the end has cdf > its predecessor's, so a probability > 0; only u rounded up to the row's
    # total finds none (index V): then the last possible token
    past = index == probs.shape[-1]
    if past.any():
        last = probs.shape[-1] - 1 - (probs[past].flip(-1) > 0).to(torch.int8).argmax(dim=-1)
        index = index.masked_scatter(past, last)
    return index


class _PlainState:
    """The plain path's decoding state: the model's own forward over a ``DynamicCache`` whose prompt part is
    expanded ``n`` ways (the reference :class:`~recipe.embedded.fused_decoder.DecodeState` is held to)."""

    @classmethod
    def start(cls, model, prompts, n: int, max_new_tokens: int, pad_id: int, device):
        logits, cache, prompt_mask, lengths = _prefill(model, prompts, pad_id, device)  # [b, 1, V]
        cache.batch_repeat_interleave(n)  # the prompt's keys and values, once per response
        state = cls()
        state.model, state.cache, state.t = model, cache, 0
        prompt_mask = prompt_mask.repeat_interleave(n, dim=0)  # [N, P]
        state.width = prompt_mask.shape[1]
        state.positions = lengths.repeat_interleave(n).unsqueeze(-1)  # [N, 1] position of the first response token
        ones = prompt_mask.new_ones(prompt_mask.shape[0], max_new_tokens)
        state.attention = torch.cat([prompt_mask, ones], dim=1)  # [N, P+T]
        return logits[:, -1].repeat_interleave(n, dim=0), state  # [N, V]

    def step(self, tokens: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        if keep is not None:  # a row that ended leaves the batch and the cache: no more compute spent on it
            self.attention, self.positions = self.attention[keep], self.positions[keep]
            self.cache.reorder_cache(keep)
        out = self.model(
            input_ids=tokens.unsqueeze(-1),
            attention_mask=self.attention[:, : self.width + self.t + 1],
            position_ids=self.positions + self.t,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.t += 1
        self.cache = out.past_key_values
        return out.logits[:, -1]  # [A, V]


@dataclass
class GenerationTiming:
    """Where :func:`sample` calls spent their time, accumulated over the calls given it."""

    prefill_s: float = 0.0  # the prompts' forward, logits of the first token
    decode_s: float = 0.0  # the decoding steps' forwards
    sample_s: float = 0.0  # filtering, drawing and the log-probs of the drawn tokens
    prompt_tokens: int = 0  # prompt tokens prefilled (each distinct prompt once)
    decode_rows: list[int] = field(default_factory=list)  # rows fed at each decoding step


def _sample_chunk(logits, state, params, max_new_tokens, eos, pad_id, timing=None):
    """Sample from the first tokens' ``[N, V]`` logits on, advancing ``state`` one token a step."""
    rows, device = logits.shape[0], logits.device
    log_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)  # [N, T]
    log_probs = torch.zeros((rows, max_new_tokens), dtype=log_dtype, device=device)  # [N, T]
    active = torch.arange(rows, device=device)  # [A] rows still decoding; the batch, cache and logits hold these
    steps = 0
    clock = time.perf_counter()
    for t in range(max_new_tokens):
        scores = logits.to(log_dtype)  # [A, V]
        if params.do_sample:
            next_tokens = draw(filter_logits(scores, params.temperature, params.top_k, params.top_p).softmax(-1))
        else:
            next_tokens = scores.argmax(dim=-1)  # [A]
        # log pi(token) at the rollout temperature, before top-k / top-p (what the recomputation gives)
        temperature = params.temperature if params.do_sample else 1.0
        step_logp = (scores / temperature).log_softmax(dim=-1).gather(-1, next_tokens.unsqueeze(-1)).squeeze(-1)
        tokens[active, t] = next_tokens
        log_probs[active, t] = step_logp
        steps = t + 1
        going = ~torch.isin(next_tokens, eos)  # [A]
        if not going.any() or t + 1 == max_new_tokens:
            break
        keep = None
        if not going.all():
            keep = going.nonzero().squeeze(-1)  # [A']
            active, next_tokens = active[keep], next_tokens[keep]
        if timing is not None:
            now = time.perf_counter()
            timing.sample_s += now - clock
            clock = now
        logits = state.step(next_tokens, keep)  # [A, V]
        if timing is not None:
            now = time.perf_counter()
            timing.decode_s += now - clock
            timing.decode_rows.append(next_tokens.shape[0])
            clock = now
    if timing is not None:
        timing.sample_s += time.perf_counter() - clock
    return tokens[:, :steps], log_probs[:, :steps]


# Longest packed row (prompt + the group's responses) run as one masked sequence; longer rows use the KV-cache
# layout. The packed row's attention grows as the square of the row: on the tiny model's rows (tens of tokens) packing
# made the update 2.2x faster; on SmolLM2's (about 400 tokens: a prompt and 4 responses of about 70) the cache layout
# was 1.14x faster with the fp32 products of recipe.embedded.attention too (python -m bench.micro.step, 2 cores).
PACKED_MAX_LEN = 256
# architectures whose logits are lm_head(last hidden state) and nothing after it (no scaling, no soft-capping): the
# update takes log-probs from the hidden states in chunks (recipe.embedded.head); any other model through its logits
CHUNKED_HEAD_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")


def shared_prompt_log_probs(
    model,
    prompts: Sequence[torch.Tensor],  # N prompts, 1-D token ids each (one per response; equal ones consecutive)
    response_ids: torch.Tensor,  # [N, T]
    response_mask: torch.Tensor,  # [N, T] each response's tokens, a prefix of its row
    *,
    temperature: float,
    pad_id: int,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    layout: str = "auto",
    chunked_head: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``rollout.sequence_log_probs``'s contract on the response tokens (0 at masked positions), with each run of equal
    consecutive prompts run once.

    Two layouts of the same computation (equal log-probs, entropies and gradients, tested):

    - ``"packed"``: one forward over one row per distinct prompt, ``[prompt | response 1 | ... | response n]``
      (each response at its own length, without its last token, which predicts nothing), with a block-causal
      attention mask (a response sees the prompt and its own earlier tokens, never another response) and position
      ids restarting after the prompt. One model call and one autograd graph per micro-batch, and no padding: the
      update's tokens are the responses' own. Its attention work grows as the square of the row.
    - ``"cache"``: the distinct prompts go through the model once; their KV cache is expanded to one copy per
      response and the responses, right-padded to the longest, run on top of it (gradients reach the prompt's
      forward through the expanded cache).

    ``"auto"`` (the default) packs when the longest packed row is at most :data:`PACKED_MAX_LEN` tokens and the
    model's attention takes a 4-D additive mask (``sdpa``, ``eager``, ``dapo_cpu``; not flash-attention kernels).
    Position ids count real tokens only, as in ``sequence_log_probs``. For the architectures of
    :data:`CHUNKED_HEAD_ARCHITECTURES` (unless ``chunked_head=False``) the model runs without its head and the
    log-probs come from the hidden states of the response tokens only (``recipe.embedded.head.token_log_probs``: no
    ``[tokens, V]`` fp32 logits held); any other model's logits are taken at those positions.
    """
    device = next(model.parameters()).device
    unique, counts = _group_runs(prompts)
    response_ids, response_mask = response_ids.to(device), response_mask.to(device)
    lengths = response_mask.sum(-1)  # [N]
    structured = getattr(model.config, "_attn_implementation", None) == ATTENTION
    if layout == "auto":  # packed: short rows and an attention that takes a 4-D mask (the CPU attention does)
        fed = (lengths - 1).clamp(min=0)  # [N] tokens a response feeds to the packed row
        group = torch.repeat_interleave(torch.arange(len(unique), device=device), counts.to(device))  # [N]
        packed = torch.tensor([len(p) for p in unique], device=device).index_add_(0, group, fed)  # [U] row lengths
        longest = int(packed.max())
        maskable = getattr(model.config, "_attn_implementation", None) in ("sdpa", "eager")
        layout = "packed" if (structured or maskable) and longest <= PACKED_MAX_LEN else "cache"
    chunked = chunked_head and type(model).__name__ in CHUNKED_HEAD_ARCHITECTURES
    forward = _Forward(model, hidden=chunked)
    if layout == "packed":
        out, rows, cols = _packed(forward, unique, counts, response_ids, lengths, pad_id, device, structured)
    elif layout == "cache":
        out, rows, cols = _cached(forward, unique, counts, response_ids, response_mask, pad_id, device)
    else:
        raise ValueError(f"layout must be 'auto', 'packed' or 'cache', got {layout!r}")
    valid = response_mask.bool()  # [N, T]
    selected, targets = out[rows, cols], response_ids[valid]  # [M, X], [M] the response tokens in row order
    if chunked:
        log_prob_m, entropy_m = token_log_probs(
            selected,
            model.get_output_embeddings().weight,
            targets,
            temperature=temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
        )
    else:
        logits = (selected if selected.dtype == torch.float64 else selected.float()) / temperature  # [M, V]
        log_prob_m = torch.gather(logits.log_softmax(dim=-1), -1, targets.unsqueeze(-1)).squeeze(-1)
        entropy_m = None
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                entropy_m = entropy_from_logits(logits)
    log_prob = log_prob_m.new_zeros(response_ids.shape).masked_scatter(valid, log_prob_m)  # [N, T]
    entropy = None if entropy_m is None else entropy_m.new_zeros(response_ids.shape).masked_scatter(valid, entropy_m)
    return log_prob, entropy


class _Forward:
    """The model's forward returning its last hidden states (``hidden``: the head is applied in chunks by the
    caller) or its logits, and the KV cache when asked for one."""

    def __init__(self, model, hidden: bool) -> None:
        self.model, self.hidden = model, hidden

    def __call__(self, **kwargs):
        if self.hidden:
            out = self.model.get_decoder()(**kwargs)
            return out.last_hidden_state, getattr(out, "past_key_values", None)
        out = self.model(**kwargs)
        return out.logits, getattr(out, "past_key_values", None)


def _packed(forward, unique, counts, response_ids, lengths, pad_id, device, structured=False):
    """One block-causal forward per distinct prompt over ``[prompt | response 1 | ...]``, each response at its own
    length; return its output ``[U, S, X]`` and, for every response token in row order, the packed row and column
    ``[M]`` whose output predicts it. ``structured``: the model's attention is ``recipe.embedded.attention``'s, which
    takes the rows' layout (:class:`~recipe.embedded.attention.PackedRows`) instead of an ``[S, S]`` mask."""
    n = response_ids.shape[0]
    u = len(unique)
    counts = counts.to(device)  # [U]
    plen = torch.tensor([len(p) for p in unique], device=device)  # [U]
    row = torch.repeat_interleave(torch.arange(u, device=device), counts)  # [N] packed row of each response
    first = torch.cumsum(counts, 0) - counts  # [U] first response of each row
    k = torch.arange(n, device=device) - first[row]  # [N] index of the response within its group
    fed = (lengths - 1).clamp(min=0)  # [N] tokens fed per response (its last one predicts nothing)
    earlier = torch.cumsum(fed, 0) - fed  # [N] fed tokens of the responses before it, over all rows
    before = earlier - earlier[first][row]  # [N] ... within its own row
    start = plen[row] + before  # [N] where response k's tokens begin in its row
    width = int((start + fed).max().clamp(min=int(plen.max())))  # S
    ids = torch.full((u, width), pad_id, dtype=torch.long, device=device)  # [U, S]
    positions = torch.zeros((u, width), dtype=torch.long, device=device)  # [U, S]
    block = torch.full((u, width), -2, dtype=torch.long, device=device)  # [U, S] -1 prompt, k response k, -2 pad
    for g, prompt in enumerate(unique):
        ids[g, : len(prompt)] = prompt.to(device)
        positions[g, : len(prompt)] = torch.arange(len(prompt), device=device)
        block[g, : len(prompt)] = -1
    t = torch.arange(response_ids.shape[1], device=device)  # [T]
    feeds = t.unsqueeze(0) < fed.unsqueeze(1)  # [N, T] the fed tokens
    fed_rows = row.unsqueeze(1).expand_as(feeds)[feeds]  # [F]
    fed_cols = (start.unsqueeze(1) + t)[feeds]  # [F]
    ids[fed_rows, fed_cols] = response_ids[feeds]
    positions[fed_rows, fed_cols] = (plen[row].unsqueeze(1) + t)[feeds]
    block[fed_rows, fed_cols] = k.unsqueeze(1).expand_as(feeds)[feeds]
    # token t of a response is predicted by the prompt's last position (t = 0) or its own token t - 1
    valid = t.unsqueeze(0) < lengths.unsqueeze(1)  # [N, T]
    cols = torch.where(t == 0, plen[row].unsqueeze(1) - 1, start.unsqueeze(1) + t - 1)  # [N, T]
    if structured:
        layout = PackedRows.build(plen, row, start, fed)
        out, _ = forward(input_ids=ids, position_ids=positions, use_cache=False, packed_rows=layout)
        return out, row.unsqueeze(1).expand_as(valid)[valid], cols[valid]
    # query i sees key j <= i of the prompt or of its own block; a pad position sees only itself
    index = torch.arange(width, device=device)
    causal = index.unsqueeze(0) <= index.unsqueeze(1)  # [S, S]
    query, key = block.unsqueeze(2), block.unsqueeze(1)  # [U, S, 1], [U, 1, S]
    allowed = causal & ((key == -1) | (query == key)) & (key != -2)  # [U, S, S]
    allowed |= torch.eye(width, dtype=torch.bool, device=device)
    dtype = forward.model.dtype
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    additive = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    out, _ = forward(input_ids=ids, attention_mask=additive.unsqueeze(1), position_ids=positions, use_cache=False)
    return out, row.unsqueeze(1).expand_as(valid)[valid], cols[valid]


def _cached(forward, unique, counts, response_ids, response_mask, pad_id, device):
    """The distinct prompts once, their cache expanded per response, the responses on top; return the output
    ``[N, T, X]`` (position t predicts response token t) and each response token's row and column ``[M]``."""
    ids, mask = left_pad(unique, pad_id)  # [U, P]
    ids, mask = ids.to(device), mask.to(device)
    from transformers import DynamicCache

    first, cache = forward(
        input_ids=ids,
        attention_mask=mask,
        position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
        past_key_values=DynamicCache(config=forward.model.config),
        use_cache=True,
    )  # [U, P, X]
    counts = counts.to(device)
    _repeat_cache(cache, counts)
    out = first[:, -1:].repeat_interleave(counts, dim=0)  # [N, 1, X] the prompt's last position predicts token 0
    if response_ids.shape[1] > 1:
        inputs = response_ids[:, :-1]  # [N, T-1]
        attention = torch.cat([mask.repeat_interleave(counts, dim=0), response_mask[:, :-1].long()], dim=1)
        lengths = mask.sum(-1).repeat_interleave(counts).unsqueeze(-1)  # [N, 1]
        positions = lengths + torch.arange(inputs.shape[1], device=device)
        rest, _ = forward(
            input_ids=inputs, attention_mask=attention, position_ids=positions, past_key_values=cache, use_cache=True
        )  # [N, T-1, X]
        out = torch.cat([out, rest], dim=1)  # [N, T, X]
    valid = response_mask.bool()
    rows, cols = valid.nonzero(as_tuple=True)
    return out, rows, cols


def _repeat_cache(cache, counts: torch.Tensor) -> None:
    """Expand every layer's keys and values from ``[U, ...]`` to ``[sum(counts), ...]`` (differentiable)."""
    if bool((counts == counts[0]).all()):
        cache.batch_repeat_interleave(int(counts[0]))
        return
    for layer in cache.layers:
        layer.keys = layer.keys.repeat_interleave(counts, dim=0)
        layer.values = layer.values.repeat_interleave(counts, dim=0)


def batched_shared_log_probs(
    model, prompts, response_ids, response_mask, *, temperature, pad_id, micro_batch_size, chunked_head=True
):
    """:func:`shared_prompt_log_probs` in chunks of ``micro_batch_size`` rows, without gradients, on the CPU."""
    return batched_log_probs(
        model,
        prompts,
        response_ids,
        response_mask,
        temperature=temperature,
        pad_id=pad_id,
        micro_batch_size=micro_batch_size,
        log_prob_fn=functools.partial(shared_prompt_log_probs, chunked_head=chunked_head),
    )
