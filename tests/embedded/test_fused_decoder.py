"""The fused decoder (``recipe.embedded.fused_decoder``) against the plain path (the model's own forward over a
``DynamicCache``): the same layers arranged for decoding must give the same logits, tokens and log-probs.

Two ways must agree, on randomly initialised Qwen2 (biases on q/k/v, tied head) and Llama (no biases, untied head)
models in float64 end to end, where the only difference left is summation order (fused projections, attention as
batched products over an interleaved cache): bounded by ``reorder_bound`` over the sums a logit passes through.
"""

from __future__ import annotations

import pytest
import torch

from recipe.embedded.decode import _PlainState, sample
from recipe.embedded.fused_decoder import FusedDecoder, unsupported_reason
from recipe.embedded.rollout import SamplingParams
from tests.conftest import EPS64, reorder_bound
from tests.embedded.test_decode import EOS, HIDDEN, INTERMEDIATE, LAYERS, PAD, PARAMS, prompts, qwen2, tiny_causal_lm

pytestmark = pytest.mark.numerics

DEPTH = 2 * LAYERS + 2  # attention and MLP of each layer, the embedding and the head


def llama(vocab_size: int, dtype=torch.float64):
    """A random Llama of qwen2()'s shape without biases and with an untied head (the other half of what the decoder
    fuses and references)."""
    return tiny_causal_lm("Llama", vocab_size, dtype, seed=1, tied=False)


MODELS = {"qwen2": qwen2, "llama": llama}


def _bound(magnitude: float, steps: int = 25) -> float:
    """Two summation orders of a logit: sums over the hidden size, the MLP width and up to ``steps`` attended
    positions, through DEPTH layers (log-probs move at most twice as far: log_softmax's slope)."""
    return 2 * reorder_bound(HIDDEN + INTERMEDIATE + steps, DEPTH, EPS64, 1 + magnitude)


def test_supported_architectures_and_the_reason_for_others():
    from transformers import GPT2Config, GPT2LMHeadModel

    assert unsupported_reason(qwen2(64)) is None and unsupported_reason(llama(64)) is None
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    assert "GPT2LMHeadModel is not one of LlamaForCausalLM, Qwen2ForCausalLM" in unsupported_reason(gpt2)
    with pytest.raises(ValueError, match="cannot compute this model: GPT2LMHeadModel"):
        FusedDecoder(gpt2, torch.float32)


@pytest.mark.parametrize("arch", MODELS)
def test_logits_step_by_step_equal_the_plain_path_as_rows_and_groups_leave(arch, float64_end_to_end):
    """Teacher-forced: both paths fed the same tokens and the same ``keep`` lists, compared at every step. Five
    prompts of 7 to 15 tokens (left padding), 3 responses each; one row leaves, then five, then five more (which
    compacts the cache: two groups of five remain), down to one row."""
    model = MODELS[arch](64, torch.float64)
    distinct = prompts(64)
    decoder = FusedDecoder(model, torch.float64)
    fused_logits, fused = decoder.start(distinct, 3, 12, PAD)
    plain_logits, plain = _PlainState.start(model, distinct, 3, 12, PAD, torch.device("cpu"))
    g = torch.Generator().manual_seed(4)
    keeps = [None, None, [i for i in range(15) if i != 4], None, list(range(0, 9)), [0, 1, 2, 5], None, [3], None]
    for step, keep in enumerate(keeps):
        torch.testing.assert_close(fused_logits, plain_logits, rtol=0, atol=_bound(plain_logits.abs().max().item()))
        keep = None if keep is None else torch.tensor(keep)
        rows = plain_logits.shape[0] if keep is None else len(keep)
        tokens = torch.randint(3, 64, (rows,), generator=g)
        fused_logits, plain_logits = fused.step(tokens, keep), plain.step(tokens, keep)
        if step == 4:  # 9 rows left in 4 groups of the 5: the cache keeps all 5 (4 > 5 / 2)
            assert fused.keys.shape[1] == 5
        if step == 5:  # 4 rows left in 2 groups: the cache drops the 3 empty ones
            assert fused.keys.shape[1] == 2
        if step == 7:  # one row left: its group alone
            assert fused.keys.shape[1] == 1
    torch.testing.assert_close(fused_logits, plain_logits, rtol=0, atol=_bound(plain_logits.abs().max().item()))


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "t1", "top_p", "top_k_p"])
@pytest.mark.parametrize("arch", MODELS)
def test_sampled_tokens_and_log_probs_equal_the_plain_path(arch, params, float64_end_to_end):
    """``sample`` with the fused decoder draws the same tokens from the same uniforms as with the model itself, and
    keeps the same log-probs; ``max_num_seqs=8`` decodes the 5 groups of 4 in three chunks of at most 2 groups.
    A third of the vocabulary ends a response, so that rows end at different steps and leave the batch (on a random
    model the two real end tokens would rarely come). A 151,936-token vocabulary would only slow this down: top-k
    and top-p are the same function on both paths."""
    model = MODELS[arch](64, torch.float64)
    eos = torch.arange(1, 22)
    kwargs = dict(n=4, params=params, max_new_tokens=10, eos_ids=eos, pad_id=PAD, max_num_seqs=8)
    torch.manual_seed(7)
    plain = sample(model, prompts(64), **kwargs)
    torch.manual_seed(7)
    fused = sample(FusedDecoder(model, torch.float64), prompts(64), **kwargs)
    assert torch.equal(fused[0], plain[0]) and torch.equal(fused[1], plain[1])
    assert fused[1].sum(-1).min() < 10  # some rows ended before the budget and left the batch
    torch.testing.assert_close(fused[2], plain[2], rtol=0, atol=_bound(plain[2].abs().max().item()))


def test_refresh_takes_the_updated_weights(float64_end_to_end):
    """The decoder's fused copies see an optimizer step only after ``refresh()`` (what ``Policy.sync_sampler``
    calls after each update), and then compute the updated model's logits."""
    model = qwen2(64, torch.float64).train()
    decoder = FusedDecoder(model, torch.float64)
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(8))
    model(input_ids=ids, labels=ids).loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=ids[:1]).logits[0, -1]
    bound = _bound(expected.abs().max().item())
    stale, _ = decoder.start([ids[0]], 1, 2, PAD)
    assert (stale[0] - expected).abs().max() > 1e3 * bound  # the q/k/v and gate/up copies are the old weights
    decoder.refresh()
    fresh, _ = decoder.start([ids[0]], 1, 2, PAD)
    torch.testing.assert_close(fresh[0], expected, rtol=0, atol=bound)


def test_bf16_decoder_matches_the_bf16_plain_path_to_bf16_rounding():
    """In bf16 (the real model's sampler) the two paths round differently: attention in fp32 products here, sdpa's
    kernel there; RMSNorm rounded once here, twice there. Logits of the same teacher-forced tokens stay within a
    few bf16 roundings of the logits' scale (unit roundoff 2^-8 = 3.9e-3 per op, over DEPTH layers), where a wrong
    position, head or cache slot moves them by the logits' whole spread."""
    from recipe.embedded.policy import low_precision_copy

    model = qwen2(64, torch.float32)
    low = low_precision_copy(model, torch.bfloat16)
    decoder = FusedDecoder(model, torch.bfloat16)
    distinct = prompts(64, count=3)
    fused_logits, fused = decoder.start(distinct, 2, 6, PAD)
    plain_logits, plain = _PlainState.start(low, distinct, 2, 6, PAD, torch.device("cpu"))
    g = torch.Generator().manual_seed(9)
    for _ in range(5):
        scale = plain_logits.float().abs().max().item()
        gap = (fused_logits.float() - plain_logits.float()).abs().max().item()
        assert gap <= 2**-8 * 4 * DEPTH * scale, (gap, scale)
        spread = (plain_logits.float().max(-1).values - plain_logits.float().min(-1).values).min().item()
        assert gap < spread / 4
        tokens = torch.randint(3, 64, (plain_logits.shape[0],), generator=g)
        fused_logits, plain_logits = fused.step(tokens), plain.step(tokens)


def test_the_sampler_is_the_fused_decoder_on_the_fast_path():
    """``Policy.sampler()`` is a fused decoder with ``fast_path`` (in bf16 with bf16 compute), the model itself or its
    bf16 copy without; ``sync_sampler`` refreshes the decoder in place."""
    from recipe.embedded.policy import Policy

    def policy(autocast, fast):
        return Policy(qwen2(64), None, EOS, PAD, torch.device("cpu"), autocast, fast_path=fast)

    fast = policy(None, True)
    sampler = fast.sampler()
    assert isinstance(sampler, FusedDecoder) and sampler.dtype == torch.float32 and fast.sampler() is sampler
    fast.sync_sampler()
    assert fast.sampler() is sampler
    assert policy(torch.bfloat16, True).sampler().dtype == torch.bfloat16
    plain = policy(None, False)
    assert plain.sampler() is plain.model
    assert not isinstance(policy(torch.bfloat16, False).sampler(), FusedDecoder)


def test_an_unsupported_model_samples_with_its_own_forward_and_says_why_once(caplog):
    from transformers import GPT2Config, GPT2LMHeadModel

    from recipe.embedded.policy import Policy

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    policy = Policy(gpt2, None, EOS, PAD, torch.device("cpu"), None, fast_path=True)
    with caplog.at_level("WARNING", logger="recipe.embedded.policy"):
        assert policy.sampler() is gpt2 and policy.sampler() is gpt2
    said = [r.getMessage() for r in caplog.records if "embedded.fast_path" in r.getMessage()]
    assert len(said) == 1 and "GPT2LMHeadModel is not one of LlamaForCausalLM, Qwen2ForCausalLM" in said[0], said


def test_a_greedy_response_ends_on_its_end_token_on_both_paths(float64_end_to_end):
    """The loop around either path: a response ends on (and includes) its first end token."""
    model = qwen2(64, torch.float64)
    kwargs = dict(n=2, params=SamplingParams(False, 1.0, 1.0, 0), max_new_tokens=30, eos_ids=EOS, pad_id=PAD)
    ids, mask, _ = sample(FusedDecoder(model, torch.float64), prompts(64), max_num_seqs=64, **kwargs)
    for row, m in zip(ids, mask):
        length = int(m.sum())
        ended = bool(torch.isin(row[length - 1], EOS))
        assert ended or length == 30
        assert not torch.isin(row[: length - 1], EOS).any()
