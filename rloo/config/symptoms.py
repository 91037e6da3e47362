"""The one symptom -> fix table, shared by the live health monitors and the report's diagnostics.

From the seeds' troubleshooting sections. The live monitors (:mod:`rloo.training.monitoring.health`)
check their symptoms while a run trains, with ``RLOOConfig.health_thresholds`` (whose defaults and
meanings are the ones here: :data:`rloo.config.health.HEALTH_THRESHOLDS` is built from this
table); the report's diagnostics (:mod:`rloo.report.diagnostics`) check the logged metrics
afterwards, with the same thresholds. Both word a finding with :func:`finding`. Torch-free, so
the report stays light. It lives in the config, the lowest of its three readers, so that the config,
the trainer and the report all import it downward.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Symptom:
    """``fix``: what to change; ``threshold``: where it starts (a live monitor's default, which
    ``RLOOConfig.health_thresholds`` overrides, or the report's limit); ``meaning``: what the
    threshold measures, for a live monitor (docs/reliability.md's "Health monitors" table); empty otherwise."""

    fix: str
    threshold: float
    meaning: str = ""

    @property
    def monitored(self) -> bool:
        """Whether a live health monitor checks it while the run trains."""
        return bool(self.meaning)


SYMPTOMS: Mapping[str, Symptom] = {
    # checked live, with RLOOConfig.health_thresholds (a ratio's baseline: its first window)
    "length_explosion": Symptom(
        "raise beta (too low a KL lets the policy drift), add a length penalty (the `length` reward), "
        "or restart with a lower learning_rate",
        2.0,
        "mean completion length >= this x its baseline",
    ),
    "length_collapse": Symptom(
        "raise beta (too low a KL lets the policy drift), check that the reward does not favour short or "
        "empty answers, or restart with a lower learning_rate",
        0.25,
        "mean completion length <= this x its baseline",
    ),
    "kl_explosion": Symptom(
        "raise beta (e.g. 0.1), lower learning_rate, and evaluate more often",
        1.0,
        "mean per-token KL to the reference >= this (nats; only when beta > 0)",
    ),
    "reward_collapse": Symptom(
        "check that the reward function tells completions apart, raise temperature, use more diverse prompts "
        "(expected once the task is solved), or train on the groups that still differ (dynamic_sampling)",
        0.9,
        "fraction of groups whose completions all got the same *task* reward (before KL) >= this",
    ),
    "entropy_collapse": Symptom(
        "raise temperature or beta, lower learning_rate; entropy_coef > 0 rewards exploration",
        0.1,
        "mean token entropy <= this x its baseline",
    ),
    "train_up_eval_down": Symptom(
        "likely reward hacking: raise beta, and make the reward strict so format tricks cannot game it",
        0.05,
        "since the best evaluation, eval_reward fell and the train reward rose, each by >= this (reward units)",
    ),
    "loss_spike": Symptom(
        "raise num_generations (a better baseline) or gradient_accumulation_steps (a larger batch), "
        "lower learning_rate",
        5.0,
        "a step's grad_norm (before clipping) >= this x the median over the last 4 windows' steps with a "
        "task-reward signal (at least a window of them)",
    ),
    # checked by the report, on the logged metrics
    "no_signal": Symptom("raise temperature / num_generations, check the reward", 0.5),
    "clipped_completions": Symptom(
        "raise max_completion_length, reward shorter answers, or set mask_truncated_completions", 0.5
    ),
    "constant_reward": Symptom("the policy collapsed or the reward is constant; check the reward function", 1e-6),
    # checked live by the non-finite guard (rloo.training.monitoring.nonfinite) and by the report
    "nonfinite": Symptom(
        "lower learning_rate, keep max_grad_norm > 0, check the rewards (rewards/<name>/nonfinite) "
        "and, on a GPU, try fp32 instead of bf16",
        0.0,  # non-finite steps tolerated: any NaN/inf loss or gradient is the symptom
    ),
}


def finding(symptom: str, observation: str) -> str:
    """``observation`` (what the metrics show) and the symptom's fix, as one sentence."""
    return f"{observation}. Fix: {SYMPTOMS[symptom].fix}"
