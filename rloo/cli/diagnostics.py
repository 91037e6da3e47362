"""Automatic diagnostics of a run's logged metrics: each check maps a symptom to the usual fix.

Every check reads the *recent* part of a metric, the mean over the last quarter of its
logged values (at least one), so a bad start that recovers raises nothing. Evaluation logs
(rows with ``eval_*`` keys) are left out of the training checks.

The trainer averages each metric over a logging window ignoring NaN (see
:func:`rloo.training.monitoring.logs.mean_metrics`), so a window whose losses were all NaN shows up as a
training row *without* ``loss``; the NaN check counts those rows as well.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeGuard

Rows = list[dict[str, Any]]

ZERO_STD_FRACTION = 0.5  # frac_reward_zero_std above this: most groups carry no signal
CLIPPED_FRACTION = 0.5  # completions/clipped_ratio above this: most completions are cut
KL_LIMIT = 1.0  # recent KL above this is large whatever it started at
KL_GROWTH = 10.0  # ... or above this multiple of its first value,
KL_FLOOR = 0.05  # with the first value floored here: at step 1 the KL is ~0 (policy == reference)
STD_EPS = 1e-6  # reward_std at or below this is zero
EMPTY_LENGTH = 1.0  # mean completion length at or below this (EOS counts) is an empty output


def training_rows(rows: Rows) -> Rows:
    """The training logs: rows of ``metrics.jsonl`` that are not evaluation logs."""
    return [row for row in rows if not any(str(key).startswith("eval_") for key in row)]


def is_finite(value: Any) -> TypeGuard[int | float]:
    """A finite int or float (a logged metric that can be drawn)."""
    return isinstance(value, int | float) and math.isfinite(value)


def finite_series(rows: Rows, key: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of ``key`` over the rows where it is a finite number."""
    steps, values = [], []
    for row in rows:
        value = row.get(key)
        if is_finite(value) and isinstance(row.get("step"), int | float):
            steps.append(float(row["step"]))
            values.append(float(value))
    return steps, values


def _recent(rows: Rows, key: str) -> float | None:
    """Mean of the last quarter of ``key``'s finite values; None if it was never logged."""
    values = finite_series(rows, key)[1]
    if not values:
        return None
    tail = values[-max(1, len(values) // 4) :]
    return sum(tail) / len(tail)


def _zero_std_groups(rows: Rows) -> str | None:
    recent = _recent(rows, "frac_reward_zero_std")
    if recent is None or recent <= ZERO_STD_FRACTION:
        return None
    return (
        f"most groups have identical rewards (frac_reward_zero_std = {recent:.2f} recently): no learning signal "
        "— raise temperature / num_generations, check the reward"
    )


def _clipped_completions(rows: Rows) -> str | None:
    recent = _recent(rows, "completions/clipped_ratio")
    if recent is None or recent <= CLIPPED_FRACTION:
        return None
    return (
        f"most completions hit max_completion_length (completions/clipped_ratio = {recent:.2f} recently) "
        "— raise max_completion_length, reward shorter answers, or set mask_truncated_completions"
    )


def _growing_kl(rows: Rows) -> str | None:
    values = finite_series(rows, "kl")[1]
    recent = _recent(rows, "kl")
    if recent is None:
        return None
    limit = min(KL_LIMIT, KL_GROWTH * max(values[0], KL_FLOOR))
    if recent <= limit:
        return None
    return f"KL is growing (first {values[0]:.3g}, recently {recent:.3g}): raise beta or lower learning_rate"


def _collapsed_reward_std(rows: Rows) -> str | None:
    recent = _recent(rows, "reward_std")
    if recent is None or recent > STD_EPS:
        return None
    return (
        "reward_std collapsed to 0: every completion gets the same reward "
        "— the policy collapsed or the reward is constant; check the reward function"
    )


def _empty_outputs(rows: Rows) -> str | None:
    recent = _recent(rows, "completions/mean_length")
    if recent is None or recent > EMPTY_LENGTH:
        return None
    return (
        f"empty outputs: completions/mean_length = {recent:.2f} tokens recently (EOS counts as one) "
        "— the policy learned to stop at once; check that the reward does not favour empty answers"
    )


def _nan_losses(rows: Rows) -> str | None:
    logs_loss = any("loss" in row for row in rows)
    bad = []
    for row in rows:
        loss, norm = row.get("loss"), row.get("grad_norm")
        nonfinite = any(isinstance(v, float) and not math.isfinite(v) for v in (loss, norm))
        if nonfinite or (logs_loss and "loss" not in row):
            bad.append(row.get("step"))
    if not bad:
        return None
    shown = ", ".join(str(int(s)) if isinstance(s, int | float) else "?" for s in bad[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return (
        f"NaN/inf loss or grad_norm at step(s) {shown}{more}: lower learning_rate, keep max_grad_norm > 0, "
        "and check rewards and bf16"
    )


CHECKS: tuple[Callable[[Rows], str | None], ...] = (
    _zero_std_groups,
    _clipped_completions,
    _growing_kl,
    _collapsed_reward_std,
    _empty_outputs,
    _nan_losses,
)


def diagnose(rows: Rows) -> list[str]:
    """One sentence per problem the training logs in ``rows`` show, with the fix; [] when healthy."""
    train = training_rows(rows)
    return [message for check in CHECKS if (message := check(train)) is not None]
