"""A softmax bandit with a closed-form policy gradient, to check estimators against.

Policy ``pi = softmax(theta)`` over A arms with fixed rewards ``r``. The objective
``J = sum_a pi_a r_a`` has the exact gradient ``dJ/dtheta = pi * (r - J)``. One group of K
arms ``a_1..a_K ~ pi`` gives the estimate ``g = 1/K sum_i A_i grad log pi(a_i)`` with
``grad log pi(a) = e_a - pi``, where ``A_i`` comes from an advantage estimator. Used by the
tests (unbiasedness, variance reduction) and by ``rloo bandit``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.algo.advantages import get_advantage_estimator


def exact_gradient(theta: Tensor, arm_rewards: Tensor) -> Tensor:
    """``dJ/dtheta = pi * (r - sum_a pi_a r_a)``: ``(A,), (A,) -> (A,)``."""
    pi = torch.softmax(theta, dim=0)
    return pi * (arm_rewards - (pi * arm_rewards).sum())


def sample_gradient_estimates(
    theta: Tensor, arm_rewards: Tensor, k: int, num_groups: int, estimator: str, generator: torch.Generator
) -> Tensor:
    """``num_groups`` independent estimates ``g``, one per group of K samples: ``(M, A)``."""
    pi = torch.softmax(theta, dim=0)
    arms = torch.multinomial(pi.expand(num_groups, -1), k, replacement=True, generator=generator)  # (M, K)
    rewards = arm_rewards[arms].reshape(-1)
    group_ids = torch.arange(num_groups).repeat_interleave(k)
    scorable = torch.ones_like(rewards, dtype=torch.bool)
    advantages = get_advantage_estimator(estimator)(rewards, group_ids, scorable).reshape(num_groups, k)
    score = torch.nn.functional.one_hot(arms, theta.numel()).to(pi) - pi  # (M, K, A)
    return (advantages.unsqueeze(-1) * score).mean(dim=1)


@dataclass(frozen=True)
class EstimatorStats:
    mean: Tensor  # (A,) mean estimate over groups
    stderr: Tensor  # (A,) standard error of that mean
    total_variance: float  # trace of the covariance of one group's estimate


def estimator_stats(estimates: Tensor) -> EstimatorStats:
    """Mean, standard error and total variance of ``(M, A)`` estimates."""
    m = estimates.shape[0]
    var = estimates.var(dim=0, unbiased=True)
    return EstimatorStats(estimates.mean(dim=0), (var / m).sqrt(), float(var.sum()))


def variance_reduction(theta: Tensor, arm_rewards: Tensor, k: int, num_groups: int, seed: int = 0) -> float:
    """``1 - Var[g_rloo] / Var[g_reinforce]`` (total variance), same K and sample count."""
    gen = torch.Generator().manual_seed(seed)
    loo = estimator_stats(sample_gradient_estimates(theta, arm_rewards, k, num_groups, "rloo", gen))
    plain = estimator_stats(sample_gradient_estimates(theta, arm_rewards, k, num_groups, "reinforce", gen))
    return 1.0 - loo.total_variance / plain.total_variance
