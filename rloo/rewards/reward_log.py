"""What reward functions log through TRL's ``log_extra`` and ``log_metric`` arguments."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RewardLog:
    """What reward functions log through TRL's ``log_extra(column, values)`` (a column of the
    completions table: one value per completion) and ``log_metric(name, value)`` (a scalar; the
    step logs the mean of its values, over processes too)."""

    extra: dict[str, list[Any]] = field(default_factory=dict)
    metrics: dict[str, list[float]] = field(default_factory=dict)

    def log_extra(self, column: str, values: Sequence[Any]) -> None:
        self.extra.setdefault(str(column), []).extend(values)

    def log_metric(self, name: str, value: float) -> None:
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise ValueError(f"log_metric({name!r}, {value!r}): the value must be a number")
        self.metrics.setdefault(str(name), []).append(float(value))

    def metric_means(self) -> dict[str, float]:
        return {name: sum(values) / len(values) for name, values in self.metrics.items()}
