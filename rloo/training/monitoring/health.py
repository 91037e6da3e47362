"""Live health monitors: the seeds' troubleshooting table, checked while a run trains.

Each monitor watches per-step metrics and fires when its symptom appears; a firing monitor
prints a warning naming the fix (:mod:`rloo.config.symptoms`, the table the report's
diagnostics share) (also appended to ``warnings.log``, which the report
shows) and sets ``health/<monitor> = 1`` in that step's metrics (``metrics.jsonl``). It fires
once when its condition becomes true and again only after the condition has cleared, so a
lasting symptom is one warning, not one per step.

========================  ===========================================================
monitor                   fires when (thresholds: ``RLOOConfig.health_thresholds``)
========================  ===========================================================
``length_explosion``      mean completion length over the last window >= ratio x baseline
``length_collapse``       ... <= ratio x baseline (empty outputs)
``kl_explosion``          mean per-token KL to the reference over the last window >= limit
``reward_collapse``       fraction of groups whose completions all got the same *task*
                          reward >= limit (``frac_task_reward_zero_std``: before the KL
                          penalty, which breaks ties and hides a collapse from
                          ``frac_reward_zero_std``)
``entropy_collapse``      mean token entropy over the last window <= ratio x baseline
``train_up_eval_down``    since the best evaluation, ``eval_reward`` fell and the train
                          reward (last window) rose, each by >= delta
``loss_spike``            a step's ``grad_norm`` (before clipping) is >= factor x the
                          median over the last ``SPIKE_WINDOWS`` windows' steps that
                          had a task-reward signal (at least ``window`` of them)
========================  ===========================================================

``loss_spike`` reads the gradient norm, not the loss: the policy-gradient loss is ~0 by
construction (advantages are zero-mean within a group, and the ratio is 1 on the first pass),
so its value is float noise whose "spikes" mean nothing; the gradient it produces is what
spikes when an update goes wild. Its reference leaves out the steps where no group's task
rewards differed (``frac_task_reward_zero_std`` = 1): their gradient is the KL penalty's alone,
~1e-3 of a normal step's, and a median of previous steps that held two of them read the next
normal step as an 85-130x "spike" (12 false alarms in 51 normal tiny runs; docs/reliability.md,
"Health monitors", has the calibration: ``benchmarks/health_calibration.py``).

The baseline of a ratio is the mean over the run's first ``window`` steps; ratio monitors
start once the last window no longer overlaps it. Everything the monitors remember is a
plain dict kept in ``TrainerState.health``, so a resumed run monitors as the uninterrupted one.
Pure Python: no tensors, so each rule is tested on hand-made series as well as on tiny runs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rloo.config.symptoms import finding
from rloo.report import metric_names as names

# short name -> the per-step metric it follows
SERIES: Mapping[str, str] = {
    "length": names.MEAN_LENGTH,
    "kl": names.KL,
    "task_zero_std": names.FRAC_TASK_REWARD_ZERO_STD,
    "entropy": names.ENTROPY,
    "reward": names.REWARD,
}
SPIKE_WINDOWS = 4  # the spike reference: the last 4 x window steps with a task-reward signal
TINY = 1e-6  # a series whose typical magnitude is below this has no scale to spike against


@dataclass(frozen=True)
class Alert:
    name: str
    message: str

    @property
    def metric(self) -> str:
        return names.health(self.name)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def spike(previous: list[float], value: float, factor: float) -> float | None:
    """``value / median(previous)`` when that is >= ``factor``, else None; None also when the
    series has no scale (``median(previous) < 1e-6``, e.g. a gradient that is exactly 0 when
    no group has signal).

    A ratio to the median, not a distance in median absolute deviations: over a short window
    the MAD is itself noisy, and a healthy demo run (500 steps) had 2-3x gradient-norm swings
    that were 10-20 MADs away (36 MADs in the calibration runs of docs/reliability.md's "Health
    monitors"); a spike worth a warning is many times the typical norm."""
    typical = statistics.median(previous)
    if typical < TINY:
        return None
    ratio = value / typical
    return ratio if ratio >= factor else None


class HealthMonitor:
    """The monitors of one run; ``thresholds`` is the resolved ``RLOOConfig.health_thresholds``."""

    def __init__(self, thresholds: Mapping[str, float]) -> None:
        self.t = dict(thresholds)
        self.window = int(self.t["window"])

    # ------------------------------------------------------------------ per step
    def observe_step(self, memory: dict[str, Any], step: int, metrics: Mapping[str, float]) -> list[Alert]:
        """Record the step's ``metrics`` in ``memory`` (``TrainerState.health``); the alerts that fire."""
        history = memory.setdefault("history", {})
        baseline = memory.setdefault("baseline", {})
        seen = memory.setdefault("seen", {})
        for short, key in SERIES.items():
            value = metrics.get(key)
            if value is None or not math.isfinite(value):
                continue
            values = history.setdefault(short, [])
            values.append(float(value))
            del values[: -(self.window + 1)]
            seen[short] = seen.get(short, 0) + 1
            if seen[short] <= self.window:
                baseline.setdefault(short, []).append(float(value))
        conditions = {
            "length_explosion": self._ratio(memory, "length", "length_explosion", above=True),
            "length_collapse": self._ratio(memory, "length", "length_collapse", above=False),
            "kl_explosion": self._level(memory, "kl", "kl_explosion"),
            "reward_collapse": self._level(memory, "task_zero_std", "reward_collapse"),
            "entropy_collapse": self._ratio(memory, "entropy", "entropy_collapse", above=False),
            "loss_spike": self._spike(memory, metrics),
        }
        return self._edges(memory, step, conditions)

    def _recent(self, memory: dict[str, Any], short: str) -> float | None:
        values = memory["history"].get(short, [])
        return _mean(values[-self.window :]) if len(values) >= self.window else None

    def _ratio(self, memory: dict[str, Any], short: str, name: str, *, above: bool) -> str | None:
        ratio = self.t[name]
        base_values = memory["baseline"].get(short, [])
        if not ratio or memory["seen"].get(short, 0) < 2 * self.window or len(base_values) < self.window:
            return None
        base, recent = _mean(base_values), self._recent(memory, short)
        if recent is None or base <= 0:
            return None
        if (recent >= ratio * base) if above else (recent <= ratio * base):
            what = {"length": "mean completion length", "entropy": "mean token entropy"}[short]
            return (
                f"{what} {recent:.3g} over the last {self.window} steps is {recent / base:.2f}x its baseline "
                f"{base:.3g} (first {self.window} steps; health_thresholds.{name}={ratio:g})"
            )
        return None

    def _level(self, memory: dict[str, Any], short: str, name: str) -> str | None:
        limit, recent = self.t[name], self._recent(memory, short)
        if not limit or recent is None or recent < limit:
            return None
        what = {
            "kl": "mean per-token KL to the reference",
            "task_zero_std": "fraction of groups whose completions all got the same task reward",
        }[short]
        return f"{what} is {recent:.3g} over the last {self.window} steps (health_thresholds.{name}={limit:g})"

    def _spike(self, memory: dict[str, Any], metrics: Mapping[str, float]) -> str | None:
        """This step's ``grad_norm`` against the median of the recent steps that had a task-reward
        signal; the step then joins them if it had one (after the check: a spike is not its own reference)."""
        factor, value = self.t["loss_spike"], metrics.get(names.GRAD_NORM)
        if value is None or not math.isfinite(value):
            return None  # not logged at this step (the non-finite guard reports NaN/inf)
        reference = memory.setdefault("spike_reference", [])
        ratio = spike(reference, value, factor) if factor and len(reference) >= self.window else None
        condition = None
        if ratio is not None:
            condition = (
                f"{names.GRAD_NORM} {value:.3g} is {ratio:.3g}x the median {statistics.median(reference):.3g} of "
                f"the last {len(reference)} steps with a task-reward signal (health_thresholds.loss_spike={factor:g})"
            )
        if metrics.get(names.FRAC_TASK_REWARD_ZERO_STD, 0.0) < 1.0:  # a signal (not logged: counted as one)
            reference.append(float(value))
            del reference[: -SPIKE_WINDOWS * self.window]
        return condition

    # ------------------------------------------------------------------ per evaluation
    def observe_eval(self, memory: dict[str, Any], step: int, eval_reward: float) -> list[Alert]:
        """Compare ``eval_reward`` with the best evaluation so far and the train reward then."""
        delta = self.t["train_up_eval_down"]
        memory.setdefault("history", {})
        train, best = self._recent(memory, "reward"), memory.get("best_eval")
        condition = None
        if train is None or not math.isfinite(eval_reward):
            pass  # nothing to compare yet
        elif best is None or eval_reward > best[0]:
            memory["best_eval"] = [eval_reward, train]
        elif delta and best[0] - eval_reward >= delta and train - best[1] >= delta:
            condition = (
                f"eval_reward fell from {best[0]:.3g} to {eval_reward:.3g} while the train reward rose from "
                f"{best[1]:.3g} to {train:.3g} (health_thresholds.train_up_eval_down={delta:g})"
            )
        return self._edges(memory, step, {"train_up_eval_down": condition})

    # ------------------------------------------------------------------ firing
    @staticmethod
    def _edges(memory: dict[str, Any], step: int, conditions: Mapping[str, str | None]) -> list[Alert]:
        """An alert for each condition that became true; a cleared condition re-arms its monitor."""
        firing = memory.setdefault("firing", [])
        alerts = []
        for name, condition in conditions.items():
            if condition is None:
                if name in firing:
                    firing.remove(name)
            elif name not in firing:
                firing.append(name)
                text = f"health: {name.replace('_', ' ')} at step {step}: {finding(name, condition)}"
                alerts.append(Alert(name, text))
        return alerts
