"""Group-relative advantages (GRPO outcome advantage, used unchanged by DAPO).

Paper (arXiv 2503.14476, Eq. 9): for the G responses of one prompt with rewards R_1..R_G,

    A_{i,t} = (R_i - mean({R_j})) / std({R_j})

for every token t of response i. As in verl 0.9.1's ``compute_grpo_outcome_advantage``:

1. the std is the unbiased one (``torch.std``), and ``eps = 1e-6`` is added to it, so a constant group
   gets advantage 0 instead of NaN;
2. a singleton group (G = 1) gets mean 0 and std 1, so its advantage is its raw reward;
3. ``norm_adv_by_std_in_grpo=False`` skips the division (Dr. GRPO's variant).

Unlike verl, groups are the rows of a ``[B, G]`` view: the G responses of a prompt are contiguous in the
batch, which both engines guarantee (they repeat each prompt G times in place, as verl's ``repeat(interleave=True)``).
"""

from __future__ import annotations

import torch


def group_advantages(
    scores: torch.Tensor,  # [B*G] one scalar reward per response
    group_size: int,
    *,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """Per-response advantages ``[B*G]`` from per-response rewards, groups contiguous."""
    if group_size < 1 or scores.numel() % group_size != 0:
        raise ValueError(
            f"{scores.numel()} responses do not split into groups of {group_size}; "
            "the batch must hold actor_rollout_ref.rollout.n responses per prompt, contiguous"
        )
    grouped = scores.reshape(-1, group_size).to(torch.float32)  # [B, G]
    if group_size == 1:
        mean = torch.zeros_like(grouped)  # [B, 1]
        std = torch.ones_like(grouped)  # [B, 1]
    else:
        mean = grouped.mean(dim=1, keepdim=True)  # [B, 1]
        std = grouped.std(dim=1, keepdim=True)  # [B, 1] unbiased
    centred = grouped - mean  # [B, G]
    adv = centred / (std + epsilon) if norm_adv_by_std_in_grpo else centred
    return adv.reshape(-1)  # [B*G]


def token_advantages(
    token_level_rewards: torch.Tensor,  # [B*G, T] the outcome reward sits on one token, zeros elsewhere
    response_mask: torch.Tensor,  # [B*G, T]
    group_size: int,
    *,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> torch.Tensor:
    """Outcome advantages broadcast over each response's valid tokens ``[B*G, T]`` (verl's return layout)."""
    scores = token_level_rewards.sum(dim=-1)  # [B*G]
    adv = group_advantages(scores, group_size, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, epsilon=epsilon)
    return adv.unsqueeze(-1) * response_mask.to(adv.dtype)  # [B*G, T]
