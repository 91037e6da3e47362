"""The objective: the algorithm knobs a preset fills (None: from :mod:`rloo.config.presets`), the clipped
ratio, the reference model's refresh, how several rewards combine into one, and the extra loss terms.
The math they select is in :mod:`rloo.algo`.

The checks read the resolved knobs (``config.algorithm``), the preset's values filled in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rloo.algo.advantages import ADVANTAGE_ESTIMATORS, MULTI_OBJECTIVE_AGGREGATIONS
from rloo.algo.kl import KL_ESTIMATORS, KL_PLACEMENTS
from rloo.algo.losses import AGGREGATION_MODES, POLICY_LOSSES
from rloo.config.errors import fail
from rloo.config.field_types import FloatList, FloatPair
from rloo.config.fields.declare import option

if TYPE_CHECKING:
    from rloo.config.rloo_config import RLOOConfig


@dataclass
class AlgorithmFields:
    """Algorithm, reference and reward-combination fields of ``RLOOConfig``, with their documentation."""

    beta: float | None = option(
        None,
        "KL penalty coefficient against the frozen reference, >= 0; 0 disables the KL and builds no reference "
        "model. None = from the preset (trl: 0.05).",
        trl="beta",
    )
    num_iterations: int = option(
        1,
        "Optimizer passes over each generation batch, >= 1; > 1 computes old log-probs and uses the clipped ratio.",
        trl="num_iterations",
    )
    epsilon: float | None = option(
        None, "Lower clip range (ratio >= 1 - epsilon), in (0, 1). None = from the preset (trl: 0.2).", trl="epsilon"
    )
    epsilon_high: float | None = option(
        None,
        "Upper clip range (ratio <= 1 + epsilon_high), > 0. None = from the preset: equal to epsilon (dapo: 0.28).",
        trl="epsilon_high",
    )
    off_policy_mask_threshold: float | None = option(
        None,
        "Leave out of the policy loss a completion with a negative advantage whose mean per-token KL from the "
        "sampling policy to the current one exceeds this, > 0 (DeepSeek-V3.2's delta, e.g. 0.5); None: off.",
        trl="off_policy_mask_threshold",
    )
    clip_ratio: bool | None = option(
        None,
        "Clip the importance ratio to [1 - epsilon, 1 + epsilon_high]; False = unclipped (plain REINFORCE). "
        "None = from the preset (trl: True, rloo_paper: False).",
        trl=None,
    )
    advantage_estimator: str | None = option(
        None,
        "Baseline and scaling of the advantage: rloo (leave-one-out), grpo, group_mean, reinforce, reinforce_pp "
        "or reinforce_pp_baseline. None = from the preset (trl: rloo).",
        trl=None,
    )
    normalize_advantages: bool | None = option(
        None,
        "Whiten the advantages over the generation batch (mean 0, std 1). None = from the preset (trl: False).",
        trl="normalize_advantages",
    )
    kl_estimator: str | None = option(
        None,
        "Per-token KL estimator of log-ratio x: k1 (x), k2 (x^2 / 2) or k3 (exp(-x) - 1 + x). None = from the "
        "preset (trl: k1).",
        trl=None,
    )
    kl_placement: str | None = option(
        None,
        "Where beta x KL goes: reward (subtracted from the reward before the baseline) or loss (added to the "
        "per-completion loss; with k2 or k3: k1's gradient there is 0 in expectation). None = from the preset "
        "(trl: reward).",
        trl=None,
    )
    ratio_level: str | None = option(
        None,
        "Importance ratio per completion (sequence) or per token (token). None = from the preset (trl: sequence).",
        trl=None,
    )
    loss_aggregation: str | None = option(
        None,
        "How token losses become the loss: token_mean, seq_mean_token_mean, seq_mean_token_sum or "
        "seq_mean_token_sum_norm. None = from the preset (trl: seq_mean_token_sum).",
        trl=None,
    )
    mask_truncated_completions: bool | None = option(
        None,
        "Zero the loss of completions with no EOS. None = from the preset (trl: False, dapo: True).",
        trl="mask_truncated_completions",
    )
    sync_ref_model: bool = option(
        False,
        "Refresh the reference policy every ref_model_sync_steps steps: ref = alpha * policy + (1 - alpha) * ref "
        "(TR-DPO). Needs beta > 0 and a reference to refresh: a full model or a trained PeftModel's adapter copy "
        "(not a fresh LoRA's adapters-disabled model).",
        trl="sync_ref_model",
    )
    ref_model_mixup_alpha: float = option(
        0.6, "alpha of sync_ref_model's refresh, in [0, 1].", trl="ref_model_mixup_alpha"
    )
    ref_model_sync_steps: int = option(
        512, "Optimizer steps between sync_ref_model's refreshes, >= 1.", trl="ref_model_sync_steps"
    )
    reward_weights: FloatList | None = option(
        None,
        "One weight per reward function; the reward is the weighted sum of those that apply. None = all 1.0.",
        trl="reward_weights",
    )
    multi_objective_aggregation: str = option(
        "sum_then_normalize",
        "Several reward functions: sum_then_normalize (the weighted sum, then the advantage estimator) or "
        "normalize_then_sum (GDPO: each function normalized within its group, mean 0 and std 1 over the "
        "completions it applies to, then the weighted sum, then the estimator).",
        trl="multi_objective_aggregation",
    )
    reward_clip_range: FloatPair | None = option(
        None,
        "(min, max): clamps the combined reward before the KL penalty and the baseline. None = no clipping.",
        trl="reward_clip_range",
    )
    reward_timeout: float | None = option(
        None,
        "Seconds a reward call may take, > 0; past it the call failed (see reward_error_policy). None: no limit, "
        "with a warning when a call has run 60 s (then 120 s, 240 s, ...).",
    )
    reward_error_policy: str = option(
        "raise",
        "A reward call that raises, times out or returns a bad result: 'raise' stops the run naming it; "
        "'skip' scores that batch 'does not apply' (rewards/<name>/failed).",
    )
    router_aux_loss_coef: float | None = option(
        None,
        "Weight of a mixture-of-experts model's load-balancing loss added to the loss, >= 0 (logged as aux_loss); "
        "None: the model config's own router_aux_loss_coef (as TRL 1.16); 0 turns it off; set on a model "
        "without that loss, it has no effect (warned; TRL raises).",
        trl="router_aux_loss_coef",
    )
    entropy_coef: float = option(0.0, "Weight of an entropy bonus subtracted from the loss, >= 0; 0 = off.", trl=None)


def check_algorithm(config: RLOOConfig) -> None:
    """The resolved knobs, the clip range, the rewards' combination and the reference's refresh."""
    _check_knobs(config)
    _check_rewards(config)
    threshold = config.off_policy_mask_threshold
    if threshold is not None and not threshold > 0:
        raise fail("off_policy_mask_threshold", threshold, "give the largest mean KL kept, > 0 (e.g. 0.5), or None")
    _check_clip_range(config)
    _check_reference_sync(config)


def _check_knobs(config: RLOOConfig) -> None:
    spec = config.algorithm
    choices: list[tuple[str, str, tuple[str, ...]]] = [
        ("advantage_estimator", spec.advantage_estimator, tuple(sorted(ADVANTAGE_ESTIMATORS))),
        ("kl_estimator", spec.kl_estimator, tuple(sorted(KL_ESTIMATORS))),
        ("kl_placement", spec.kl_placement, tuple(KL_PLACEMENTS)),
        ("ratio_level", spec.ratio_level, tuple(sorted(POLICY_LOSSES))),
        ("loss_aggregation", spec.loss_aggregation, AGGREGATION_MODES),
    ]
    for name, value, valid in choices:
        if value not in valid:
            raise fail(name, value, f"choose one of {list(valid)}")
    if spec.beta < 0 or not math.isfinite(spec.beta):
        raise fail("beta", spec.beta, "the KL coefficient must be a finite number >= 0 (0 disables the KL)")
    if spec.kl_placement == "loss" and spec.kl_estimator == "k1" and spec.beta > 0:
        raise fail(
            "kl_estimator",
            "k1",
            "in the loss (kl_placement='loss') k1's expected gradient is 0 (E[grad log pi] = 0): the penalty would "
            "only add noise. Use kl_estimator='k2' (its gradient is that of KL(pi || pi_ref)) or 'k3' (GRPO's: "
            "KL(pi_ref || pi)), or kl_placement='reward'",
        )
    if config.num_iterations < 1:
        raise fail("num_iterations", config.num_iterations, "must be >= 1 (1 = each batch used once)")
    if not config.entropy_coef >= 0:
        raise fail("entropy_coef", config.entropy_coef, "must be >= 0 (0 disables the entropy bonus)")
    if config.router_aux_loss_coef is not None and not config.router_aux_loss_coef >= 0:
        raise fail(
            "router_aux_loss_coef",
            config.router_aux_loss_coef,
            "must be >= 0 (0 turns it off; None takes the model config's own)",
        )


def _check_rewards(config: RLOOConfig) -> None:
    clip = config.reward_clip_range
    if clip is not None and (len(clip) != 2 or clip[0] > clip[1]):
        raise fail("reward_clip_range", config.reward_clip_range, "give (min, max) with min <= max")
    if config.reward_weights is not None and len(config.reward_weights) == 0:
        raise fail("reward_weights", config.reward_weights, "give one weight per reward function, or None")
    if config.reward_timeout is not None and not config.reward_timeout > 0:
        raise fail("reward_timeout", config.reward_timeout, "must be > 0 seconds, or None for no limit")
    if config.reward_error_policy not in ("raise", "skip"):
        raise fail("reward_error_policy", config.reward_error_policy, "choose one of ['raise', 'skip']")
    if config.multi_objective_aggregation not in MULTI_OBJECTIVE_AGGREGATIONS:
        raise fail(
            "multi_objective_aggregation",
            config.multi_objective_aggregation,
            f"choose one of {list(MULTI_OBJECTIVE_AGGREGATIONS)} (TRL's names)",
        )


def _check_clip_range(config: RLOOConfig) -> None:
    spec = config.algorithm
    if not spec.epsilon > 0:
        raise fail("epsilon", spec.epsilon, "the clip range must be > 0 (0.2 is typical)")
    if not spec.epsilon_high > 0:
        raise fail("epsilon_high", spec.epsilon_high, "must be > 0 (DAPO uses 0.28), or unset to equal epsilon")
    if spec.epsilon >= 1:
        raise fail("epsilon", spec.epsilon, "must be < 1 so that 1 - epsilon stays positive")
    if spec.clip_ratio and spec.epsilon_high < spec.epsilon:
        raise fail(
            "epsilon_high",
            spec.epsilon_high,
            f"must be >= epsilon ({spec.epsilon}): clip-higher widens the upper side (DAPO: 0.28 with 0.2)",
        )


def _check_reference_sync(config: RLOOConfig) -> None:
    if not 0 <= config.ref_model_mixup_alpha <= 1:
        raise fail("ref_model_mixup_alpha", config.ref_model_mixup_alpha, "must be in [0, 1]")
    if config.ref_model_sync_steps < 1:
        raise fail("ref_model_sync_steps", config.ref_model_sync_steps, "must be >= 1")
    if config.sync_ref_model and config.algorithm.beta == 0:
        raise fail("sync_ref_model", True, "there is no reference model with beta=0; set beta > 0 or drop it")
