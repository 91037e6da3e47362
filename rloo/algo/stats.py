"""Statistics of a batch: entropy, clip fractions, masked means. Pure torch.

Clip fractions follow TRL: a completion (sequence-level ratio) or token (token-level
ratio) is "low-clipped" when ``rho < 1 - eps_low`` and ``A < 0``, "high-clipped" when
``rho > 1 + eps_high`` and ``A > 0`` (exactly the cases where the clip zeroes the
gradient), and "region-clipped" when either holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.algo.masks import masked_row_sum


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """``sum(v * m) / max(sum(m), 1)`` over all elements; 0-dim tensor (masked values never leak)."""
    return masked_row_sum(values, mask).sum() / mask.sum().clamp(min=1.0)


def softmax_entropy(z: Tensor, lse: Tensor | None = None) -> Tensor:
    """Entropy of ``softmax(z)``: ``H = sum_v p_v (logsumexp(z) - z_v)`` with ``p = softmax(z)``.

    ``z: (..., V) -> (...)``; ``lse: (...)`` is ``logsumexp(z)`` when the caller has it
    already. ``lse - z_v = -log p_v`` is formed first, so large logits do not cancel
    (``logsumexp(z) - sum_v p_v z_v`` loses 1e-4 in float32 at logits near 50). The one
    entropy formula of the package (metrics, the entropy bonus).
    """
    if lse is None:
        lse = torch.logsumexp(z, dim=-1)
    neg_logp = lse.unsqueeze(-1) - z
    return (torch.exp(-neg_logp) * neg_logp).sum(dim=-1)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """:func:`softmax_entropy` of ``logits: (..., V)``, in float32 at least for stability."""
    return softmax_entropy(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits)


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


def pass_at_k(successes: Tensor, k: int) -> float:
    """The unbiased pass@k of P problems with n samples each (Chen et al. 2021): ``successes: (P, n)`` bool,

        pass@k = mean_p [1 - C(n - c_p, k) / C(n, k)],   c_p = successes of problem p,

    the chance that k of the n samples, drawn without replacement, hold a success; ``1 <= k <= n``."""
    n = successes.shape[1]
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n = {n} samples per problem, got k = {k}")
    failures = n - successes.sum(dim=1).to(torch.float64)
    # C(n - c, k) / C(n, k) = prod_{i=0}^{k-1} (n - c - i) / (n - i), 0 once n - c < k
    steps = torch.arange(k, dtype=torch.float64)
    ratio = ((failures.unsqueeze(1) - steps).clamp(min=0) / (n - steps)).prod(dim=1)
    return float((1 - ratio).mean())
