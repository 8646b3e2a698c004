"""Per-token log-probabilities of responses by one full forward pass over ``[left-padded prompt | response]``.

Shared by the tiny model's supervised warm-up (``recipe.common.warmup``) and the embedded engine, where it is the
reference its shared-prompt update forward (``recipe.embedded.decode``) is held to. Log-probabilities and entropies
are taken from ``logits / temperature``, as verl's actor does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dapo.metrics import entropy_from_logits


def left_pad(sequences: Sequence[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad 1-D token tensors into ``[N, L]`` ids and attention mask."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)  # [N, L]
    mask = torch.zeros((len(sequences), width), dtype=torch.long)  # [N, L]
    for i, seq in enumerate(sequences):
        if len(seq):
            ids[i, width - len(seq) :] = seq
            mask[i, width - len(seq) :] = 1
    return ids, mask


def sequence_log_probs(
    model,
    prompts: Sequence[torch.Tensor],  # N prompts, 1-D token ids each (one per response)
    response_ids: torch.Tensor,  # [N, T]
    response_mask: torch.Tensor,  # [N, T]
    *,
    temperature: float,
    pad_id: int,
    with_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log pi(response) ``[N, T]`` (and entropy ``[N, T]``) under ``logits / temperature``.

    One forward pass over ``[left-padded prompt | response]``; position ids count real tokens only, so a row's
    result does not depend on how much padding its micro-batch needed.
    """
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)  # [N, P]
    width = prompt_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1).to(device)  # [N, P+T]
    attention = torch.cat([prompt_mask, response_mask.long()], dim=1).to(device)  # [N, P+T]
    position_ids = (attention.cumsum(dim=-1) - 1).clamp(min=0)  # [N, P+T]
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=position_ids).logits
    logits = logits[:, width - 1 : -1]  # [N, T, V] position t predicts response token t
    logits = (logits if logits.dtype == torch.float64 else logits.float()) / temperature
    log_prob = torch.gather(logits.log_softmax(dim=-1), -1, response_ids.to(device).unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits)  # [N, T]
    return log_prob, entropy
