"""Automatic diagnostics of a run's logged metrics: each check maps a symptom to its fix, from the one
table the live health monitors share (:mod:`rloo.config.symptoms`).

Every check reads the *recent* part of a metric, the mean over the last quarter of its
logged values (at least one), so a bad start that recovers raises nothing. Evaluation logs
(rows with ``eval_*`` keys) and the end-of-run summary (``train_loss``) are left out of the
training checks.

The trainer averages each metric over a logging window ignoring NaN (see
:func:`rloo.training.monitoring.logs.mean_metrics`), so a window whose losses were all NaN shows up as a
training row *without* ``loss``; the NaN check counts those rows as well.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeGuard

from rloo.config.symptoms import SYMPTOMS, finding
from rloo.report import metric_names as names

Rows = list[dict[str, Any]]

KL_LIMIT = SYMPTOMS["kl_explosion"].threshold  # recent KL above the monitor's limit is large whatever it started at
KL_GROWTH = 10.0  # ... or above this multiple of its first value,
KL_FLOOR = 0.05  # with the first value floored here: at step 1 the KL is ~0 (policy == reference)
EMPTY_LENGTH = 1.0  # mean completion length at or below this (EOS counts) is an empty output


def training_rows(rows: Rows) -> Rows:
    """The training logs: rows of ``metrics.jsonl`` that are neither evaluation logs nor the end-of-run
    summary (``train_loss``, ``train_runtime``, ...: no per-step ``loss``, which is no missing loss)."""
    return [row for row in rows if names.TRAIN_LOSS not in row and not any(str(key).startswith("eval_") for key in row)]


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
    recent = _recent(rows, names.FRAC_REWARD_ZERO_STD)
    if recent is None or recent <= SYMPTOMS["no_signal"].threshold:
        return None
    observed = f"most groups have identical rewards ({names.FRAC_REWARD_ZERO_STD} = {recent:.2f} recently)"
    return finding("no_signal", observed + ": no learning signal")


def _clipped_completions(rows: Rows) -> str | None:
    recent = _recent(rows, names.CLIPPED_RATIO)
    if recent is None or recent <= SYMPTOMS["clipped_completions"].threshold:
        return None
    observed = f"most completions hit max_completion_length ({names.CLIPPED_RATIO} = {recent:.2f} recently)"
    return finding("clipped_completions", observed)


def _growing_kl(rows: Rows) -> str | None:
    values = finite_series(rows, names.KL)[1]
    recent = _recent(rows, names.KL)
    if recent is None:
        return None
    limit = min(KL_LIMIT, KL_GROWTH * max(values[0], KL_FLOOR))
    if recent <= limit:
        return None
    return finding("kl_explosion", f"KL is growing (first {values[0]:.3g}, recently {recent:.3g})")


def _collapsed_reward_std(rows: Rows) -> str | None:
    recent = _recent(rows, names.REWARD_STD)
    if recent is None or recent > SYMPTOMS["constant_reward"].threshold:
        return None
    return finding("constant_reward", f"{names.REWARD_STD} collapsed to 0: every completion gets the same reward")


def _empty_outputs(rows: Rows) -> str | None:
    recent = _recent(rows, names.MEAN_LENGTH)
    if recent is None or recent > EMPTY_LENGTH:
        return None
    observed = f"empty outputs: {names.MEAN_LENGTH} = {recent:.2f} tokens recently (EOS counts as one)"
    return finding("length_collapse", observed + ": the policy learned to stop at once")


def _nan_losses(rows: Rows) -> str | None:
    logs_loss = any(names.LOSS in row for row in rows)
    bad = []
    for row in rows:
        loss, norm = row.get(names.LOSS), row.get(names.GRAD_NORM)
        nonfinite = any(isinstance(v, float) and not math.isfinite(v) for v in (loss, norm))
        if nonfinite or (logs_loss and names.LOSS not in row):
            bad.append(row.get("step"))
    if not bad:
        return None
    shown = ", ".join(str(int(s)) if isinstance(s, int | float) else "?" for s in bad[:5])
    more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
    return finding("nonfinite", f"NaN/inf loss or grad_norm at step(s) {shown}{more}")


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
