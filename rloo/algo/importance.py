"""Off-policy corrections of the loss: the engines' importance weights and the off-policy sequence mask.

Shapes: N completions, T completion tokens; log-probs and masks ``(N, T)``, advantages ``(N,)``.

**Engine mismatch** (``use_vllm``). The tokens were drawn by another engine (vLLM), whose log-probs of
them, ``log mu_t``, differ from the trainer's for the same weights, ``log pi_old_t`` (other kernels,
other precision). The weight of a token (``token_*`` modes) or of a whole completion (``sequence_*``)

    rho_t = exp(log pi_old_t - log mu_t)          rho_i = exp(sum_t m_t (log pi_old_t - log mu_t))

multiplies its policy loss (TRL's ``vllm_importance_sampling_*``: ``*_truncate`` clamps rho to
``[C_min, C_max]``, ``*_mask`` sets a rho outside it to 0). It is computed once per generation batch,
without gradient. A sequence weight is the same for each of the completion's tokens, so both kinds
are returned per token, ``(N, T)``.

**Off-policy sequence mask** (DeepSeek-V3.2, eq. 9; TRL's ``off_policy_mask_threshold``): a completion
with a negative advantage whose mean per-token KL from the sampling policy to the current one,
``1/|o_i| sum_t (log mu_t - log pi_t)``, exceeds ``delta`` is left out of the policy loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.algo.masks import masked_row_sum

IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def engine_importance_weights(
    old_logprobs: Tensor,
    sampling_logprobs: Tensor,
    mask: Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> Tensor:
    """The engines' importance weights, ``(N, T)``, 0 where ``mask`` is 0 (see the module docstring).

    ``token_*``: ``rho_t = exp(log pi_old_t - log mu_t)``; ``sequence_*``: ``rho_i = exp(sum_t m_t (log pi_old_t -
    log mu_t))`` on each of the row's tokens. ``*_truncate``: ``clamp(rho, C_min, C_max)``; ``*_mask``:
    ``rho * 1[C_min <= rho <= C_max]``. A bound of None is no bound."""
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"unknown importance sampling mode {mode!r}: choose one of {IMPORTANCE_SAMPLING_MODES}")
    log_ratio = torch.where(mask != 0, old_logprobs.float() - sampling_logprobs.float(), 0.0)
    if mode.startswith("sequence"):
        log_ratio = masked_row_sum(log_ratio, mask).unsqueeze(1).expand_as(mask)
    ratio = torch.exp(log_ratio)
    if mode.endswith("truncate"):
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        low = clip_min if clip_min is not None else -torch.inf
        high = clip_max if clip_max is not None else torch.inf
        ratio = torch.where((ratio >= low) & (ratio <= high), ratio, 0.0)
    return ratio * (mask != 0)


@dataclass(frozen=True)
class WeightStats:
    """The weights' minimum, mean and maximum over the actions they weigh (tokens, or one per completion for
    sequence modes), and the share of those actions a ``*_mask`` mode set to 0."""

    min: float
    mean: float
    max: float
    masked_frac: float
    actions: int


def weight_stats(weights: Tensor, mask: Tensor, mode: str) -> WeightStats:
    """:class:`WeightStats` of ``weights`` (from :func:`engine_importance_weights`) over the rows' actions:
    each masked-in token (``token_*``), or each row with a token (``sequence_*``, its first token's weight)."""
    keep = mask != 0
    if mode.startswith("sequence"):
        rows = keep.any(dim=1)
        values = weights[:, 0][rows] if weights.shape[1] else weights.new_zeros(0)
    else:
        values = weights[keep]
    if values.numel() == 0:
        return WeightStats(0.0, 0.0, 0.0, 0.0, 0)
    values = values.float()
    zeroed = float((values == 0).float().mean()) if mode.endswith("mask") else 0.0
    return WeightStats(float(values.min()), float(values.mean()), float(values.max()), zeroed, values.numel())


def off_policy_sequence_mask(
    advantages: Tensor, logprobs: Tensor, sampling_logprobs: Tensor, mask: Tensor, threshold: float
) -> Tensor:
    """``(N, 1)``: 0 for a completion with ``A_i < 0`` and ``1/|o_i| sum_t m_t (log mu_t - log pi_t) > delta``,
    else 1 (``logprobs``: the current policy's, detached here; ``sampling_logprobs``: the sampling policy's)."""
    kl = torch.where(mask != 0, sampling_logprobs.float() - logprobs.detach().float(), 0.0)
    mean_kl = masked_row_sum(kl, mask) / mask.sum(dim=1).clamp(min=1.0)
    keep = (advantages >= 0) | (mean_kl <= threshold)
    return keep.to(mask.dtype if mask.is_floating_point() else torch.float32).unsqueeze(1)
