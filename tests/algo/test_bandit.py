"""Monte Carlo checks of the policy-gradient estimators on the softmax bandit (rloo.algo.bandit).

Statistics: with M independent groups, the mean estimate of each gradient component is
approximately normal (CLT) with standard error SE = sd / sqrt(M). An unbiased estimator
lands within z * SE of the exact gradient in every one of the A components with
probability >= 1 - A * P(|Z| > z) (Bonferroni over the A components, two-sided normal
tail). With z = 4.5, P(|Z| > 4.5) = 6.8e-6, so for A = 5 arms a correct estimator fails
with probability below 3.4e-5 (and the seed is fixed, so the outcome is reproducible).
"""

from __future__ import annotations

import pytest
import torch

from rloo.algo.bandit import (
    estimator_stats,
    exact_gradient,
    sample_gradient_estimates,
    variance_reduction,
)

Z = 4.5
NUM_GROUPS = 50_000
K = 4
THETA = torch.tensor([0.5, -0.2, 0.1, -0.8, 0.3], dtype=torch.float64)
# All rewards positive (offset 2): without a baseline every sample pushes its own arm up,
# which is what makes plain REINFORCE noisy.
ARM_REWARDS = torch.tensor([3.0, 5.0, 4.0, 7.0, 2.0], dtype=torch.float64)


def z_scores(estimator: str, seed: int, k: int = K, scale: float = 1.0) -> torch.Tensor:
    """(mean estimate - scale * exact gradient) / standard error, per component."""
    gen = torch.Generator().manual_seed(seed)
    stats = estimator_stats(sample_gradient_estimates(THETA, ARM_REWARDS, k, NUM_GROUPS, estimator, gen))
    return (stats.mean - scale * exact_gradient(THETA, ARM_REWARDS)) / stats.stderr


def test_exact_gradient_matches_autograd() -> None:
    theta = THETA.clone().requires_grad_(True)
    objective = (torch.softmax(theta, dim=0) * ARM_REWARDS).sum()
    (grad,) = torch.autograd.grad(objective, theta)
    torch.testing.assert_close(exact_gradient(THETA, ARM_REWARDS), grad, atol=1e-12, rtol=0)
    # and it is not trivially small: the test below compares against a real signal
    assert grad.abs().min() > 0.05


@pytest.mark.parametrize("estimator", ["rloo", "reinforce"])
def test_estimator_is_unbiased(estimator: str) -> None:
    z = z_scores(estimator, seed=0)
    assert z.abs().max() < Z, f"{estimator}: z-scores {z.tolist()}"


def test_rloo_unbiased_at_k2() -> None:
    z = z_scores("rloo", seed=1, k=2)
    assert z.abs().max() < Z, f"z-scores {z.tolist()}"


def test_biased_estimator_is_detected() -> None:
    # The test above has power: including r_i in its own baseline (group_mean) scales the
    # gradient by (K-1)/K = 0.75, which the same check flags by a wide margin ...
    assert z_scores("group_mean", seed=0).abs().max() > 10 * Z
    # ... and the estimate is indeed 0.75 * the exact gradient.
    assert z_scores("group_mean", seed=0, scale=(K - 1) / K).abs().max() < Z


def test_rloo_reduces_variance() -> None:
    gen = torch.Generator().manual_seed(2)
    loo = estimator_stats(sample_gradient_estimates(THETA, ARM_REWARDS, K, NUM_GROUPS, "rloo", gen))
    plain = estimator_stats(sample_gradient_estimates(THETA, ARM_REWARDS, K, NUM_GROUPS, "reinforce", gen))
    reduction = 1.0 - loo.total_variance / plain.total_variance
    print(
        f"\nbandit K={K}: total variance rloo {loo.total_variance:.4f}, "
        f"reinforce {plain.total_variance:.4f}, reduction {reduction:.3f}"
    )
    assert reduction > 0.5
    # the library helper agrees (same sampling scheme, different seed)
    helper = variance_reduction(THETA, ARM_REWARDS, K, NUM_GROUPS, seed=3)
    assert helper == pytest.approx(reduction, abs=0.05)
    for k in (2, 8):
        print(f"bandit K={k}: variance reduction {variance_reduction(THETA, ARM_REWARDS, k, NUM_GROUPS):.3f}")
