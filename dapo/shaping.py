"""Soft overlong punishment (paper arXiv 2503.14476, Eq. 13).

With L_max the maximum response length and L_cache the punishment interval (the "overlong buffer"):

    R_length(y) = 0                                  if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                = -1                                 if |y| > L_max

added to the correctness reward. The paper's 32B run: L_max = 20480, L_cache = 4096 (16K + 4K).

Names are verl's: ``max_resp_len`` = L_max, ``overlong_buffer_len`` (verl's ``overlong_buffer_cfg.len``) =
L_cache, ``penalty_factor`` scales the penalty (1.0 in the paper). Within 0 <= |y| <= L_max this is exactly
verl 0.9.1's DAPO reward manager (``min(-(|y| - (L_max - L_cache)) / L_cache * penalty_factor, 0)``).
Deviation: beyond L_max verl keeps extrapolating linearly; we hold at ``-penalty_factor`` as Eq. 13 says.
"""

from __future__ import annotations

import torch


def validate_overlong_params(max_resp_len: int, overlong_buffer_len: int, penalty_factor: float) -> None:
    """Raise ``ValueError`` naming the key to fix when the soft-punishment parameters make no sense."""
    if max_resp_len is None or int(max_resp_len) <= 0:
        raise ValueError(
            f"max_resp_len must be a positive token count, got {max_resp_len!r}; "
            "set reward.reward_kwargs.max_resp_len (usually = data.max_response_length)"
        )
    if not 0 < int(overlong_buffer_len) <= int(max_resp_len):
        raise ValueError(
            f"overlong buffer length must be in (0, max_resp_len={max_resp_len}], got {overlong_buffer_len!r}; "
            "set reward.reward_kwargs.overlong_buffer_cfg.len (the paper: 4096 of 20480)"
        )
    if penalty_factor < 0:
        raise ValueError(
            f"penalty_factor must be >= 0, got {penalty_factor!r}; "
            "set reward.reward_kwargs.overlong_buffer_cfg.penalty_factor (the paper: 1.0)"
        )


def overlong_penalty(
    response_length: torch.Tensor,  # [N] valid response tokens (int or float)
    *,
    max_resp_len: int,
    overlong_buffer_len: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """Eq. 13's R_length per response ``[N]``, in [-penalty_factor, 0]."""
    validate_overlong_params(max_resp_len, overlong_buffer_len, penalty_factor)
    length = torch.as_tensor(response_length, dtype=torch.float32)  # [N]
    expected = float(max_resp_len - overlong_buffer_len)  # L_max - L_cache: full reward up to here
    exceed = length - expected  # [N]
    penalty = -exceed / float(overlong_buffer_len) * penalty_factor  # [N]
    return penalty.clamp(min=-float(penalty_factor), max=0.0)
