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
  GRPO); see :mod:`rloo.algo.objective`.

In the loss, what matters is the estimator's *gradient*, with ``y ~ pi`` and ``log pi(y)``
differentiated (``tests/algo/test_kl.py`` checks each exactly on a categorical policy):

- k1: ``E[grad log pi] = 0``: no regularization, only noise (refused with ``kl_placement="loss"``);
- k2: ``E[(log pi - log pi_ref) grad log pi] = grad KL(pi || pi_ref)``;
- k3: ``E[(1 - pi_ref/pi) grad log pi] = grad KL(pi_ref || pi)`` (GRPO's choice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from rloo.algo.masks import masked_row_sum
from rloo.algo.registry import Registry


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


KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")
KL_ESTIMATORS.add("k1", kl_k1, "k1_t = log pi_t - log pi_ref_t")
KL_ESTIMATORS.add("k2", kl_k2, "k2_t = 1/2 (log pi_t - log pi_ref_t)^2")
KL_ESTIMATORS.add("k3", kl_k3, "k3_t = exp(log pi_ref_t - log pi_t) - (log pi_ref_t - log pi_t) - 1")


def get_kl_estimator(name: str) -> KLEstimator:
    """Look a KL estimator up by name; an unknown name lists the valid ones."""
    return KL_ESTIMATORS.get_entry(name)


@dataclass(frozen=True)
class KLPlacement:
    """Where ``beta * KL`` goes; :meth:`coefficients` splits ``beta`` between the two places."""

    in_reward: bool

    def coefficients(self, beta: float) -> tuple[float, float]:
        """``(beta in the reward, beta in the loss)``: one of them is 0."""
        return (beta, 0.0) if self.in_reward else (0.0, beta)


KL_PLACEMENTS: Registry[KLPlacement] = Registry("KL placement")
KL_PLACEMENTS.add("reward", KLPlacement(in_reward=True), "R_i = r_i - beta * sum_t KL_t, before the baseline")
KL_PLACEMENTS.add("loss", KLPlacement(in_reward=False), "S_i += beta * sum_t KL_t, with gradient")


def get_kl_placement(name: str) -> KLPlacement:
    """Look a KL placement up by name; an unknown name lists the valid ones."""
    return KL_PLACEMENTS.get_entry(name)


def sequence_kl(per_token_kl: Tensor, completion_mask: Tensor) -> Tensor:
    """``KL_i = sum_t mask_it * KL_it``: ``(N, T), (N, T) -> (N,)`` (a non-finite value at a masked
    position cannot leak into the sum, see :func:`rloo.algo.masks.masked_row_sum`)."""
    return masked_row_sum(per_token_kl, completion_mask)


def kl_penalized_rewards(rewards: Tensor, per_token_kl: Tensor, completion_mask: Tensor, beta: float) -> Tensor:
    """``R_i = r_i - beta * sum_t mask_it * KL_it``: rewards ``(N,)``, KL and mask ``(N, T)``."""
    return rewards - beta * sequence_kl(per_token_kl, completion_mask)
