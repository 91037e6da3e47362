"""Metric helpers: entropy, clip fractions, masked means. Pure torch.

Clip fractions follow TRL: a completion (sequence-level ratio) or token (token-level
ratio) is "low-clipped" when ``rho < 1 - eps_low`` and ``A < 0``, "high-clipped" when
``rho > 1 + eps_high`` and ``A > 0`` (exactly the cases where the clip zeroes the
gradient), and "region-clipped" when either holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """``sum(v * m) / max(sum(m), 1)`` over all elements; 0-dim tensor."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax distribution: ``H = logsumexp(z) - sum_v softmax(z)_v z_v``.

    ``logits: (..., V) -> (...)``. Computed in float32 at least for stability.
    """
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    probs = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (probs * z).sum(dim=-1)


@dataclass(frozen=True)
class ClipFractions:
    """Fractions of actions clipped below, above, and either (floats in [0, 1])."""

    low: float
    high: float
    region: float


def clip_fractions(
    ratio: Tensor, advantages: Tensor, action_mask: Tensor, eps_low: float, eps_high: float
) -> ClipFractions:
    """Fractions of actions whose clipped-surrogate gradient is zero.

    Args:
        ratio: ``(N, T)`` token-level or ``(N, 1)`` sequence-level importance ratios.
        advantages: ``(N,)``.
        action_mask: same shape as ``ratio``: which actions count (completion mask for
            tokens; for sequences, 1 where the completion has at least one token).
    """
    adv = advantages.unsqueeze(1)
    low = ((ratio < 1.0 - eps_low) & (adv < 0)).to(action_mask.dtype)
    high = ((ratio > 1.0 + eps_high) & (adv > 0)).to(action_mask.dtype)
    return ClipFractions(
        low=float(masked_mean(low, action_mask)),
        high=float(masked_mean(high, action_mask)),
        region=float(masked_mean(torch.clamp(low + high, max=1.0), action_mask)),
    )
