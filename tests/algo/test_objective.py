"""rloo.algo.objective against hand-computed values: KL in the loss, entropy bonus, every
aggregation mode with whole-step totals, and passes that add up to the whole step."""

from __future__ import annotations

import math

import pytest
import torch

from rloo.algo.objective import ObjectiveInputs, ObjectiveOutput, ObjectiveSettings, policy_objective

F64 = torch.float64
RHO = math.exp(0.1)  # old log-probs are the current ones - 0.1: ratio e^0.1, inside the clip range
# two completions, T = 3; the last token of row 1 is padding (values there must not count)
LOGPROBS = [[-1.0, -2.0, -0.5], [-0.3, -1.2, 0.0]]
REFERENCE = [[-1.5, -2.0, -1.0], [-0.3, -0.7, 9.0]]  # k1 = [[0.5, 0, 0.5], [0, -0.5, pad]]
ENTROPY = [[0.4, 0.6, 0.8], [1.0, 0.2, 5.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
ADVANTAGES = [1.0, -2.0]
KL_COEF, ENTROPY_COEF = 0.1, 0.05
# S_i = sum_t -rho * A_i + KL_COEF * sum_t k1_t - ENTROPY_COEF * sum_t H_t
S0 = 3 * (-RHO * 1.0) + KL_COEF * 1.0 - ENTROPY_COEF * 1.8
S1 = 2 * (-RHO * -2.0) + KL_COEF * -0.5 - ENTROPY_COEF * 1.2
TOTAL_TOKENS, TOTAL_SEQUENCES, T_MAX = 10.0, 4.0, 8  # this pass is part of a larger optimizer step
EXPECTED = {
    "token_mean": (S0 + S1) / TOTAL_TOKENS,
    "seq_mean_token_mean": (S0 / 3 + S1 / 2) / TOTAL_SEQUENCES,
    "seq_mean_token_sum": (S0 + S1) / TOTAL_SEQUENCES,
    "seq_mean_token_sum_norm": (S0 + S1) / (TOTAL_SEQUENCES * T_MAX),
}


def inputs(rows: slice = slice(None)) -> ObjectiveInputs:
    logprobs = torch.tensor(LOGPROBS, dtype=F64)[rows]
    return ObjectiveInputs(
        logprobs=logprobs,
        old_logprobs=logprobs - 0.1,
        reference_logprobs=torch.tensor(REFERENCE, dtype=F64)[rows],
        advantages=torch.tensor(ADVANTAGES, dtype=F64)[rows],
        loss_mask=torch.tensor(MASK, dtype=F64)[rows],
        entropy=torch.tensor(ENTROPY, dtype=F64)[rows],
    )


def objective(
    x: ObjectiveInputs,
    aggregation: str = "token_mean",
    eps: float = 0.2,
    kl_coef: float = KL_COEF,
    entropy_coef: float = ENTROPY_COEF,
) -> ObjectiveOutput:
    settings = ObjectiveSettings(
        ratio_level="token",
        eps_low=eps,
        eps_high=eps,
        aggregation=aggregation,
        max_completion_length=T_MAX,
        kl_estimator="k1",
        kl_coef=kl_coef,
        entropy_coef=entropy_coef,
    )
    return policy_objective(x, settings, total_tokens=TOTAL_TOKENS, total_sequences=TOTAL_SEQUENCES)


@pytest.mark.parametrize("aggregation", list(EXPECTED))
def test_kl_in_the_loss_and_entropy_bonus_hand_values(aggregation: str) -> None:
    assert objective(inputs(), aggregation).loss.item() == pytest.approx(EXPECTED[aggregation], rel=1e-12)


@pytest.mark.parametrize("aggregation", list(EXPECTED))
def test_passes_with_whole_step_totals_add_up(aggregation: str) -> None:
    split = objective(inputs(slice(0, 1)), aggregation).loss + objective(inputs(slice(1, 2)), aggregation).loss
    assert split.item() == pytest.approx(EXPECTED[aggregation], rel=1e-12)


def test_kl_coef_zero_and_no_entropy_leave_the_policy_loss() -> None:
    # seq_mean_token_sum without KL and entropy: (3 * -rho + 2 * 2 rho) / 4 = rho / 4
    plain = objective(inputs(), "seq_mean_token_sum", kl_coef=0.0, entropy_coef=0.0).loss
    assert plain.item() == pytest.approx(RHO / TOTAL_SEQUENCES, rel=1e-12)


def test_reported_kl_and_clip_fractions() -> None:
    # rho = e^0.1 = 1.105 > 1 + 0.05: clipped high where A > 0 (row 0's 3 tokens of 5)
    out = objective(inputs(), eps=0.05)
    assert out.kl == pytest.approx((0.5 + 0.0 + 0.5 + 0.0 - 0.5) / 5)  # masked mean of k1
    assert out.clip.high == pytest.approx(3 / 5) and out.clip.low == 0.0 and out.clip.region == pytest.approx(3 / 5)


def test_gradient_of_the_entropy_bonus_and_kl_hand_value() -> None:
    # d loss / d logprobs_t for token_mean: (-rho A_i + KL_COEF * d k1/d logp) / TOTAL_TOKENS, k1' = 1
    x = inputs()
    logprobs = x.logprobs.clone().requires_grad_(True)
    entropy = x.entropy.clone().requires_grad_(True)  # type: ignore[union-attr]
    objective(
        ObjectiveInputs(logprobs, x.old_logprobs, x.reference_logprobs, x.advantages, x.loss_mask, entropy)
    ).loss.backward()
    mask = torch.tensor(MASK, dtype=F64)
    expected = (-RHO * torch.tensor(ADVANTAGES, dtype=F64).unsqueeze(1) + KL_COEF) / TOTAL_TOKENS * mask
    torch.testing.assert_close(logprobs.grad, expected, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(entropy.grad, -ENTROPY_COEF / TOTAL_TOKENS * mask, rtol=1e-12, atol=1e-15)
