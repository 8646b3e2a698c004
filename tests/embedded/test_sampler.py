"""The embedded engine's generating copy (``Policy.sampler``): with bf16 compute the decode loop runs a bf16 copy of
the policy, as verl's rollout serves bf16 weights, and every update is carried over to it."""

from __future__ import annotations

import torch

from recipe.embedded.policy import Policy, low_precision_copy
from tests.embedded.test_decode import EOS, PAD, qwen2


def _policy(autocast_dtype) -> Policy:
    model = qwen2(64).train()
    return Policy(
        model, tokenizer=None, eos_ids=EOS, pad_id=PAD, device=torch.device("cpu"), autocast_dtype=autocast_dtype
    )


def test_the_copy_holds_the_weights_in_bf16_and_leaves_the_policy_and_its_buffers_alone():
    model = qwen2(64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    low = low_precision_copy(model, torch.bfloat16)
    for (name, full), (_, half) in zip(model.named_parameters(), low.named_parameters(), strict=True):
        assert full.dtype == torch.float32 and half.dtype == torch.bfloat16 and not half.requires_grad, name
        assert torch.equal(half, full.detach().to(torch.bfloat16)), name  # a cast, nothing else
        assert half.data_ptr() != full.data_ptr()
    # the tied head stays tied, and the rotary frequencies (a buffer) keep their precision
    assert low.lm_head.weight is low.model.embed_tokens.weight
    assert low.model.rotary_emb.inv_freq.dtype == model.model.rotary_emb.inv_freq.dtype == torch.float32
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not low.training


def test_full_precision_samples_with_the_policy_itself():
    policy = _policy(None)
    assert policy.sampler() is policy.model
    policy.sync_sampler()  # nothing to sync
    assert policy.sampler() is policy.model


def test_an_update_reaches_the_copy_only_through_sync():
    policy = _policy(torch.bfloat16)
    sampler = policy.sampler()
    assert policy.sampler() is sampler  # built once
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.5)
    ids = torch.randint(3, 64, (2, 9))
    policy.model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    stale = [
        name
        for (name, full), half in zip(policy.model.named_parameters(), sampler.parameters())
        if not torch.equal(half, full.detach().to(torch.bfloat16))
    ]
    assert stale  # the step moved the policy; the copy has not seen it yet
    policy.sync_sampler()
    assert policy.sampler() is sampler  # synced in place, not rebuilt
    for (name, full), half in zip(policy.model.named_parameters(), sampler.parameters(), strict=True):
        assert torch.equal(half, full.detach().to(torch.bfloat16)), name
