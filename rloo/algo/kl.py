"""KL estimators between the policy and a frozen reference, and where the penalty goes.

Pure torch. Per-token estimators of ``KL(pi || pi_ref)`` from log-probabilities of the
*sampled* tokens (Schulman, "Approximating KL divergence", 2020), with
``log_ratio = log pi - log pi_ref``:

- ``k1 = log pi - log pi_ref`` (unbiased, can be negative; TRL's only choice),
- ``k2 = 0.5 * (log pi - log pi_ref)^2`` (biased, low variance, always >= 0),
- ``k3 = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1`` (unbiased, >= 0).

Placements:

- ``reward``: ``R_i = r_i - beta * sum_t KL_t`` before the baseline (the RLOO paper and
  TRL); the KL is computed from detached log-probs of the sampling policy.
- ``loss``: ``beta * KL_t`` is added to every token's loss with gradient (REINFORCE++,
  GRPO); see :func:`rloo.algo.losses.policy_loss`.
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch
from torch import Tensor

KLPlacement = Literal["reward", "loss"]
KL_PLACEMENTS: tuple[str, ...] = ("reward", "loss")


def kl_k1(logprobs: Tensor, reference_logprobs: Tensor) -> Tensor:
    """``k1 = log pi - log pi_ref``, elementwise, any shape."""
    return logprobs - reference_logprobs


def kl_k2(logprobs: Tensor, reference_logprobs: Tensor) -> Tensor:
    """``k2 = 0.5 * (log pi - log pi_ref)^2``, elementwise."""
    return 0.5 * (logprobs - reference_logprobs) ** 2


def kl_k3(logprobs: Tensor, reference_logprobs: Tensor) -> Tensor:
    """``k3 = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1``, elementwise."""
    delta = reference_logprobs - logprobs
    # expm1(d) - d == exp(d) - d - 1, without the cancellation that makes the latter
    # negative (and inaccurate) for d near 0, i.e. when pi is close to pi_ref.
    return torch.expm1(delta) - delta


class KLEstimator(Protocol):
    def __call__(self, logprobs: Tensor, reference_logprobs: Tensor) -> Tensor: ...


KL_ESTIMATORS: dict[str, KLEstimator] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def get_kl_estimator(name: str) -> KLEstimator:
    """Look a KL estimator up by name; an unknown name lists the valid ones."""
    try:
        return KL_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown KL estimator {name!r}; choose one of {sorted(KL_ESTIMATORS)}") from None


def sequence_kl(per_token_kl: Tensor, completion_mask: Tensor) -> Tensor:
    """``KL_i = sum_t mask_it * KL_it``: ``(N, T), (N, T) -> (N,)``.

    Masked positions are selected away rather than multiplied by 0, so a non-finite value
    there (padding) cannot turn the sum into NaN.
    """
    return torch.where(completion_mask != 0, per_token_kl * completion_mask, 0.0).sum(dim=-1)


def kl_penalized_rewards(rewards: Tensor, per_token_kl: Tensor, completion_mask: Tensor, beta: float) -> Tensor:
    """``R_i = r_i - beta * sum_t mask_it * KL_it``: rewards ``(N,)``, KL and mask ``(N, T)``."""
    return rewards - beta * sequence_kl(per_token_kl, completion_mask)
