"""The embedded engine's decode loop and shared-prompt forward against Hugging Face's ``generate`` and a full forward.

"Two ways must agree" tests on randomly initialised Qwen2 models: the engine's tiny shape (vocabulary 64) and a
real Qwen2 vocabulary (151,936 tokens) with a tiny body, so that top-k / top-p act on a realistic vocabulary.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from recipe.common.log_probs import left_pad, sequence_log_probs
from recipe.embedded.decode import draw, filter_logits, sample, shared_prompt_log_probs
from recipe.embedded.rollout import SamplingParams, response_mask_from_eos, right_pad
from tests.conftest import EPS32, EPS64, reorder_bound

pytestmark = pytest.mark.numerics

EOS = torch.tensor([1, 2])
PAD = 0
HIDDEN, INTERMEDIATE, LAYERS = 64, 128, 2  # the models of qwen2() below
DEPTH = 2 * LAYERS + 2  # attention and MLP of each layer, the embedding and the head


def tiny_causal_lm(family: str, vocab_size: int, dtype, *, seed: int, tied: bool):
    """A random ``family`` (``Qwen2`` or ``Llama``) causal LM of this file's shape, EOS and pad, in eval mode."""
    import transformers

    torch.manual_seed(seed)
    config = getattr(transformers, f"{family}Config")(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
    )
    model = getattr(transformers, f"{family}ForCausalLM")(config).to(dtype).eval()
    model.generation_config = transformers.GenerationConfig(eos_token_id=EOS.tolist(), pad_token_id=PAD)
    return model


def qwen2(vocab_size: int, dtype=torch.float32):
    return tiny_causal_lm("Qwen2", vocab_size, dtype, seed=0, tied=True)


def prompts(vocab_size: int, count: int = 5, seed: int = 1) -> list[torch.Tensor]:
    """Prompts of different lengths (7 to 15 tokens), so that left padding is exercised."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab_size, (7 + 2 * i,), generator=g) for i in range(count)]


@pytest.fixture(scope="module", params=[64, 151936], ids=["vocab64", "vocab151936"])
def model(request):
    # float64 (with float64_end_to_end in each test): the decode loop and generate compute the same logits in
    # another summation order, and a sampled token can only differ where a cumulative probability lies within
    # that rounding of the uniform draw: about 1e-7 per draw in float32, about 1e-16 in float64
    return qwen2(request.param, torch.float64)


PARAMS = [
    SamplingParams(False, 1.0, 1.0, 0),  # greedy
    SamplingParams(True, 1.0, 1.0, 0),  # training rollouts: plain sampling at temperature 1
    SamplingParams(True, 1.0, 0.7, 0),  # the paper's validation sampling (top_p 0.7)
    SamplingParams(True, 0.7, 0.9, 20),  # temperature, top-k and top-p together
]


def reference_sample(model, prompt_list, *, n, params, max_new_tokens, max_num_seqs) -> torch.Tensor:
    """The decode loop's draws computed without a KV cache: at every step one full forward over each still-active
    row's prompt and tokens so far (left-padded), then the same filter and the same :func:`draw` over the active
    rows in order, so the same uniforms; a row stops at its end token. ``[B*n, T]`` ids, right-padded."""
    chunks, groups = [], max(1, max_num_seqs // n)
    for start in range(0, len(prompt_list), groups):
        rows = [p for p in prompt_list[start : start + groups] for _ in range(n)]
        out: list[list[int]] = [[] for _ in rows]
        active = list(range(len(rows)))
        for _ in range(max_new_tokens):
            ids, mask = left_pad([torch.cat([rows[i], torch.tensor(out[i], dtype=torch.long)]) for i in active], PAD)
            with torch.no_grad():
                logits = model(
                    input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
                ).logits[:, -1]  # [A, V]
            scores = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
            if params.do_sample:
                picked = draw(filter_logits(scores, params.temperature, params.top_k, params.top_p).softmax(-1))
            else:
                picked = scores.argmax(dim=-1)
            for i, token in zip(active, picked.tolist()):
                out[i].append(token)
            active = [i for i in active if out[i][-1] not in EOS.tolist()]
            if not active:
                break
        width = max(len(o) for o in out)
        chunks.append(torch.tensor([o + [PAD] * (width - len(o)) for o in out]))
    return right_pad(chunks, max(c.shape[1] for c in chunks), PAD)


@torch.no_grad()
def hf_generate(model, prompts, *, n, params, max_new_tokens, eos_ids, pad_id, max_num_seqs):
    """The reference rollout: Hugging Face's ``generate`` on ``n`` copies of each prompt, left-padded, in chunks of
    ``max_num_seqs``; ids and mask ``[B*n, T]`` in ``sample``'s layout."""
    repeated = [p for p in prompts for _ in range(n)]
    sampling = dict(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k)
    chunks = []
    for start in range(0, len(repeated), max_num_seqs):
        ids, mask = left_pad(repeated[start : start + max_num_seqs], pad_id)  # [b, P]
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos_ids.tolist(),
            pad_token_id=pad_id,
            **(sampling if params.do_sample else dict(do_sample=False)),
        )
        chunks.append(out[:, ids.shape[1] :])  # [b, T_chunk]
    response_ids = right_pad(chunks, max(c.shape[1] for c in chunks), pad_id)  # [B*n, T]
    return response_ids, response_mask_from_eos(response_ids, eos_ids)


def test_greedy_tokens_are_generates(model, float64_end_to_end):
    """Greedy decoding: token for token ``generate``'s, rows that end early leaving the batch or not."""
    vocab = model.config.vocab_size
    kwargs = dict(n=4, params=PARAMS[0], max_new_tokens=12, eos_ids=EOS, pad_id=PAD, max_num_seqs=1024)
    expected_ids, expected_mask = hf_generate(model, prompts(vocab), **kwargs)
    ids, mask, _ = sample(model, prompts(vocab), **kwargs)
    assert ids.shape == expected_ids.shape == (20, expected_ids.shape[1])
    torch.testing.assert_close(ids, expected_ids, rtol=0, atol=0)
    torch.testing.assert_close(mask, expected_mask, rtol=0, atol=0)


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "t1", "top_p0.7", "t0.7_k20_p0.9"])
@pytest.mark.parametrize("max_num_seqs", [1024, 8], ids=["one_chunk", "chunks_of_8"])
def test_same_tokens_as_a_loop_without_a_cache(model, params, max_num_seqs, float64_end_to_end):
    """Same RNG state: the decode loop (prompt prefilled once per group, KV cache, ended rows dropped from the
    batch and the cache) draws exactly the tokens of :func:`reference_sample`, which recomputes every step from the
    full sequences. ``max_num_seqs`` = 8 with n = 4: two groups per chunk."""
    vocab = model.config.vocab_size
    kwargs = dict(n=4, params=params, max_new_tokens=12, max_num_seqs=max_num_seqs)
    torch.manual_seed(7)
    expected = reference_sample(model, prompts(vocab), **kwargs)
    torch.manual_seed(7)
    ids, mask, _ = sample(model, prompts(vocab), eos_ids=EOS, pad_id=PAD, **kwargs)
    torch.testing.assert_close(ids, expected, rtol=0, atol=0)
    if vocab == 64 and params.do_sample:  # end tokens 2 of 64: rows end at different steps and leave the batch
        lengths = mask.sum(-1)
        assert lengths.min() < lengths.max()


def test_draw_follows_the_probabilities_and_never_draws_an_impossible_token():
    """200,000 rows of probs [0.1, 0, 0.6, 0.3, 0]: each frequency within 5 standard errors (sqrt(p(1-p)/N),
    at most 0.0011 here) of its probability, seeded, and tokens 1 and 4 (probability 0) never drawn."""
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3, 0.0]).expand(200_000, 5)
    torch.manual_seed(0)
    counts = torch.bincount(draw(probs), minlength=5).double() / 200_000
    se = (probs[0].double() * (1 - probs[0].double()) / 200_000).sqrt()
    assert bool(((counts - probs[0]).abs() <= 5 * se + 1e-12).all()), counts
    assert counts[1] == 0 and counts[4] == 0


def test_draw_at_the_top_of_the_uniform_stays_on_a_possible_token(monkeypatch):
    """A uniform that rounds up to the row's total would point past the last token; the draw keeps the last token
    of positive probability instead (here token 1 of [0.5, 0.5, 0])."""
    monkeypatch.setattr(torch, "rand", lambda size, dtype=None, device=None: torch.ones(size, dtype=dtype))
    assert draw(torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])).tolist() == [1, 2]


def test_a_row_that_ends_leaves_the_batch():
    """EOS = the greedy first token of prompt 0 only: its 3 responses end at the first token, and every later
    decoding call runs prompt 1's 3 rows alone (batch 3, not 6)."""
    model = qwen2(64)
    distinct = prompts(64, count=2)
    with torch.no_grad():
        first = [int(model(input_ids=p.unsqueeze(0)).logits[0, -1].argmax()) for p in distinct]
    assert first[0] != first[1]
    batches = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: batches.append(kwargs["input_ids"].shape), with_kwargs=True
    )
    ids, mask, _ = sample(
        model,
        distinct,
        n=3,
        params=PARAMS[0],
        max_new_tokens=5,
        eos_ids=torch.tensor([first[0]]),
        pad_id=PAD,
        max_num_seqs=64,
    )
    assert batches[0][0] == 2 and all(shape == (3, 1) for shape in batches[1:]) and len(batches) == 5
    assert mask.sum(-1).tolist() == [1, 1, 1, 5, 5, 5]
    assert (ids[:3, 1:] == PAD).all()


def test_the_loop_stops_when_every_response_has_ended():
    """EOS = the set of greedy first tokens of the prompts: every response is that one token (mask 1), and the
    loop stops after one step instead of running to max_new_tokens."""
    model = qwen2(64)
    distinct = prompts(64, count=2)
    with torch.no_grad():
        first = [int(model(input_ids=p.unsqueeze(0)).logits[0, -1].argmax()) for p in distinct]
    eos = torch.tensor(sorted(set(first)))
    ids, mask, log_probs = sample(
        model, distinct, n=3, params=PARAMS[0], max_new_tokens=5, eos_ids=eos, pad_id=PAD, max_num_seqs=64
    )
    assert ids.shape == (6, 1)
    assert ids.flatten().tolist() == [first[0]] * 3 + [first[1]] * 3
    assert mask.flatten().tolist() == [1] * 6 and bool((log_probs < 0).all())


def test_filter_logits_worked_example():
    """probs [0.5, 0.3, 0.15, 0.05]. top_p 0.7: ascending cumulative 0.05, 0.20, 0.50, 1.00; the low tail with
    cumulative <= 0.3 (tokens 3 and 2) goes, tokens 0 and 1 stay. top_k 1: token 0 only. temperature 0.5 squares
    the odds: softmax(2 log p) = p^2 / sum p^2 = [0.25, 0.09, 0.0225, 0.0025] / 0.365."""
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = filter_logits(logits, 1.0, 0, 0.7).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    assert filter_logits(logits, 1.0, 1, 1.0).isfinite().tolist() == [[True, False, False, False]]
    probs = filter_logits(logits, 0.5, 0, 1.0).softmax(-1)
    # a handful of float32 operations on exact inputs: assert_close's float32 default (rtol 1.3e-6 = 11 eps32)
    torch.testing.assert_close(probs, torch.tensor([[0.25, 0.09, 0.0225, 0.0025]]) / 0.365)


@pytest.mark.parametrize("vocab", [64, 151936], ids=["vocab64", "vocab151936"])  # 64: rows end early, leave the batch
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_sampling_log_probs_equal_a_full_forward(dtype, vocab, request):
    """The log-probs kept from the sampling pass (incremental, KV cache, prompt prefilled once) against
    ``sequence_log_probs`` (one forward over prompt + response): the same algebra in another summation order, so
    equal within the bound that order allows on every response token. The sums are over the hidden size, the
    MLP width and the attended positions (at most 25 here); a log-prob moves at most twice as far as the logits
    (log_softmax's slope), whose terms sum to about the largest |log-prob|. Measured about 1e-6 in fp32 and 1e-15
    in fp64, against bounds of about 1e-3 and 1e-12; an off-by-one position or a stale cache moves them by > 1e-2."""
    if dtype == torch.float64:
        request.getfixturevalue("float64_end_to_end")
    model = qwen2(vocab, dtype)
    params = SamplingParams(True, 0.8, 1.0, 0)
    torch.manual_seed(5)
    ids, mask, log_probs = sample(
        model, prompts(vocab), n=4, params=params, max_new_tokens=10, eos_ids=EOS, pad_id=PAD, max_num_seqs=1024
    )
    rows = [p for p in prompts(vocab) for _ in range(4)]
    with torch.no_grad():
        expected, _ = sequence_log_probs(model, rows, ids, mask, temperature=0.8, pad_id=PAD)
    assert log_probs.dtype == expected.dtype
    eps = EPS32 if dtype == torch.float32 else EPS64
    tol = 2 * reorder_bound(HIDDEN + INTERMEDIATE + 25, DEPTH, eps, 1 + expected.abs().max().item())
    gap = ((log_probs - expected) * mask).abs().max().item()
    assert gap <= tol, (gap, tol)
    assert float(log_probs[mask.bool()].sum()) < 0 and bool((log_probs[~mask.bool()] == 0).all())


@pytest.mark.parametrize("layout", ["packed", "cache"])
def test_shared_prompt_forward_equals_the_full_forward_with_gradients(layout, float64_end_to_end):
    """Groups of unequal sizes (3, 1, 4 responses) on prompts of different lengths, responses with padding, in
    both layouts (one block-causal packed row per prompt; the prompt's KV cache expanded per response):
    log-probs, entropies and every parameter's gradient of sum(log_prob * mask) agree with the full forward.

    Exact algebra (masked positions add exactly 0 after the softmax), so compared in float64 end to end, within
    what another summation order allows: sums over the hidden size, the MLP width and the packed row (at most
    15 + 4 x 6 = 39 positions), and for a gradient also over the 8 x 6 response tokens that feed it."""
    model = qwen2(64, torch.float64).train()
    distinct = prompts(64, count=3)
    rows = [distinct[0]] * 3 + [distinct[1]] + [distinct[2]] * 4  # 8 responses
    g = torch.Generator().manual_seed(2)
    response_ids = torch.randint(3, 64, (8, 6), generator=g)  # [8, 6]
    response_mask = torch.ones(8, 6, dtype=torch.long)
    response_mask[1, 4:] = 0  # two responses end early
    response_mask[6, 2:] = 0

    def run(fn):
        model.zero_grad()
        log_prob, entropy = fn(model, rows, response_ids, response_mask, temperature=1.0, pad_id=PAD, with_entropy=True)
        (log_prob * response_mask).sum().backward()
        return log_prob.detach(), entropy.detach(), [p.grad.clone() for p in model.parameters()]

    full = run(sequence_log_probs)
    shared = run(functools.partial(shared_prompt_log_probs, layout=layout))
    m = response_mask.bool()
    terms = HIDDEN + INTERMEDIATE + 39
    for got, expected in ((shared[0], full[0]), (shared[1], full[1])):  # log-probs, entropies
        bound = 2 * reorder_bound(terms, DEPTH, EPS64, 1 + expected[m].abs().max().item())
        torch.testing.assert_close(got[m], expected[m], rtol=0, atol=bound)
    for a, b in zip(shared[2], full[2]):
        bound = reorder_bound(terms + 8 * 6, DEPTH, EPS64, 1 + b.abs().max().item())
        torch.testing.assert_close(a, b, rtol=0, atol=bound)
    assert sum(math.isfinite(float(g.abs().sum())) and float(g.abs().sum()) > 0 for g in full[2]) == len(full[2])


def test_auto_layout_packs_short_rows_and_caches_long_ones(monkeypatch):
    """``layout="auto"``: rows of prompt + n x response up to PACKED_MAX_LEN tokens go through the model in one
    call (packed), longer ones in two (prompt prefill, then the responses on its cache); an unknown layout is an
    error naming the choices. Here a row is 7 + 3 x (6 - 1) = 22 tokens. (Qwen2's logits are its head over the
    last hidden state, so the model runs without its head: the calls counted are the decoder's.)"""
    from recipe.embedded import decode

    model = qwen2(64).train()
    rows = [prompts(64, count=1)[0]] * 3  # one prompt of 7 tokens, a group of 3 responses
    response_ids = torch.randint(3, 64, (3, 6), generator=torch.Generator().manual_seed(3))  # [3, 6]
    response_mask = torch.ones(3, 6, dtype=torch.long)
    calls = []
    model.get_decoder().register_forward_hook(lambda module, args, kwargs_out: calls.append(1))

    def model_calls(limit: int) -> int:
        monkeypatch.setattr(decode, "PACKED_MAX_LEN", limit)
        calls.clear()
        shared_prompt_log_probs(model, rows, response_ids, response_mask, temperature=1.0, pad_id=PAD)
        return len(calls)

    row = len(rows[0]) + 3 * 5
    assert model_calls(row) == 1  # fits: packed
    assert model_calls(row - 1) == 2  # one token too long: cache layout
    from recipe.embedded.attention import use_cpu_attention

    assert use_cpu_attention(model)  # the fast path's attention follows the same rule
    assert model_calls(row) == 1 and model_calls(row - 1) == 2
    with pytest.raises(ValueError, match="'auto', 'packed' or 'cache'"):
        shared_prompt_log_probs(model, rows, response_ids, response_mask, temperature=1.0, pad_id=PAD, layout="flat")
