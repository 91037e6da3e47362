"""Which completion tokens count: EOS, padding and truncation. Pure torch.

A completion's tokens are ``completion_ids: (N, T)``, right-padded. A token counts when it
comes at or before the first EOS; after it (padding, or anything sampled past EOS) it does
not. A completion with no EOS in its T tokens was cut at the length limit ("truncated").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def completion_mask_from_ids(completion_ids: Tensor, eos_token_ids: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Mask of the tokens up to and including the first EOS.

    ``mask_it = 1 if t <= first_eos_i`` (all T tokens when there is no EOS).

    Args:
        completion_ids: ``(N, T)`` int.
        eos_token_ids: token ids that end a completion.

    Returns:
        ``(mask (N, T) float, truncated (N,) bool)``: truncated rows have no EOS.
    """
    n, t = completion_ids.shape
    is_eos = torch.isin(completion_ids, torch.tensor(list(eos_token_ids), device=completion_ids.device))
    has_eos = is_eos.any(dim=1)
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), t - 1)
    positions = torch.arange(t, device=completion_ids.device).expand(n, t)
    mask = (positions <= first_eos.unsqueeze(1)).float()
    return mask, ~has_eos


def completion_mask_from_lengths(lengths: Tensor, t: int) -> Tensor:
    """``mask_it = 1 if t < length_i``: ``(N,) int, T -> (N, T)`` float (lengths above T count as T).

    The sampler's mask: it knows where each completion ended (EOS or a stop string), which the
    ids alone do not tell for a stop string.
    """
    positions = torch.arange(t, device=lengths.device)
    return (positions.unsqueeze(0) < lengths.unsqueeze(1)).float()


def masked_row_sum(values: Tensor, mask: Tensor) -> Tensor:
    """``sum_t m_it * v_it``: ``(N, T), (N, T) -> (N,)`` (any leading shape; sums the last dim).

    Masked positions are selected away rather than multiplied by 0, so a non-finite value
    there (padding, a log-ratio of -inf) cannot turn the sum into NaN. The one masked row
    sum of the package: KL sums, per-completion losses, penalties.
    """
    return torch.where(mask != 0, values * mask, 0.0).sum(dim=-1)


def mask_truncated(completion_mask: Tensor, truncated: Tensor) -> Tensor:
    """Zero the whole row of every truncated completion: ``(N, T), (N,) -> (N, T)``.

    Used for ``mask_truncated_completions``: a completion cut at the length limit has no
    reward signal for its ending, so it contributes no loss (DAPO's overlong filtering).
    """
    return completion_mask * (~truncated).unsqueeze(1).to(completion_mask.dtype)
