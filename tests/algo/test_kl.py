"""Tests for rloo.algo.kl: the k1/k2/k3 estimators and the KL-in-reward penalty."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rloo.algo.kl import (
    KL_ESTIMATORS,
    get_kl_estimator,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_penalized_rewards,
    sequence_kl,
)

LOG2 = 0.6931471805599453


def t(values: list, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def test_hand_values() -> None:
    # pi = 0.5, pi_ref = 0.25: log ratio = log 2.
    # k1 = log 2 ; k2 = (log 2)^2 / 2 = 0.2402265069591007 ;
    # k3 = pi_ref/pi - 1 - log(pi_ref/pi) = 0.5 - 1 + log 2 = 0.1931471805599453
    # pi = 0.25, pi_ref = 0.5: log ratio = -log 2.
    # k1 = -log 2 ; k2 = 0.2402265069591007 ; k3 = 2 - 1 - log 2 = 0.3068528194400547
    # pi = pi_ref: all zero.
    logp = t([math.log(0.5), math.log(0.25), math.log(0.3)])
    ref = t([math.log(0.25), math.log(0.5), math.log(0.3)])
    torch.testing.assert_close(kl_k1(logp, ref), t([LOG2, -LOG2, 0.0]), atol=1e-12, rtol=0)
    torch.testing.assert_close(kl_k2(logp, ref), t([0.2402265069591007, 0.2402265069591007, 0.0]), atol=1e-12, rtol=0)
    torch.testing.assert_close(kl_k3(logp, ref), t([0.1931471805599453, 0.3068528194400547, 0.0]), atol=1e-12, rtol=0)


def test_hand_values_float32_and_shape() -> None:
    logp = t([[-1.0, -2.0], [-3.0, -0.5]], torch.float32)
    ref = t([[-2.0, -2.0], [-1.0, -0.5]], torch.float32)
    # log ratios [[1, 0], [-2, 0]]; k3 with d = ref - logp = [[-1, 0], [2, 0]]:
    # e^-1 - (-1) - 1 = 0.36787944117144233 ; e^2 - 2 - 1 = 4.38905609893065
    k3 = kl_k3(logp, ref)
    assert k3.shape == (2, 2) and k3.dtype == torch.float32
    torch.testing.assert_close(k3, t([[0.36787944117144233, 0.0], [4.38905609893065, 0.0]], torch.float32))
    torch.testing.assert_close(kl_k2(logp, ref), t([[0.5, 0.0], [2.0, 0.0]], torch.float32))


def test_k3_accurate_near_zero() -> None:
    # k3(d) = d^2/2 + O(d^3) for d = log pi_ref - log pi near 0, and it must not go negative.
    d = t([1e-9, -1e-9, 1e-6, -1e-6, 1e-4], torch.float64)
    k3 = kl_k3(torch.zeros_like(d), d)
    torch.testing.assert_close(k3, d**2 / 2 + d**3 / 6, rtol=1e-6, atol=0)
    d32 = t([1e-4, -1e-4, 3e-3, -3e-3], torch.float32)
    k3_32 = kl_k3(torch.zeros_like(d32), d32)
    assert (k3_32 > 0).all()
    # float32: expm1(d) carries ~1 ulp of d (~7e-12 at d=1e-4) against k3 ~ 5e-9.
    torch.testing.assert_close(k3_32, d32**2 / 2 + d32**3 / 6, rtol=5e-3, atol=0)


finite = st.floats(-30.0, 0.0, allow_nan=False, allow_infinity=False)


@given(
    logp=st.lists(finite, min_size=1, max_size=20),
    ref=st.lists(finite, min_size=20, max_size=20),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_k2_and_k3_nonnegative(logp: list[float], ref: list[float], dtype: torch.dtype) -> None:
    lp, rf = t(logp, dtype), t(ref[: len(logp)], dtype)
    assert (kl_k2(lp, rf) >= 0).all()
    assert (kl_k3(lp, rf) >= 0).all()


@given(
    logp=st.floats(-20, 0),
    scale=st.sampled_from([1e-8, 1e-6, 1e-4, 1e-3]),
    seed=st.integers(0, 2**16),
)
def test_k3_nonnegative_when_close(logp: float, scale: float, seed: int) -> None:
    # Policy close to the reference: the regime where exp(d) - d - 1 cancels badly.
    gen = torch.Generator().manual_seed(seed)
    delta = torch.randn(1000, generator=gen, dtype=torch.float64) * scale
    for dtype in (torch.float32, torch.float64):
        lp = torch.full((1000,), logp, dtype=dtype)
        assert (kl_k3(lp, lp + delta.to(dtype)) >= 0.0).all()


def exact_kl(p: torch.Tensor, q: torch.Tensor) -> float:
    return float((p * (p / q).log()).sum())


def expectation(estimator: str, p: torch.Tensor, q: torch.Tensor) -> float:
    """E_{x~p}[k(x)] = sum_x p(x) k(log p(x), log q(x)), exactly (no sampling)."""
    return float((p * get_kl_estimator(estimator)(p.log(), q.log())).sum())


def test_unbiased_on_small_categorical() -> None:
    p = t([0.5, 0.3, 0.2])
    q = t([0.2, 0.2, 0.6])
    # KL(p||q) = 0.5 ln 2.5 + 0.3 ln 1.5 + 0.2 ln(1/3)
    #          = 0.5 * 0.9162907 + 0.3 * 0.4054651 - 0.2 * 1.0986123 = 0.3600624
    kl = 0.5 * math.log(2.5) + 0.3 * math.log(1.5) + 0.2 * math.log(0.2 / 0.6)
    assert kl == pytest.approx(0.36006244063590487, abs=1e-12)
    assert expectation("k1", p, q) == pytest.approx(kl, abs=1e-12)
    assert expectation("k3", p, q) == pytest.approx(kl, abs=1e-12)
    # k2 is biased: its expectation differs (so the check above can fail).
    assert abs(expectation("k2", p, q) - kl) > 1e-3  # 0.35525 vs 0.36006


@st.composite
def categorical(draw: st.DrawFn, size: int) -> torch.Tensor:
    weights = draw(st.lists(st.floats(0.05, 1.0), min_size=size, max_size=size))
    w = t(weights)
    return w / w.sum()


@given(data=st.data(), size=st.integers(2, 8))
def test_k1_k3_unbiased_property(data: st.DataObject, size: int) -> None:
    p = data.draw(categorical(size))
    q = data.draw(categorical(size))
    kl = exact_kl(p, q)
    assert expectation("k1", p, q) == pytest.approx(kl, abs=1e-10)
    assert expectation("k3", p, q) == pytest.approx(kl, abs=1e-10)


def test_registry_and_unknown_estimator() -> None:
    assert {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3} == KL_ESTIMATORS
    for name, fn in KL_ESTIMATORS.items():
        assert get_kl_estimator(name) is fn
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'") as info:
        get_kl_estimator("k4")
    for name in ("'k1'", "'k2'", "'k3'"):
        assert name in str(info.value)


def test_sequence_kl_with_mask() -> None:
    per_token = t([[0.1, 0.2, 0.3, 5.0], [1.0, -0.5, 7.0, 7.0], [9.0, 9.0, 9.0, 9.0]])
    mask = t([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    # 0.1 + 0.2 + 0.3 = 0.6 ; 1.0 - 0.5 = 0.5 ; nothing -> 0
    torch.testing.assert_close(sequence_kl(per_token, mask), t([0.6, 0.5, 0.0]), atol=1e-12, rtol=0)


def test_kl_penalized_rewards_hand_value() -> None:
    rewards = t([1.0, 2.0, -1.0])
    per_token = t([[0.1, 0.2, 0.3, 5.0], [1.0, -0.5, 7.0, 7.0], [9.0, 9.0, 9.0, 9.0]])
    mask = t([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    # R = r - 0.5 * [0.6, 0.5, 0] = [0.7, 1.75, -1.0]
    out = kl_penalized_rewards(rewards, per_token, mask, beta=0.5)
    torch.testing.assert_close(out, t([0.7, 1.75, -1.0]), atol=1e-12, rtol=0)
    # beta = 0 leaves the rewards alone
    torch.testing.assert_close(kl_penalized_rewards(rewards, per_token, mask, beta=0.0), rewards)


def test_kl_penalized_rewards_from_logprobs() -> None:
    # k1 from log-probs, masked sum, then penalty: one sequence of 3 tokens (last is padding).
    logp = t([[-1.0, -2.0, -3.0]])
    ref = t([[-1.5, -1.0, -9.0]])
    mask = t([[1.0, 1.0, 0.0]])
    # k1 = [0.5, -1.0, (6.0 masked)] -> KL = -0.5 ; R = 2 - 0.1 * (-0.5) = 2.05
    out = kl_penalized_rewards(t([2.0]), kl_k1(logp, ref), mask, beta=0.1)
    torch.testing.assert_close(out, t([2.05]), atol=1e-12, rtol=0)


def _expected_loss_gradient(estimator: str, logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """E_{y ~ pi}[grad_theta KL_est(y)] exactly, over every outcome y of a categorical policy
    pi = softmax(theta): what the estimator contributes to the gradient when it is in the loss."""
    theta = logits.clone().requires_grad_(True)
    logp, ref = torch.log_softmax(theta, -1), torch.log_softmax(ref_logits, -1)
    per_outcome = KL_ESTIMATORS.get_entry(estimator)(logp, ref)
    (gradient,) = torch.autograd.grad((logp.exp().detach() * per_outcome).sum(), theta)
    return gradient


def _kl_gradient(logits: torch.Tensor, ref_logits: torch.Tensor, reverse: bool) -> torch.Tensor:
    theta = logits.clone().requires_grad_(True)
    logp, ref = torch.log_softmax(theta, -1), torch.log_softmax(ref_logits, -1)
    kl = (logp.exp() * (logp - ref)).sum() if not reverse else (ref.exp() * (ref - logp)).sum()
    (gradient,) = torch.autograd.grad(kl, theta)
    return gradient


def test_each_estimators_gradient_in_the_loss() -> None:
    # the module docstring's claims: in the loss (samples from pi, log pi differentiated), k1's
    # expected gradient is 0, k2's is grad KL(pi || pi_ref), k3's is grad KL(pi_ref || pi)
    torch.manual_seed(0)
    logits, ref_logits = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    zero = torch.zeros(6, dtype=torch.float64)
    torch.testing.assert_close(_expected_loss_gradient("k1", logits, ref_logits), zero)
    torch.testing.assert_close(
        _expected_loss_gradient("k2", logits, ref_logits), _kl_gradient(logits, ref_logits, reverse=False)
    )
    torch.testing.assert_close(
        _expected_loss_gradient("k3", logits, ref_logits), _kl_gradient(logits, ref_logits, reverse=True)
    )
