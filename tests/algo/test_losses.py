"""Tests for rloo.algo.losses: clipped surrogate, token/sequence losses, aggregation, gradients."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rloo.algo.losses import (
    AGGREGATION_MODES,
    AGGREGATIONS,
    POLICY_LOSSES,
    aggregate_loss,
    clipped_surrogate,
    count_actions,
    get_policy_loss,
    sequence_level_loss,
    token_level_loss,
)
from rloo.algo.masks import masked_row_sum

F64 = torch.float64
LEVELS = ["token", "sequence"]
T_MAX = 8  # max_completion_length for seq_mean_token_sum_norm


def t(values: list, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def close(actual: torch.Tensor, expected: list | torch.Tensor, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0.0)


def log(x: float) -> float:
    return math.log(x)


# --------------------------------------------------------------------------- hand values


def test_clipped_surrogate_hand_values() -> None:
    ratio = t([1.5, 0.5, 0.9, 1.1, 1.3, 1.25, 0.75, 1.0])
    adv = t([2.0, -1.0, 1.0, -2.0, -1.0, 1.0, 1.0, -3.0])
    out = clipped_surrogate(ratio, adv, eps_low=0.2, eps_high=0.28)
    # 1.5*2=3 vs 1.28*2=2.56 -> -2.56          ; 0.5*-1=-0.5 vs 0.8*-1=-0.8 -> 0.8
    # 0.9*1 inside -> -0.9                      ; 1.1*-2 inside -> 2.2
    # 1.3*-1=-1.3 vs 1.28*-1=-1.28 -> 1.3       ; 1.25 inside [0.8, 1.28] -> -1.25
    # 0.75*1=0.75 vs 0.8*1=0.8 -> -0.75         ; 1.0*-3 -> 3.0
    close(out, [-2.56, 0.8, -0.9, 2.2, 1.3, -1.25, -0.75, 3.0])
    # symmetric eps 0.2: 1.25 is clipped to 1.2 with A=1 -> -1.2
    assert clipped_surrogate(t([1.25]), t([1.0]), 0.2, 0.2).item() == pytest.approx(-1.2)


def test_clipped_surrogate_broadcasts() -> None:
    out = clipped_surrogate(t([[1.5, 0.9], [0.5, 1.0]]), t([[2.0], [-1.0]]), 0.2, 0.2)
    # row A=2: [-min(3, 2.4), -1.8] ; row A=-1: [-min(-0.5, -0.8), 1.0]
    close(out, [[-2.4, -1.8], [0.8, 1.0]])


# Token example: old log-probs 0, so ratio = exp(logprob). A = [2, -1], eps 0.2 / 0.28.
TOKEN_LOGP = [[log(1.5), log(0.9), log(7.0)], [log(0.5), 0.0, 0.0]]
TOKEN_MASK = [[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
TOKEN_ADV = [2.0, -1.0]
# row 0: 1.5 -> -min(3.0, 2.56) = -2.56 ; 0.9 -> -1.8 ; (7.0 masked)          S_0 = -4.36
# row 1: 0.5 -> -min(-0.5, -0.8) = 0.8                                          S_1 = 0.8
TOKEN_S = [-4.36, 0.8]


def test_token_level_loss_hand_values() -> None:
    logp = t(TOKEN_LOGP).requires_grad_(True)
    out = token_level_loss(logp, torch.zeros(2, 3, dtype=F64), t(TOKEN_ADV), t(TOKEN_MASK), 0.2, 0.28)
    close(out.sequence_loss, TOKEN_S)
    assert out.ratio.shape == (2, 3)
    close(out.ratio[0, :2], [1.5, 0.9])
    close(out.ratio[1, :1], [0.5])
    out.sequence_loss.sum().backward()
    # d/dlogp of -rho*A where unclipped: row 0 token 1: -2*0.9 = -1.8 ; clipped tokens: 0
    assert logp.grad is not None
    close(logp.grad, [[0.0, -1.8, 0.0], [0.0, 0.0, 0.0]])


# Sequence example: sum of masked log-ratios gives the ratio; eps 0.2 / 0.28.
SEQ_DIFF = [
    [log(2.0), log(0.75), 5.0],  # rho = 1.5, A=2  -> -min(3, 2.56) = -2.56, clipped
    [log(0.5), 3.0, 3.0],  # rho = 0.5, A=-1 -> 0.8, clipped
    [log(1.1), 0.0, 0.0],  # rho = 1.1, A=3  -> -3.3
    [log(1.25), 0.0, -4.0],  # rho = 1.25, A=1 -> -1.25 (inside only because eps_high=0.28)
    [log(0.75), 0.0, 0.0],  # rho = 0.75, A=1 -> -min(0.75, 0.8) = -0.75
    [log(1.3), 0.0, 0.0],  # rho = 1.3, A=-1 -> -min(-1.3, -1.28) = 1.3
]
SEQ_MASK = [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]]
SEQ_ADV = [2.0, -1.0, 3.0, 1.0, 1.0, -1.0]
SEQ_S = [-2.56, 0.8, -3.3, -1.25, -0.75, 1.3]
# dS_i/dlogp_it = -A_i rho_i m_it when unclipped, else 0
SEQ_GRAD = [
    [0.0, 0.0, 0.0],
    [0.0, 0.0, 0.0],
    [-3.3, -3.3, -3.3],
    [-1.25, -1.25, 0.0],
    [-0.75, -0.75, -0.75],
    [1.3, 0.0, 0.0],
]


def test_sequence_level_loss_hand_values() -> None:
    old = t([[-1.0, -2.0, -3.0]] * 6)
    logp = (old + t(SEQ_DIFF)).requires_grad_(True)
    out = sequence_level_loss(logp, old, t(SEQ_ADV), t(SEQ_MASK), 0.2, 0.28)
    close(out.sequence_loss, SEQ_S)
    assert out.ratio.shape == (6, 1)
    close(out.ratio[:, 0], [1.5, 0.5, 1.1, 1.25, 0.75, 1.3])
    out.sequence_loss.sum().backward()
    assert logp.grad is not None
    close(logp.grad, SEQ_GRAD)


def test_sequence_level_symmetric_clip_differs() -> None:
    # row 3 (rho 1.25, A 1) is clipped with eps_high = 0.2: S = -1.2 and no gradient
    old = torch.zeros(1, 3, dtype=F64)
    logp = t([SEQ_DIFF[3]]).requires_grad_(True)
    out = sequence_level_loss(logp, old, t([1.0]), t([SEQ_MASK[3]]), 0.2, 0.2)
    close(out.sequence_loss, [-1.2])
    out.sequence_loss.sum().backward()
    assert logp.grad is not None
    close(logp.grad, [[0.0, 0.0, 0.0]])


def test_aggregate_loss_hand_values() -> None:
    s, mask = t(TOKEN_S), t(TOKEN_MASK)  # S = [-4.36, 0.8], lengths [2, 1]
    # token_mean: (-4.36 + 0.8) / 3 = -1.1866666...
    close(aggregate_loss(s, mask, "token_mean"), -1.1866666666666668)
    # seq_mean_token_mean: (-4.36/2 + 0.8/1) / 2 = (-2.18 + 0.8) / 2 = -0.69
    close(aggregate_loss(s, mask, "seq_mean_token_mean"), -0.69)
    # seq_mean_token_sum: -3.56 / 2 = -1.78
    close(aggregate_loss(s, mask, "seq_mean_token_sum"), -1.78)
    # seq_mean_token_sum_norm: -3.56 / (2 * 8) = -0.2225
    close(aggregate_loss(s, mask, "seq_mean_token_sum_norm", max_completion_length=T_MAX), -0.2225)


def test_aggregate_loss_with_totals() -> None:
    s, mask = t(TOKEN_S), t(TOKEN_MASK)
    # token_mean: -3.56 / 10 ; seq_mean_token_mean: -1.38 / 4 ; seq_mean_token_sum: -3.56 / 4 ;
    # seq_mean_token_sum_norm: -3.56 / (4 * 8)
    close(aggregate_loss(s, mask, "token_mean", total_tokens=10.0), -0.356)
    close(aggregate_loss(s, mask, "seq_mean_token_mean", total_sequences=4.0), -0.345)
    close(aggregate_loss(s, mask, "seq_mean_token_sum", total_sequences=4.0), -0.89)
    close(
        aggregate_loss(s, mask, "seq_mean_token_sum_norm", total_sequences=4.0, max_completion_length=8),
        -0.11125,
    )
    # the totals are per kind: total_sequences does not affect token_mean, nor total_tokens the others
    close(aggregate_loss(s, mask, "token_mean", total_sequences=100.0), -1.1866666666666668)
    close(aggregate_loss(s, mask, "seq_mean_token_sum", total_tokens=100.0), -1.78)


def test_aggregate_loss_fully_masked_row() -> None:
    s = t([2.0, 0.0, 1.0])
    mask = t([[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]])
    # token_mean: 3 / 5 ; seq_mean_token_mean: (2/4 + 0/1 + 1/1) / 3 = 0.5 ; seq_mean_token_sum: 1
    close(aggregate_loss(s, mask, "token_mean"), 0.6)
    close(aggregate_loss(s, mask, "seq_mean_token_mean"), 0.5)
    close(aggregate_loss(s, mask, "seq_mean_token_sum"), 1.0)
    # nothing at all: no division by zero
    empty = torch.zeros(2, 3, dtype=F64)
    close(aggregate_loss(t([0.0, 0.0]), empty, "token_mean"), 0.0)
    close(aggregate_loss(t([0.0, 0.0]), empty, "seq_mean_token_mean"), 0.0)


def test_aggregate_loss_errors() -> None:
    s, mask = t(TOKEN_S), t(TOKEN_MASK)
    with pytest.raises(ValueError, match="max_completion_length"):
        aggregate_loss(s, mask, "seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'") as info:
        aggregate_loss(s, mask, "sum")
    for mode in AGGREGATION_MODES:
        assert mode in str(info.value)


def test_policy_loss_registry() -> None:
    assert get_policy_loss("token") is token_level_loss
    assert get_policy_loss("sequence") is sequence_level_loss
    assert set(POLICY_LOSSES) == {"token", "sequence"}
    with pytest.raises(ValueError, match=r"unknown ratio level 'word'.*sequence.*token"):
        get_policy_loss("word")


def test_masked_row_sum_hand_value_ignores_non_finite_padding() -> None:
    values = t([[0.5, 1.0, math.inf], [math.nan, 2.0, 2.0]])
    mask = t([[1, 1, 0], [0, 1, 1]])
    # 0.5 + 1.0 = 1.5 ; 2 + 2 = 4: the inf / nan under the mask never reach the sum
    close(masked_row_sum(values, mask), [1.5, 4.0])


def test_registries_reject_a_duplicate_name_and_carry_formulas() -> None:
    with pytest.raises(ValueError, match="'token' is already registered"):
        POLICY_LOSSES.add("token", token_level_loss, "again")
    with pytest.raises(ValueError, match="needs a formula"):
        AGGREGATIONS.add("new_mode", AGGREGATIONS["token_mean"], "")
    assert "new_mode" not in AGGREGATIONS
    assert AGGREGATIONS.formula("seq_mean_token_sum") == "1/N sum_i S_i"
    with pytest.raises(ValueError, match=r"unknown loss aggregation 'mean'; choose one of \['seq_mean"):
        AGGREGATIONS.formula("mean")


# --------------------------------------------------------------------------- random batches


def random_batch(seed: int, n: int = 7, t_len: int = 5, spread: float = 0.3) -> dict[str, torch.Tensor]:
    """Random float64 batch; old != new log-probs so that some actions are clipped."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t_len, generator=gen, dtype=F64) * 3
    logp = old + torch.randn(n, t_len, generator=gen, dtype=F64) * spread
    lengths = torch.randint(1, t_len + 1, (n,), generator=gen)
    lengths[n // 2] = 0  # one fully masked completion (e.g. mask_truncated)
    mask = (torch.arange(t_len).unsqueeze(0) < lengths.unsqueeze(1)).to(F64)
    adv = torch.randn(n, generator=gen, dtype=F64)
    return {"logp": logp, "old": old, "mask": mask, "adv": adv}


def loss_of(
    level: str, mode: str, logp: torch.Tensor, b: dict[str, torch.Tensor], rows: slice = slice(None), **totals: float
) -> torch.Tensor:
    out = get_policy_loss(level)(logp[rows], b["old"][rows], b["adv"][rows], b["mask"][rows], 0.2, 0.28)
    return aggregate_loss(out.sequence_loss, b["mask"][rows], mode, max_completion_length=T_MAX, **totals)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("level", LEVELS)
def test_micro_batches_add_up_to_full_batch(level: str, mode: str) -> None:
    b = random_batch(seed=1)
    full_logp = b["logp"].clone().requires_grad_(True)
    full = loss_of(level, mode, full_logp, b)
    full.backward()

    micro_logp = b["logp"].clone().requires_grad_(True)
    totals = {"total_tokens": float(b["mask"].sum()), "total_sequences": float(b["mask"].shape[0])}
    micro_sum = torch.zeros((), dtype=F64)
    for rows in (slice(0, 2), slice(2, 5), slice(5, 7)):
        micro = loss_of(level, mode, micro_logp, b, rows, **totals)
        micro.backward()  # gradient accumulation
        micro_sum = micro_sum + micro.detach()

    torch.testing.assert_close(micro_sum, full.detach(), atol=1e-12, rtol=0)
    assert full_logp.grad is not None and micro_logp.grad is not None
    assert full_logp.grad.abs().sum() > 0
    torch.testing.assert_close(micro_logp.grad, full_logp.grad, atol=1e-12, rtol=0)


def test_micro_batches_without_totals_do_not_add_up() -> None:
    # The totals matter: plain per-micro-batch means would not sum to the full-batch loss.
    b = random_batch(seed=1)
    full = loss_of("token", "token_mean", b["logp"], b)
    parts = sum(loss_of("token", "token_mean", b["logp"], b, rows) for rows in (slice(0, 2), slice(2, 7)))
    assert abs(float(parts) - float(full)) > 1e-3


def normalizer(mode: str, mask: torch.Tensor) -> torch.Tensor:
    """Per-completion D_i with loss = sum_i S_i / D_i."""
    n = mask.shape[0]
    lengths = mask.sum(dim=1)
    if mode == "token_mean":
        return lengths.sum().expand(n)
    if mode == "seq_mean_token_mean":
        return n * lengths.clamp(min=1.0)
    if mode == "seq_mean_token_sum":
        return torch.full((n,), float(n), dtype=mask.dtype)
    return torch.full((n,), float(n * T_MAX), dtype=mask.dtype)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("level", LEVELS)
def test_on_policy_gradient_is_reinforce(level: str, mode: str) -> None:
    # num_iterations = 1: old = new detached, rho = 1, and grad = -A_i m_it / D_i exactly.
    b = random_batch(seed=2)
    logp = b["logp"].clone().requires_grad_(True)
    b["old"] = logp.detach()
    loss_of(level, mode, logp, b).backward()
    expected = -b["adv"].unsqueeze(1) * b["mask"] / normalizer(mode, b["mask"]).unsqueeze(1)
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, expected, atol=1e-14, rtol=1e-12)


def test_on_policy_sequence_seq_mean_token_sum_literal() -> None:
    # N = 2: grad = -A_i m_it / 2
    logp = t([[-1.0, -2.0, -0.5], [-0.3, -4.0, -1.0]]).requires_grad_(True)
    mask = t([[1, 1, 0], [1, 1, 1]])
    out = sequence_level_loss(logp, logp.detach(), t([1.5, -0.5]), mask, 0.2, 0.28)
    loss = aggregate_loss(out.sequence_loss, mask, "seq_mean_token_sum")
    close(loss, -(1.5 - 0.5) / 2)  # rho = 1: -(A_0 + A_1) / 2 = -0.5
    loss.backward()
    assert logp.grad is not None
    close(logp.grad, [[-0.75, -0.75, 0.0], [0.25, 0.25, 0.25]], atol=1e-12)


# --------------------------------------------------------------------------- clipping gradients


def grad_of(level: str, log_ratio: list[float], adv: float, mask: list[float]) -> torch.Tensor:
    old = t([[-1.0] * len(log_ratio)])
    logp = (old + t([log_ratio])).requires_grad_(True)
    out = get_policy_loss(level)(logp, old, t([adv]), t([mask]), 0.2, 0.28)
    aggregate_loss(out.sequence_loss, t([mask]), "seq_mean_token_sum").backward()
    assert logp.grad is not None
    return logp.grad[0]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(
    ("rho", "adv", "clipped"),
    [
        (1.35, 1.0, True),  # rho > 1 + eps_high, A > 0: zero gradient
        (1.35, -1.0, False),  # A < 0: the unclipped term is the min, gradient flows
        (0.7, -1.0, True),  # rho < 1 - eps_low, A < 0: zero gradient
        (0.7, 1.0, False),  # A > 0: gradient flows
        (1.25, 1.0, False),  # above 1 + eps_low but inside 1 + eps_high (asymmetric clip)
        (0.85, -2.0, False),
        (1.0, 0.5, False),
    ],
)
def test_clip_region_gradients(level: str, rho: float, adv: float, clipped: bool) -> None:
    if level == "token":
        log_ratio, mask = [log(rho), 0.0, log(rho)], [1.0, 0.0, 1.0]
    else:  # split the sequence log-ratio over two tokens
        log_ratio, mask = [log(rho) / 2, 0.0, log(rho) / 2], [1.0, 0.0, 1.0]
    grad = grad_of(level, log_ratio, adv, mask)
    assert grad[1].item() == 0.0  # masked token
    if clipped:
        assert grad.abs().max().item() == 0.0
    else:
        # -A * rho per unmasked token (token level: each token's own ratio is rho)
        close(grad, [-adv * rho, 0.0, -adv * rho], atol=1e-12)


def test_token_level_clipping_is_per_token() -> None:
    # One completion, A = 1: token ratios 1.35 (clipped), 1.1 (inside), 0.7 (A>0: not clipped)
    grad = grad_of("token", [log(1.35), log(1.1), log(0.7)], 1.0, [1.0, 1.0, 1.0])
    close(grad, [0.0, -1.1, -0.7], atol=1e-12)
    # The same tokens at sequence level: rho = 1.35*1.1*0.7 = 1.0395, inside -> all get -rho
    grad = grad_of("sequence", [log(1.35), log(1.1), log(0.7)], 1.0, [1.0, 1.0, 1.0])
    close(grad, [-1.0395, -1.0395, -1.0395], atol=1e-12)


# --------------------------------------------------------------------------- masked positions

logprob_values = st.floats(-30.0, 0.0, allow_nan=False)
junk_values = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False)


@st.composite
def masked_batches(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    n, t_len = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    size = n * t_len

    def grid(elements: st.SearchStrategy[float]) -> torch.Tensor:
        return t(draw(st.lists(elements, min_size=size, max_size=size))).reshape(n, t_len)

    mask = t(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=size, max_size=size))).reshape(n, t_len)
    return {
        "logp": grid(logprob_values),
        "old": grid(logprob_values),
        "junk_logp": grid(junk_values),
        "junk_old": grid(junk_values),
        "mask": mask,
        "adv": t(draw(st.lists(st.floats(-3, 3), min_size=n, max_size=n))),
    }


@pytest.mark.parametrize("level", LEVELS)
@given(b=masked_batches(), mode=st.sampled_from(AGGREGATION_MODES))
def test_masked_positions_do_not_matter(level: str, b: dict[str, torch.Tensor], mode: str) -> None:
    keep = b["mask"].bool()

    def run(logp: torch.Tensor, old: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        leaf = logp.clone().requires_grad_(True)
        out = get_policy_loss(level)(leaf, old, b["adv"], b["mask"], 0.2, 0.28)
        loss = aggregate_loss(out.sequence_loss, b["mask"], mode, max_completion_length=T_MAX)
        loss.backward()
        assert leaf.grad is not None
        return loss.detach(), leaf.grad

    loss, grad = run(b["logp"], b["old"])
    loss_junk, grad_junk = run(torch.where(keep, b["logp"], b["junk_logp"]), torch.where(keep, b["old"], b["junk_old"]))
    assert torch.isfinite(loss_junk) and torch.isfinite(grad_junk).all()
    torch.testing.assert_close(loss_junk, loss, atol=0, rtol=0)
    torch.testing.assert_close(grad_junk[keep], grad[keep], atol=0, rtol=0)
    assert (grad[~keep] == 0).all() and (grad_junk[~keep] == 0).all()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("pad", [(0.0, -1e4), (0.0, -math.inf), (-math.inf, -math.inf), (math.inf, 0.0)])
def test_extreme_padding_gives_finite_loss_and_gradient(level: str, pad: tuple[float, float]) -> None:
    # Padding may hold anything (a sentinel, -inf from a masked vocabulary): no NaN may leak out.
    for dtype in (torch.float32, F64):
        logp = t([[-1.0, -2.0, pad[0]]], dtype).requires_grad_(True)
        old = t([[-1.1, -2.0, pad[1]]], dtype)
        mask = t([[1.0, 1.0, 0.0]], dtype)
        for adv in (1.0, -1.0):
            logp.grad = None
            out = get_policy_loss(level)(logp, old, t([adv], dtype), mask, 0.2, 0.2)
            loss = aggregate_loss(out.sequence_loss, mask, "token_mean")
            loss.backward()
            assert logp.grad is not None
            # rho = e^0.1 = 1.105 (sequence) or [1.105, 1] (token), inside the clip range
            expected = -adv * math.exp(0.1) if level == "sequence" else -adv * (math.exp(0.1) + 1)
            assert loss.item() == pytest.approx(expected / 2, abs=1e-6)
            assert torch.isfinite(logp.grad).all() and logp.grad[0, 2].item() == 0.0


def test_count_actions_counts_what_the_clip_fractions_are_over() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert count_actions("token", mask) == 5.0  # loss tokens
    assert count_actions("sequence", mask) == 3.0  # completions, one without loss tokens included
