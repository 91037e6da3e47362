"""A softmax bandit with a closed-form policy gradient, to check estimators against.

Policy ``pi = softmax(theta)`` over A arms with fixed rewards ``r``. The objective
``J = sum_a pi_a r_a`` has the exact gradient ``dJ/dtheta = pi * (r - J)``. One group of K
arms ``a_1..a_K ~ pi`` gives the estimate ``g = 1/K sum_i A_i grad log pi(a_i)`` with
``grad log pi(a) = e_a - pi``, where ``A_i`` comes from an advantage estimator. The variance of
``g`` is known in closed form for no baseline and for the leave-one-out baseline
(:func:`closed_form_variance`). Used by the tests (unbiasedness, variance, variance reduction)
and by ``rloo bandit``; variances and reductions are :mod:`rloo.algo.variance`'s, as in training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.algo.advantages import get_advantage_estimator
from rloo.algo.variance import group_estimates, total_variance
from rloo.algo.variance import variance_reduction as reduction


def exact_gradient(theta: Tensor, arm_rewards: Tensor) -> Tensor:
    """``dJ/dtheta = pi * (r - sum_a pi_a r_a)``: ``(A,), (A,) -> (A,)``."""
    pi = torch.softmax(theta, dim=0)
    return pi * (arm_rewards - (pi * arm_rewards).sum())


@dataclass(frozen=True)
class BanditSamples:
    """``num_groups`` groups of K pulls, flat: ``scores (M*K, A)`` = ``e_a - pi`` of each pull,
    ``rewards (M*K,)``, ``group_ids (M*K,)``."""

    scores: Tensor
    rewards: Tensor
    group_ids: Tensor

    def estimates(self, estimator: str) -> Tensor:
        """Each group's estimate ``g`` with ``estimator``'s advantages: ``(M, A)``."""
        scorable = torch.ones_like(self.rewards, dtype=torch.bool)
        advantages = get_advantage_estimator(estimator)(self.rewards, self.group_ids, scorable)
        return group_estimates(self.scores, advantages, self.group_ids).to(self.scores.dtype)


def sample_groups(
    theta: Tensor, arm_rewards: Tensor, k: int, num_groups: int, generator: torch.Generator
) -> BanditSamples:
    """``num_groups`` independent groups of ``k`` pulls from ``softmax(theta)``."""
    pi = torch.softmax(theta, dim=0)
    arms = torch.multinomial(pi.expand(num_groups, -1), k, replacement=True, generator=generator).reshape(-1)
    scores = torch.nn.functional.one_hot(arms, theta.numel()).to(pi) - pi
    return BanditSamples(scores, arm_rewards[arms], torch.arange(num_groups).repeat_interleave(k))


def sample_gradient_estimates(
    theta: Tensor, arm_rewards: Tensor, k: int, num_groups: int, estimator: str, generator: torch.Generator
) -> Tensor:
    """``num_groups`` independent estimates ``g``, one per group of K samples: ``(M, A)``."""
    return sample_groups(theta, arm_rewards, k, num_groups, generator).estimates(estimator)


@dataclass(frozen=True)
class EstimatorStats:
    mean: Tensor  # (A,) mean estimate over groups
    stderr: Tensor  # (A,) standard error of that mean
    total_variance: float  # trace of the covariance of one group's estimate


def estimator_stats(estimates: Tensor) -> EstimatorStats:
    """Mean, standard error and total variance of ``(M, A)`` estimates."""
    m = estimates.shape[0]
    var = estimates.var(dim=0, unbiased=True)
    return EstimatorStats(estimates.mean(dim=0), (var / m).sqrt(), total_variance(estimates))


def variance_reduction(theta: Tensor, arm_rewards: Tensor, k: int, num_groups: int, seed: int = 0) -> float:
    """:func:`rloo.algo.variance.variance_reduction` of ``rloo`` against no baseline, measured on
    the same ``num_groups`` groups of K pulls."""
    samples = sample_groups(theta, arm_rewards, k, num_groups, torch.Generator().manual_seed(seed))
    return reduction(total_variance(samples.estimates("rloo")), total_variance(samples.estimates("reinforce")))


def closed_form_variance(theta: Tensor, arm_rewards: Tensor, k: int, estimator: str) -> float:
    """``Var[g] = tr Cov(g)`` of one group's estimate, exactly. With ``s_a = e_a - pi``,
    ``||s_a||^2 = 1 - 2 pi_a + ||pi||^2`` and ``grad = dJ/dtheta``:

    - ``reinforce`` (``A_i = r_i``): ``g`` is a mean of K i.i.d. terms ``r s``, so
      ``Var = 1/K (sum_a pi_a r_a^2 ||s_a||^2 - ||grad||^2)``.
    - ``rloo``: ``g = 1/(K(K-1)) sum_{i != j} phi(i, j)`` with the symmetric kernel
      ``phi = (r_i - r_j)(s_i - s_j) / 2``, a U-statistic of order 2, so (Hoeffding)
      ``Var = (2 (K-2) z1 + z2) / C(K, 2)`` with
      ``z1 = 1/4 (sum_a pi_a (r_a - J)^2 ||s_a||^2 - ||grad||^2)`` (the variance of
      ``E[phi | i] = ((r_i - J) s_i + grad) / 2``) and
      ``z2 = 1/2 sum_{a != b} pi_a pi_b (r_a - r_b)^2 - ||grad||^2`` (``||e_a - e_b||^2 = 2``).
    - ``group_mean``: ``A_i = (K-1)/K x`` the leave-one-out advantage, so ``((K-1)/K)^2 x`` its variance.
    """
    if k < 2:
        raise ValueError(f"closed_form_variance needs k >= 2 completions per group, got {k}")
    pi, r = torch.softmax(theta.double(), dim=0), arm_rewards.double()
    j, grad = (pi * r).sum(), exact_gradient(theta.double(), r)
    score_sq = 1 - 2 * pi + (pi**2).sum()
    grad_sq = (grad**2).sum()
    if estimator == "reinforce":
        return float(((pi * r**2 * score_sq).sum() - grad_sq) / k)
    if estimator in ("rloo", "group_mean"):
        z1 = ((pi * (r - j) ** 2 * score_sq).sum() - grad_sq) / 4
        z2 = 0.5 * (pi.outer(pi) * (r.unsqueeze(1) - r.unsqueeze(0)) ** 2).sum() - grad_sq
        loo = float((2 * (k - 2) * z1 + z2) / (k * (k - 1) / 2))
        return loo if estimator == "rloo" else loo * ((k - 1) / k) ** 2
    raise ValueError(f"closed_form_variance knows reinforce, rloo and group_mean, got {estimator!r}")
