"""Tests for rloo.algo.importance (the engines' importance weights, the off-policy sequence mask) and how
they weigh the policy loss, against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rloo.algo.importance import (
    IMPORTANCE_SAMPLING_MODES,
    engine_importance_weights,
    off_policy_sequence_mask,
    weight_stats,
)
from rloo.algo.losses import sequence_level_loss, token_level_loss
from rloo.algo.objective import ObjectiveInputs, ObjectiveSettings, policy_objective

F64 = torch.float64
INF = float("inf")


def t(values: list, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def close(actual: torch.Tensor, expected: list | torch.Tensor) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=1e-6, rtol=0.0)


# two completions: row 0 has 2 tokens, row 1 has 3; trainer's (old) and vLLM's (mu) log-probs
OLD = t([[math.log(0.5), math.log(0.2), 0.0], [math.log(0.9), math.log(0.6), math.log(0.3)]])
MU = t([[math.log(0.25), math.log(0.4), 7.0], [math.log(0.9), math.log(0.1), math.log(0.3)]])
MASK = t([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])


def test_token_truncate_clamps_each_tokens_ratio() -> None:
    # ratios: row 0: 0.5/0.25 = 2, 0.2/0.4 = 0.5; row 1: 1, 6, 1; clamped to [0.8, 3]
    weights = engine_importance_weights(OLD, MU, MASK, "token_truncate", 0.8, 3.0)
    close(weights, [[2.0, 0.8, 0.0], [1.0, 3.0, 1.0]])


def test_token_mask_zeroes_ratios_outside_the_bounds() -> None:
    weights = engine_importance_weights(OLD, MU, MASK, "token_mask", 0.8, 3.0)
    close(weights, [[2.0, 0.0, 0.0], [1.0, 0.0, 1.0]])


def test_sequence_modes_put_one_ratio_on_each_of_a_rows_tokens() -> None:
    # row 0: 2 * 0.5 = 1; row 1: 1 * 6 * 1 = 6 (the padding's 7.0 never counts)
    close(engine_importance_weights(OLD, MU, MASK, "sequence_truncate", None, 3.0), [[1.0, 1.0, 0.0], [3.0] * 3])
    close(engine_importance_weights(OLD, MU, MASK, "sequence_mask", None, 3.0), [[1.0, 1.0, 0.0], [0.0] * 3])
    close(engine_importance_weights(OLD, MU, MASK, "sequence_mask", 2.0, None), [[0.0, 0.0, 0.0], [6.0] * 3])


def test_an_unknown_mode_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="token_truncate"):
        engine_importance_weights(OLD, MU, MASK, "sequence", None, 3.0)


@given(st.lists(st.floats(-3, 0), min_size=1, max_size=6), st.sampled_from(IMPORTANCE_SAMPLING_MODES))
def test_identical_engines_weigh_every_token_one(logprobs: list[float], mode: str) -> None:
    old = t([logprobs])
    weights = engine_importance_weights(old, old.clone(), torch.ones_like(old), mode, 0.5, 2.0)
    close(weights, torch.ones_like(old))


def test_weight_stats_count_tokens_or_completions() -> None:
    tokens = weight_stats(engine_importance_weights(OLD, MU, MASK, "token_mask", 0.8, 3.0), MASK, "token_mask")
    assert (tokens.min, tokens.max, tokens.actions) == (0.0, 2.0, 5)
    assert tokens.mean == pytest.approx(4.0 / 5) and tokens.masked_frac == pytest.approx(2 / 5)
    rows = weight_stats(
        engine_importance_weights(OLD, MU, MASK, "sequence_truncate", None, 3.0), MASK, "sequence_truncate"
    )
    assert (rows.min, rows.mean, rows.max, rows.masked_frac, rows.actions) == (1.0, 2.0, 3.0, 0.0, 2)


def test_off_policy_mask_drops_only_negative_advantages_far_from_the_sampler() -> None:
    # the current policy is the sampler's on row 0 (mean KL 0) and differs in row 1's first token
    current = MU.clone()
    current[1] = t([math.log(0.5), math.log(0.1), math.log(0.3)])  # row 1: KL = log(0.9 / 0.5) / 3 = 0.196
    far = off_policy_sequence_mask(t([-1.0, -1.0]), current, MU, MASK, 0.1)
    close(far, [[1.0], [0.0]])
    close(off_policy_sequence_mask(t([-1.0, 1.0]), current, MU, MASK, 0.1), [[1.0], [1.0]])  # A >= 0 kept
    close(off_policy_sequence_mask(t([-1.0, -1.0]), current, MU, MASK, 0.2), [[1.0], [1.0]])  # within delta


def test_weights_scale_each_tokens_loss_and_a_sequences_by_its_mean_weight() -> None:
    logprobs = t([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    advantages, weights = t([1.0, -2.0]), t([[2.0, 0.5, 0.0], [1.0, 0.0, 3.0]])
    plain = token_level_loss(logprobs, logprobs, advantages, MASK, INF, INF)
    weighted = token_level_loss(logprobs, logprobs, advantages, MASK, INF, INF, weights)
    close(plain.sequence_loss, [-2.0, 6.0])  # ratio 1: -A per token
    close(weighted.sequence_loss, [-(2.0 + 0.5), 2.0 * (1.0 + 0.0 + 3.0)])
    sequence = sequence_level_loss(logprobs, logprobs, advantages, MASK, INF, INF, weights)
    close(sequence.sequence_loss, [-1.0 * 2.5 / 2, 2.0 * 4.0 / 3])


def test_the_objective_weighs_the_policy_term_not_the_kl() -> None:
    logprobs = t([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    reference = logprobs - 0.1  # k1 = 0.1 per token
    advantages, weights = t([1.0, -2.0]), t([[2.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    settings = ObjectiveSettings(
        ratio_level="sequence", eps_low=0.2, eps_high=0.2, aggregation="seq_mean_token_sum", max_completion_length=3
    )
    kl_settings = ObjectiveSettings(**{**settings.__dict__, "kl_estimator": "k2", "kl_coef": 1.0})

    def loss(config: ObjectiveSettings, engine_weights: torch.Tensor | None) -> float:
        inputs = ObjectiveInputs(logprobs, logprobs, reference, advantages, MASK, None, engine_weights)
        return float(policy_objective(inputs, config, total_tokens=5.0, total_sequences=2.0).loss)

    assert loss(settings, None) == pytest.approx((-1.0 + 2.0) / 2)
    assert loss(settings, weights) == pytest.approx((-1.0 * 2.0 + 0.0) / 2)
    k2 = 0.5 * 0.1**2
    assert loss(kl_settings, weights) == pytest.approx((-2.0 + k2 * 2 + k2 * 3) / 2)


def test_the_objectives_off_policy_mask_uses_the_sampling_log_probs() -> None:
    logprobs = t([[-1.0, -1.0, 0.0], [-1.0, -1.0, -1.0]])
    sampling = logprobs + t([[0.0, 0.0, 0.0], [0.6, 0.6, 0.6]])  # row 1: mean KL 0.6
    settings = ObjectiveSettings(
        ratio_level="token",
        eps_low=0.2,
        eps_high=0.2,
        aggregation="seq_mean_token_sum",
        max_completion_length=3,
        off_policy_threshold=0.5,
    )
    inputs = ObjectiveInputs(logprobs, logprobs, None, t([-1.0, -1.0]), MASK, None, sampling_logprobs=sampling)
    masked = float(policy_objective(inputs, settings, total_tokens=5.0, total_sequences=2.0).loss)
    assert masked == pytest.approx(2.0 / 2)  # row 0 only: 2 tokens x (-A = 1)
    unmasked = ObjectiveInputs(logprobs, logprobs, None, t([-1.0, -1.0]), MASK, None)  # old = current: KL 0
    assert float(policy_objective(unmasked, settings, total_tokens=5.0, total_sequences=2.0).loss) == pytest.approx(2.5)
