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

Layout (as ``rollout.generate``): prompts left-padded, responses right-padded (the pad token after a row's end),
the G responses of a prompt in consecutive rows. Deviation: the KV cache is Hugging Face's ``DynamicCache`` (grown by
concatenation), not a preallocated one; on SmolLM2 (responses of up to 104 tokens) its concatenations were under a
tenth of a decoding step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dapo.metrics import entropy_from_logits
from recipe.common.log_probs import left_pad
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rollout.generate``'s contract plus the log-probs: ``[B*n, T]`` ids, mask and
    ``log softmax(logits / temperature)`` of each sampled token (0 past the end), in fp32 (fp64 for an fp64
    model). Each prompt is prefilled once and its cache expanded ``n`` ways; at most ``max_num_seqs`` responses
    (whole groups, at least one) decode together."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    groups_per_chunk = max(1, max_num_seqs // n)
    eos = eos_ids.to(device)
    ids_chunks, logp_chunks = [], []
    for start in range(0, len(prompts), groups_per_chunk):
        ids, logp = _sample_chunk(
            model, prompts[start : start + groups_per_chunk], n, params, max_new_tokens, eos, pad_id, device
        )
        ids_chunks.append(ids.cpu())
        logp_chunks.append(logp.cpu())
    model.train(was_training)
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
    last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).to(torch.int8).argmax(dim=-1)  # [N] last possible token
    return torch.minimum(index, last)  # u rounded up to the row's total


def _sample_chunk(model, prompts, n, params, max_new_tokens, eos, pad_id, device):
    logits, cache, prompt_mask, lengths = _prefill(model, prompts, pad_id, device)  # [b, 1, V]
    cache.batch_repeat_interleave(n)  # the prompt's keys and values, once per response
    logits = logits[:, -1].repeat_interleave(n, dim=0)  # [N, V]
    prompt_mask = prompt_mask.repeat_interleave(n, dim=0)  # [N, P]
    positions = lengths.repeat_interleave(n).unsqueeze(-1)  # [N, 1] position of the first response token
    rows, width = prompt_mask.shape
    attention = torch.cat([prompt_mask, prompt_mask.new_ones(rows, max_new_tokens)], dim=1)  # [N, P+T]
    log_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)  # [N, T]
    log_probs = torch.zeros((rows, max_new_tokens), dtype=log_dtype, device=device)  # [N, T]
    active = torch.arange(rows, device=device)  # [A] rows still decoding; the batch, cache and logits hold these
    steps = 0
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
        if not going.all():  # a row that ended leaves the batch and the cache: no more compute spent on it
            keep = going.nonzero().squeeze(-1)  # [A']
            active, next_tokens = active[keep], next_tokens[keep]
            attention, positions = attention[keep], positions[keep]
            cache.reorder_cache(keep)
        out = model(
            input_ids=next_tokens.unsqueeze(-1),
            attention_mask=attention[:, : width + t + 1],
            position_ids=positions + t,
            past_key_values=cache,
            use_cache=True,
        )
        logits, cache = out.logits[:, -1], out.past_key_values  # [A, V]
    return tokens[:, :steps], log_probs[:, :steps]


# Longest packed row (prompt + n x response) run as one masked sequence; longer rows use the KV-cache layout.
# Measured on the default tiny Qwen2, one CPU thread, G = 8 (update time, cache over packed): 1.5x at rows of 78
# tokens, 1.2x at 142, 1.0x at 270, 0.8x at 526.
PACKED_MAX_LEN = 256


def shared_prompt_log_probs(
    model,
    prompts: Sequence[torch.Tensor],  # N prompts, 1-D token ids each (one per response; equal ones consecutive)
    response_ids: torch.Tensor,  # [N, T]
    response_mask: torch.Tensor,  # [N, T]
    *,
    temperature: float,
    pad_id: int,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    layout: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``rollout.sequence_log_probs``'s contract, with each run of equal consecutive prompts run once.

    Two layouts of the same computation (equal log-probs, entropies and gradients, tested):

    - ``"packed"``: one forward over one row per distinct prompt, ``[prompt | response 1 | ... | response n]``
      (each response without its last token, which predicts nothing), with a block-causal attention mask (a
      response sees the prompt and its own earlier tokens, never another response) and position ids restarting
      after the prompt. One model call and one autograd graph per micro-batch: on a CPU with a small model, where
      per-op overhead dominates, the update's forward + backward is 1.5x faster than the cache layout at the
      default run's rows. Its attention work grows as (prompt + n x response)^2, so it is for short rows only.
    - ``"cache"``: the distinct prompts go through the model once (only their last position's logits are kept,
      it predicts the first response token); their KV cache is expanded to one copy per response and the
      responses run on top of it (gradients reach the prompt's forward through the expanded cache).

    ``"auto"`` (the default) packs when the longest packed row is at most :data:`PACKED_MAX_LEN` tokens and the
    model's attention takes a 4-D additive mask (``sdpa``, ``eager``; not flash-attention kernels).
    Position ids count real tokens only, as in ``sequence_log_probs``.
    """
    device = next(model.parameters()).device
    unique, counts = _group_runs(prompts)
    response_ids = response_ids.to(device)
    if layout == "auto":  # packed: short rows, and an attention that takes an additive 4-D mask
        longest = max(len(p) for p in unique) + int(counts.max()) * max(response_ids.shape[1] - 1, 0)
        maskable = getattr(model.config, "_attn_implementation", None) in ("sdpa", "eager")
        layout = "packed" if maskable and longest <= PACKED_MAX_LEN else "cache"
    if layout == "packed":
        logits = _packed_logits(model, unique, counts, response_ids, pad_id, device)  # [N, T, V]
    elif layout == "cache":
        logits = _cached_logits(model, unique, counts, response_ids, response_mask, pad_id, device)  # [N, T, V]
    else:
        raise ValueError(f"layout must be 'auto', 'packed' or 'cache', got {layout!r}")
    logits = (logits if logits.dtype == torch.float64 else logits.float()) / temperature
    log_prob = torch.gather(logits.log_softmax(dim=-1), -1, response_ids.unsqueeze(-1)).squeeze(-1)  # [N, T]
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits)  # [N, T]
    return log_prob, entropy


def _packed_logits(model, unique, counts, response_ids, pad_id, device) -> torch.Tensor:
    """``[N, T, V]`` logits predicting each response token, from one block-causal forward per distinct prompt."""
    n, t = response_ids.shape
    w = t - 1  # tokens fed per response (its last one predicts nothing)
    u = len(unique)
    counts = counts.to(device)  # [U]
    lengths = torch.tensor([len(p) for p in unique], device=device)  # [U]
    row = torch.repeat_interleave(torch.arange(u, device=device), counts)  # [N] packed row of each response
    first = torch.cumsum(counts, 0) - counts  # [U] first response of each row
    k = torch.arange(n, device=device) - first[row]  # [N] index of the response within its group
    start = lengths[row] + k * w  # [N] where response k's tokens begin in its row
    width = int((lengths + counts * w).max())  # S
    ids = torch.full((u, width), pad_id, dtype=torch.long, device=device)  # [U, S]
    positions = torch.zeros((u, width), dtype=torch.long, device=device)  # [U, S]
    block = torch.full((u, width), -2, dtype=torch.long, device=device)  # [U, S] -1 prompt, k response k, -2 pad
    for g, prompt in enumerate(unique):
        ids[g, : len(prompt)] = prompt.to(device)
        positions[g, : len(prompt)] = torch.arange(len(prompt), device=device)
        block[g, : len(prompt)] = -1
    offsets = torch.arange(w, device=device)  # [w]
    cols = start.unsqueeze(-1) + offsets  # [N, w] packed columns of each response's fed tokens
    ids[row.unsqueeze(-1), cols] = response_ids[:, :w]
    positions[row.unsqueeze(-1), cols] = lengths[row].unsqueeze(-1) + offsets
    block[row.unsqueeze(-1), cols] = k.unsqueeze(-1).expand(n, w)
    # query i sees key j <= i of the prompt or of its own block; a pad position sees only itself
    index = torch.arange(width, device=device)
    causal = index.unsqueeze(0) <= index.unsqueeze(1)  # [S, S]
    query, key = block.unsqueeze(2), block.unsqueeze(1)  # [U, S, 1], [U, 1, S]
    allowed = causal & ((key == -1) | (query == key)) & (key != -2)  # [U, S, S]
    allowed |= torch.eye(width, dtype=torch.bool, device=device)
    dtype = next(model.parameters()).dtype
    if torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)
    additive = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    logits = model(
        input_ids=ids, attention_mask=additive.unsqueeze(1), position_ids=positions, use_cache=False
    ).logits  # [U, S, V]
    predictors = torch.cat([(lengths[row] - 1).unsqueeze(-1), cols], dim=1)  # [N, T] column predicting token t
    return logits[row.unsqueeze(-1), predictors]  # [N, T, V]


def _cached_logits(model, unique, counts, response_ids, response_mask, pad_id, device) -> torch.Tensor:
    """``[N, T, V]`` logits predicting each response token: prompts prefilled once, cache expanded per response."""
    logits_first, cache, prompt_mask, lengths = _prefill(model, unique, pad_id, device)  # [U, 1, V]
    counts = counts.to(device)
    _repeat_cache(cache, counts)
    response_mask = response_mask.to(device).long()
    prompt_mask = prompt_mask.repeat_interleave(counts, dim=0)  # [N, P]
    logits = logits_first.repeat_interleave(counts, dim=0)  # [N, 1, V]
    if response_ids.shape[1] > 1:
        inputs = response_ids[:, :-1]  # [N, T-1]
        attention = torch.cat([prompt_mask, response_mask[:, :-1]], dim=1)  # [N, P+T-1]
        positions = lengths.repeat_interleave(counts).unsqueeze(-1) + torch.arange(inputs.shape[1], device=device)
        rest = model(
            input_ids=inputs, attention_mask=attention, position_ids=positions, past_key_values=cache, use_cache=True
        ).logits  # [N, T-1, V]
        logits = torch.cat([logits, rest], dim=1)  # [N, T, V] position t predicts response token t
    return logits


def _repeat_cache(cache, counts: torch.Tensor) -> None:
    """Expand every layer's keys and values from ``[U, ...]`` to ``[sum(counts), ...]`` (differentiable)."""
    if bool((counts == counts[0]).all()):
        cache.batch_repeat_interleave(int(counts[0]))
        return
    for layer in cache.layers:
        layer.keys = layer.keys.repeat_interleave(counts, dim=0)
        layer.values = layer.values.repeat_interleave(counts, dim=0)


def batched_shared_log_probs(model, prompts, response_ids, response_mask, *, temperature, pad_id, micro_batch_size):
    """:func:`shared_prompt_log_probs` in chunks of ``micro_batch_size`` rows, without gradients, on the CPU."""
    return batched_log_probs(
        model,
        prompts,
        response_ids,
        response_mask,
        temperature=temperature,
        pad_id=pad_id,
        micro_batch_size=micro_batch_size,
        log_prob_fn=shared_prompt_log_probs,
    )
