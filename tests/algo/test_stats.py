"""Tests for rloo.algo.stats: masked mean, entropy, clip fractions."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rloo.algo.losses import get_policy_loss
from rloo.algo.stats import ClipFractions, clip_fractions, entropy_from_logits, masked_mean


def t(values: list, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def test_masked_mean() -> None:
    values = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    # (1 + 2 + 4) / 3
    assert masked_mean(values, t([[1, 1, 0], [1, 0, 0]])).item() == pytest.approx(7 / 3, abs=1e-12)
    assert masked_mean(values, torch.ones(2, 3, dtype=torch.float64)).item() == pytest.approx(3.5, abs=1e-12)
    # empty mask: 0 rather than NaN
    assert masked_mean(values, torch.zeros(2, 3, dtype=torch.float64)).item() == 0.0
    assert masked_mean(values, t([[1, 1, 0], [1, 0, 0]])).dim() == 0


def test_entropy_uniform_is_log_v() -> None:
    for v in (2, 7, 1000):
        logits = torch.zeros(3, v, dtype=torch.float64)
        logits[1] += 12.5  # a constant shift changes nothing
        # log 2 = 0.693147..., log 7 = 1.945910..., log 1000 = 6.907755...
        torch.testing.assert_close(entropy_from_logits(logits), torch.full((3,), math.log(v), dtype=torch.float64))
    assert entropy_from_logits(torch.zeros(5)).item() == pytest.approx(1.6094379124341003, abs=1e-6)  # log 5


def test_entropy_one_hot_is_zero() -> None:
    logits = t([[60.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1.0, 80.0]], torch.float32)
    h = entropy_from_logits(logits)
    assert h.shape == (2,)
    assert (h.abs() < 1e-6).all()
    # two equally likely tokens, the others negligible: log 2
    h2 = entropy_from_logits(t([50.0, 50.0, 0.0, 0.0], torch.float32))
    assert h2.item() == pytest.approx(math.log(2), abs=1e-5)


@given(
    logits=st.lists(st.floats(-20, 20), min_size=2, max_size=12),
    scale=st.floats(0.1, 3.0),
)
def test_entropy_matches_definition(logits: list[float], scale: float) -> None:
    z = t(logits) * scale
    p = torch.softmax(z, dim=-1)
    expected = -(p * torch.log_softmax(z, dim=-1)).sum()
    assert entropy_from_logits(z).item() == pytest.approx(expected.item(), abs=1e-9)
    assert 0.0 - 1e-9 <= entropy_from_logits(z).item() <= math.log(len(logits)) + 1e-9


def test_entropy_shapes_and_low_precision() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=gen)
    h = entropy_from_logits(logits)
    assert h.shape == (2, 3)
    expected = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(h, expected, atol=1e-5, rtol=1e-5)
    h16 = entropy_from_logits(logits.to(torch.bfloat16))
    assert h16.dtype == torch.float32
    torch.testing.assert_close(h16, expected, atol=5e-2, rtol=0)


def test_clip_fractions_sequence_level() -> None:
    ratio = t([[1.5], [0.5], [0.7], [1.1], [1.3]])
    adv = t([1.0, -1.0, 1.0, -2.0, 5.0])
    action_mask = t([[1.0], [1.0], [1.0], [1.0], [0.0]])
    # eps 0.2 / 0.28 over the 4 counted completions:
    # 1.5 & A>0 -> high ; 0.5 & A<0 -> low ; 0.7 but A>0 -> none ; 1.1 -> none ; 1.3 & A>0 masked out
    fr = clip_fractions(ratio, adv, action_mask, 0.2, 0.28)
    assert fr == ClipFractions(low=0.25, high=0.25, region=0.5)


def test_clip_fractions_token_level() -> None:
    ratio = t([[1.5, 0.5, 1.0], [0.7, 1.3, 2.0]])
    adv = t([1.0, -1.0])
    mask = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # row A>0: 1.5 high ; 0.5 (A>0 -> not low) ; 1.0 none
    # row A<0: 0.7 low ; 1.3 (A<0 -> not high) ; 2.0 masked.   5 tokens.
    fr = clip_fractions(ratio, adv, mask, 0.2, 0.28)
    assert fr.low == pytest.approx(0.2) and fr.high == pytest.approx(0.2) and fr.region == pytest.approx(0.4)
    # eps_high 0.2 does not change 1.3 (A<0); eps_high 0.6 unclips 1.5
    assert clip_fractions(ratio, adv, mask, 0.2, 0.6) == ClipFractions(low=0.2, high=0.0, region=0.2)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_clip_fractions_mark_zero_gradient_actions(level: str) -> None:
    # "clipped" means exactly: the surrogate's gradient w.r.t. the action's log-prob is 0.
    gen = torch.Generator().manual_seed(3)
    n, t_len = 64, 3
    old = -torch.rand(n, t_len, generator=gen, dtype=torch.float64)
    logp = (old + torch.randn(n, t_len, generator=gen, dtype=torch.float64) * 0.3).requires_grad_(True)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    mask = torch.ones(n, t_len, dtype=torch.float64)
    out = get_policy_loss(level)(logp, old, adv, mask, 0.2, 0.28)
    out.sequence_loss.sum().backward()
    assert logp.grad is not None
    zero = (logp.grad == 0).all(dim=1, keepdim=True) if level == "sequence" else logp.grad == 0
    action_mask = torch.ones_like(out.ratio)
    fr = clip_fractions(out.ratio.detach(), adv, action_mask, 0.2, 0.28)
    assert 0.0 < fr.region < 1.0
    assert fr.region == pytest.approx(zero.double().mean().item(), abs=1e-12)
