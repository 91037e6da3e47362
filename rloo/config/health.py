"""The thresholds of the live health monitors (:mod:`rloo.training.monitoring.health`), one mapping.

``RLOOConfig.health_thresholds`` takes any subset of :data:`HEALTH_THRESHOLDS`' keys; the
rest keep their defaults, and the resolved mapping (all keys) is what ``config.yaml`` records.
A threshold of 0 turns its monitor off. Readings are means over the last ``window`` optimizer
steps; the "baseline" of a ratio is the mean over the run's first ``window`` steps.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from rloo.config.symptoms import SYMPTOMS
from rloo.suggest import unknown_name_error

# key -> (default, what it means); docs/reliability.md's "Health monitors" table is this mapping. The monitors'
# entries come from the one symptom -> fix table the report's diagnostics share.
HEALTH_THRESHOLDS: Mapping[str, tuple[float, str]] = {
    "window": (5, "optimizer steps per reading (an integer >= 1); the baseline is the first window"),
    **{name: (symptom.threshold, symptom.meaning) for name, symptom in SYMPTOMS.items() if symptom.monitored},
}


def default_health_thresholds() -> dict[str, float]:
    return {key: default for key, (default, _) in HEALTH_THRESHOLDS.items()}


def resolve_health_thresholds(given: Mapping[str, Any] | None) -> dict[str, float]:
    """``given`` over the defaults, checked: known keys, finite numbers >= 0, ``window`` an int >= 1.

    Raises ``ValueError`` naming ``health_thresholds.<key>`` and the fix."""
    if given is not None and not isinstance(given, Mapping):
        raise ValueError(
            f"RLOOConfig.health_thresholds={given!r} is invalid: give a mapping of monitor names to thresholds, "
            f"e.g. {{'kl_explosion': 0.5}}, or None for the defaults"
        )
    resolved = default_health_thresholds()
    for key, value in (given or {}).items():
        if key not in HEALTH_THRESHOLDS:
            raise unknown_name_error(
                "health monitor", key, HEALTH_THRESHOLDS, where="RLOOConfig.health_thresholds.", list_choices=True
            )
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0:
            raise ValueError(
                f"RLOOConfig.health_thresholds.{key}={value!r} is invalid: give a finite number >= 0 "
                f"(0 turns the monitor off; default {HEALTH_THRESHOLDS[key][0]})"
            )
        if key == "window" and (not isinstance(value, numbers.Integral) or value < 1):
            raise ValueError(
                f"RLOOConfig.health_thresholds.window={value!r} is invalid: give a whole number of steps >= 1"
            )
        resolved[key] = int(value) if key == "window" else float(value)
    return resolved


def thresholds_markdown() -> str:
    """The table of the monitors' thresholds in docs/reliability.md (``scripts/regen_docs.py`` writes it)."""
    rows = [f"| `{key}` | {default} | {text} |" for key, (default, text) in HEALTH_THRESHOLDS.items()]
    return "\n".join(["| key | default | fires when |", "|---|---|---|", *rows])
