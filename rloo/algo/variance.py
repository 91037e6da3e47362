"""Variance of policy-gradient estimators, and the one definition of "variance reduction".

Pure torch. The trainer's live diagnostic (``log_grad_variance``), ``rloo bandit`` and the
estimator study (``benchmarks/learning.py``) all measure with these functions, so their numbers
mean the same thing.

Notation: N completions in M groups (a group: the K completions of one prompt); ``x_i`` a vector
per completion, the score-function gradient ``g_i = grad_theta sum_t log pi(y_it)`` or a fixed
linear sketch ``S g_i`` of it; ``A_i`` an estimator's advantages. The estimate of the policy
gradient that group g gives is

    G_g = 1/n_g sum_{i in g} A_i x_i                                   (n_g: the group's completions)

(the REINFORCE estimate of one prompt: the loss of a ratio-1 step is ``-1/N sum_i A_i log pi(y_i)``,
so a batch's gradient is the mean of its groups' ``G_g``). The groups of a batch are independent
draws (each its own prompt and samples), so the spread of ``G_g`` over them estimates the variance
of one group's estimate, prompt-to-prompt variation included:

    Var[G] = tr Cov(G) = 1/(M-1) sum_g ||G_g - mean_h G_h||^2           (total variance)

and **variance reduction** of an estimator e is, on the same samples,

    reduction(e) = 1 - Var[G^e] / Var[G^none]                          (none: A_i = r_i, no baseline)

1 = all variance removed, 0 = none, negative = more variance than no baseline.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rloo.algo.advantages import get_advantage_estimator

# the alternatives measured beside the advantages actually used: metric name -> estimator
ALTERNATIVES: dict[str, str] = {"none": "reinforce", "group_mean": "group_mean", "rloo": "rloo", "grpo": "grpo"}
USED = "used"


def group_estimates(vectors: Tensor, advantages: Tensor, group_ids: Tensor) -> Tensor:
    """``G_g = 1/n_g sum_{i in g} A_i x_i`` for every group, ordered by group id.

    Args:
        vectors: ``(N, D)`` per-completion vectors ``x_i``. advantages: ``(N,)``. group_ids: ``(N,)``.

    Returns:
        ``(M, D)`` float64, one row per distinct group id (ascending).
    """
    if vectors.dim() != 2 or advantages.shape != (vectors.shape[0],) or group_ids.shape != advantages.shape:
        raise ValueError(
            "vectors must be (N, D) and advantages, group_ids (N,), got "
            f"{tuple(vectors.shape)}, {tuple(advantages.shape)}, {tuple(group_ids.shape)}"
        )
    unique, index = torch.unique(group_ids, return_inverse=True)
    weighted = vectors.double() * advantages.double().unsqueeze(1)
    sums = torch.zeros(unique.numel(), vectors.shape[1], dtype=torch.float64, device=vectors.device)
    sums.index_add_(0, index, weighted)
    sizes = torch.bincount(index, minlength=unique.numel()).to(torch.float64)
    return sums / sizes.unsqueeze(1)


def total_variance(estimates: Tensor) -> float:
    """``tr Cov = 1/(M-1) sum_g ||G_g - mean G||^2`` of ``(M, D)`` estimates (unbiased, ddof=1).

    Raises:
        ValueError: fewer than 2 estimates (a variance needs two).
    """
    if estimates.dim() != 2 or estimates.shape[0] < 2:
        raise ValueError(f"total_variance needs (M, D) estimates with M >= 2, got shape {tuple(estimates.shape)}")
    centered = estimates.double() - estimates.double().mean(dim=0)
    return float((centered**2).sum() / (estimates.shape[0] - 1))


def variance_reduction(variance: float, baseline_free_variance: float) -> float:
    """``1 - Var[G^e] / Var[G^none]``; NaN when ``Var[G^none]`` is 0 (no variance to reduce)."""
    if baseline_free_variance <= 0:
        return math.nan
    return 1.0 - variance / baseline_free_variance


def alternative_advantages(rewards: Tensor, group_ids: Tensor, scorable: Tensor) -> dict[str, Tensor]:
    """The advantages of each of :data:`ALTERNATIVES` from the same rewards (all group-level, so a
    process holding whole groups computes them alone). Shapes ``(N,)``."""
    return {
        name: get_advantage_estimator(estimator)(rewards, group_ids, scorable)
        for name, estimator in ALTERNATIVES.items()
    }


def variance_metrics(estimates: dict[str, Tensor]) -> dict[str, float]:
    """``grad_var/<name>`` (:func:`total_variance`) of each estimator's ``(M, D)`` group estimates,
    ``grad_var/reduction_vs_none`` (:func:`variance_reduction` of ``used`` against ``none``) and
    ``grad_var/groups`` (M: for Gaussian-like estimates the relative error is up to ``sqrt(2 / (M - 1))``)."""
    variances = {name: total_variance(values) for name, values in estimates.items()}
    metrics = {f"grad_var/{name}": value for name, value in variances.items()}
    if USED in variances and "none" in variances:
        metrics["grad_var/reduction_vs_none"] = variance_reduction(variances[USED], variances["none"])
    metrics["grad_var/groups"] = float(next(iter(estimates.values())).shape[0])
    return metrics
