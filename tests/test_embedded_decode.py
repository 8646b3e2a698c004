"""The embedded engine's decode loop and shared-prompt forward against Hugging Face's ``generate`` and a full forward.

"Two ways must agree" tests on randomly initialised Qwen2 models: the engine's tiny shape (vocabulary 64) and a
real Qwen2 vocabulary (151,936 tokens) with a tiny body, so that top-k / top-p act on a realistic vocabulary.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from conftest import EPS32, EPS64, reorder_bound
from recipe.embedded.decode import filter_logits, sample, shared_prompt_log_probs
from recipe.embedded.rollout import SamplingParams, generate, sequence_log_probs

pytestmark = pytest.mark.numerics

EOS = torch.tensor([1, 2])
PAD = 0
HIDDEN, INTERMEDIATE, LAYERS = 64, 128, 2  # the models of qwen2() below
DEPTH = 2 * LAYERS + 2  # attention and MLP of each layer, the embedding and the head


def qwen2(vocab_size: int, dtype=torch.float32):
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                         num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).to(dtype).eval()
    model.generation_config = GenerationConfig(eos_token_id=EOS.tolist(), pad_token_id=PAD)
    return model


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


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "t1", "top_p0.7", "t0.7_k20_p0.9"])
def test_same_tokens_as_generate_from_the_same_rng_state(model, params, float64_end_to_end):
    """Same RNG state, same batch: the decode loop draws exactly ``generate``'s tokens (greedy: token for token;
    sampled: the same filter, softmax and multinomial, so the same draws)."""
    vocab = model.config.vocab_size
    kwargs = dict(n=4, params=params, max_new_tokens=12, eos_ids=EOS, pad_id=PAD, max_num_seqs=1024)
    torch.manual_seed(7)
    expected_ids, expected_mask = generate(model, prompts(vocab), **kwargs)
    torch.manual_seed(7)
    ids, mask, _ = sample(model, prompts(vocab), **kwargs)
    assert ids.shape == expected_ids.shape == (20, expected_ids.shape[1])
    torch.testing.assert_close(ids, expected_ids, rtol=0, atol=0)
    torch.testing.assert_close(mask, expected_mask, rtol=0, atol=0)


def test_same_tokens_in_chunks_of_max_num_seqs(model, float64_end_to_end):
    """``max_num_seqs`` = 8 with n = 4: two groups per chunk, as ``generate`` in chunks of 8 rows."""
    vocab = model.config.vocab_size
    kwargs = dict(n=4, params=PARAMS[1], max_new_tokens=6, eos_ids=EOS, pad_id=PAD, max_num_seqs=8)
    torch.manual_seed(3)
    expected_ids, _ = generate(model, prompts(vocab), **kwargs)
    torch.manual_seed(3)
    ids, _, _ = sample(model, prompts(vocab), **kwargs)
    torch.testing.assert_close(ids, expected_ids, rtol=0, atol=0)


def test_the_loop_stops_when_every_response_has_ended():
    """EOS = the set of greedy first tokens of the prompts: every response is that one token (mask 1), and the
    loop stops after one step instead of running to max_new_tokens."""
    model = qwen2(64)
    distinct = prompts(64, count=2)
    with torch.no_grad():
        first = [int(model(input_ids=p.unsqueeze(0)).logits[0, -1].argmax()) for p in distinct]
    eos = torch.tensor(sorted(set(first)))
    ids, mask, log_probs = sample(model, distinct, n=3, params=PARAMS[0], max_new_tokens=5, eos_ids=eos,
                                  pad_id=PAD, max_num_seqs=64)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_sampling_log_probs_equal_a_full_forward(dtype, request):
    """The log-probs kept from the sampling pass (incremental, KV cache, prompt prefilled once) against
    ``sequence_log_probs`` (one forward over prompt + response): the same algebra in another summation order, so
    equal within the bound that order allows on every response token. The sums are over the hidden size, the
    MLP width and the attended positions (at most 25 here); a log-prob moves at most twice as far as the logits
    (log_softmax's slope), whose terms sum to about the largest |log-prob|. Measured about 1e-6 in fp32 and 1e-15
    in fp64, against bounds of about 1e-3 and 1e-12; an off-by-one position or a stale cache moves them by > 1e-2."""
    if dtype == torch.float64:
        request.getfixturevalue("float64_end_to_end")
    model = qwen2(151936, dtype)
    params = SamplingParams(True, 0.8, 1.0, 0)
    torch.manual_seed(5)
    ids, mask, log_probs = sample(model, prompts(151936), n=4, params=params, max_new_tokens=10, eos_ids=EOS,
                                  pad_id=PAD, max_num_seqs=1024)
    rows = [p for p in prompts(151936) for _ in range(4)]
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
        log_prob, entropy = fn(model, rows, response_ids, response_mask, temperature=1.0, pad_id=PAD,
                               with_entropy=True)
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
    error naming the choices. Here a row is 7 + 3 x (6 - 1) = 22 tokens."""
    from recipe.embedded import decode

    model = qwen2(64).train()
    rows = [prompts(64, count=1)[0]] * 3  # one prompt of 7 tokens, a group of 3 responses
    response_ids = torch.randint(3, 64, (3, 6), generator=torch.Generator().manual_seed(3))  # [3, 6]
    response_mask = torch.ones(3, 6, dtype=torch.long)
    calls = []
    model.register_forward_hook(lambda module, args, kwargs_out: calls.append(1))

    def model_calls(limit: int) -> int:
        monkeypatch.setattr(decode, "PACKED_MAX_LEN", limit)
        calls.clear()
        shared_prompt_log_probs(model, rows, response_ids, response_mask, temperature=1.0, pad_id=PAD)
        return len(calls)

    row = len(rows[0]) + 3 * 5
    assert model_calls(row) == 1  # fits: packed
    assert model_calls(row - 1) == 2  # one token too long: cache layout
    with pytest.raises(ValueError, match="'auto', 'packed' or 'cache'"):
        shared_prompt_log_probs(model, rows, response_ids, response_mask, temperature=1.0, pad_id=PAD,
                                layout="flat")
