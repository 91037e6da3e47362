"""Named algorithm presets and the printout of the resolved formula.

A preset fills the algorithm knobs of :class:`rloo.config.RLOOConfig` that the user left
unset (``None``); a field set explicitly wins, and :func:`describe_algorithm` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rloo.algo.advantages import ADVANTAGE_ESTIMATORS
from rloo.algo.kl import KL_ESTIMATORS, get_kl_placement
from rloo.algo.losses import AGGREGATIONS, POLICY_LOSSES
from rloo.algo.objective import ObjectiveSettings

# Every knob a preset may set. Each preset sets all of them, so the resolved algorithm
# never depends on which preset was the default.
PRESET_KEYS: tuple[str, ...] = (
    "advantage_estimator",
    "normalize_advantages",
    "kl_estimator",
    "kl_placement",
    "ratio_level",
    "loss_aggregation",
    "epsilon",
    "epsilon_high",
    "clip_ratio",
    "beta",
    "mask_truncated_completions",
)

_TRL: dict[str, Any] = {
    "advantage_estimator": "rloo",
    "normalize_advantages": False,
    "kl_estimator": "k1",
    "kl_placement": "reward",
    "ratio_level": "sequence",
    "loss_aggregation": "seq_mean_token_sum",
    "epsilon": 0.2,
    "epsilon_high": 0.2,
    "clip_ratio": True,
    "beta": 0.05,
    "mask_truncated_completions": False,
}

PRESETS: dict[str, dict[str, Any]] = {
    # TRL 1.13's RLOOTrainer: k1 KL summed into the reward, leave-one-out, one sequence-level
    # ratio clipped per completion, token sum, mean over completions.
    "trl": _TRL,
    # Ahmadian et al. 2024: the same estimator, plain REINFORCE on the whole sequence.
    "rloo_paper": {**_TRL, "clip_ratio": False},
    # REINFORCE++ (Hu 2025): batch-normalized rewards, per-token ratio, k2 KL in the loss.
    "reinforce_pp": {
        **_TRL,
        "advantage_estimator": "reinforce_pp",
        "kl_estimator": "k2",
        "kl_placement": "loss",
        "ratio_level": "token",
        "loss_aggregation": "token_mean",
    },
    # REINFORCE++-baseline: group-mean baseline, batch std scaling.
    "reinforce_pp_baseline": {
        **_TRL,
        "advantage_estimator": "reinforce_pp_baseline",
        "kl_estimator": "k2",
        "kl_placement": "loss",
        "ratio_level": "token",
        "loss_aggregation": "token_mean",
    },
    # GRPO (Shao et al. 2024): group-normalized advantages, per-token ratio, k3 KL in the loss.
    "grpo": {
        **_TRL,
        "advantage_estimator": "grpo",
        "kl_estimator": "k3",
        "kl_placement": "loss",
        "ratio_level": "token",
        "loss_aggregation": "seq_mean_token_mean",
        "beta": 0.04,
    },
    # Dr. GRPO (Liu et al. 2025): no std scaling, no length normalization.
    "dr_grpo": {
        **_TRL,
        "advantage_estimator": "group_mean",
        "kl_estimator": "k3",
        "kl_placement": "loss",
        "ratio_level": "token",
        "loss_aggregation": "seq_mean_token_sum_norm",
        "beta": 0.0,
    },
    # TRL 1.16's GRPOConfig defaults (GRPOConfig's preset): group mean/std advantages, per-token
    # ratio, loss_type "dapo" (the tokens of the whole step), no KL.
    "trl_grpo": {
        **_TRL,
        "advantage_estimator": "grpo",
        "kl_estimator": "k3",
        "kl_placement": "loss",
        "ratio_level": "token",
        "loss_aggregation": "token_mean",
        "beta": 0.0,
    },
    # DAPO (Yu et al. 2025): clip-higher, token-level loss, no KL, overlong filtering.
    "dapo": {
        **_TRL,
        "advantage_estimator": "grpo",
        "kl_estimator": "k3",
        "kl_placement": "loss",
        "ratio_level": "token",
        "loss_aggregation": "token_mean",
        "epsilon_high": 0.28,
        "beta": 0.0,
        "mask_truncated_completions": True,
    },
}


@dataclass(frozen=True)
class AlgorithmSpec:
    """The resolved algorithm knobs; the trainer reads these, never the preset name."""

    advantage_estimator: str
    normalize_advantages: bool
    kl_estimator: str
    kl_placement: str
    ratio_level: str
    loss_aggregation: str
    epsilon: float
    epsilon_high: float
    clip_ratio: bool
    beta: float
    mask_truncated_completions: bool

    @property
    def clip_range(self) -> tuple[float, float]:
        """``(eps_low, eps_high)``; infinite when clipping is off."""
        return (self.epsilon, self.epsilon_high) if self.clip_ratio else (float("inf"), float("inf"))

    @property
    def reward_beta(self) -> float:
        """The KL coefficient applied to the rewards (beta where ``kl_placement`` is ``reward``, else 0)."""
        return get_kl_placement(self.kl_placement).coefficients(self.beta)[0]

    @property
    def loss_beta(self) -> float:
        """The KL coefficient applied in the loss (beta where ``kl_placement`` is ``loss``, else 0)."""
        return get_kl_placement(self.kl_placement).coefficients(self.beta)[1]

    def objective(self, max_completion_length: int, entropy_coef: float) -> ObjectiveSettings:
        """The policy objective's settings for this algorithm (:func:`rloo.algo.objective.policy_objective`)."""
        eps_low, eps_high = self.clip_range
        return ObjectiveSettings(
            ratio_level=self.ratio_level,
            eps_low=eps_low,
            eps_high=eps_high,
            aggregation=self.loss_aggregation,
            max_completion_length=max_completion_length,
            kl_estimator=self.kl_estimator,
            kl_coef=self.loss_beta,
            entropy_coef=entropy_coef,
        )


def resolve_preset(preset: str, given: dict[str, Any]) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    """Fill the knobs the user left None from ``preset``: ``(resolved knobs, overrides)`` where
    ``overrides[key] = (explicit value, the preset's value)`` for each explicit knob that differs."""
    values = PRESETS[preset]
    resolved: dict[str, Any] = {}
    overrides: dict[str, tuple[Any, Any]] = {}
    for key in PRESET_KEYS:
        explicit, default = given[key], values[key]
        # an explicit epsilon without epsilon_high means a symmetric clip, as in TRL
        if key == "epsilon_high" and "epsilon" in overrides:
            default = resolved["epsilon"]
        resolved[key] = default if explicit is None else explicit
        if explicit is not None and explicit != default:
            overrides[key] = (explicit, default)
    return resolved, overrides


def describe_algorithm(preset: str, spec: AlgorithmSpec, overrides: dict[str, tuple[Any, Any]]) -> str:
    """Human-readable formula of the resolved algorithm (from the registries' formulas),
    with the explicit overrides."""
    reward_beta, loss_beta = spec.reward_beta, spec.loss_beta
    kl = f"beta * sum_t {spec.kl_estimator}_t"
    clip = f"clip(rho, 1-{spec.epsilon}, 1+{spec.epsilon_high})" if spec.clip_ratio else "rho (no clipping)"
    lines = [
        f"algorithm (preset {preset!r}):",
        "  reward     R_i = r_i" + (f" - {kl}" if reward_beta else ""),
        f"  advantage  {ADVANTAGE_ESTIMATORS.formula(spec.advantage_estimator)}"
        + ("; then batch-whitened" if spec.normalize_advantages else ""),
        f"  ratio      {POLICY_LOSSES.formula(spec.ratio_level)}",
        f"  per action l = -min(rho A, {clip} A)" + (f" + {kl}" if loss_beta else ""),
        f"  loss       {spec.loss_aggregation}: {AGGREGATIONS.formula(spec.loss_aggregation)}"
        + (", truncated completions masked" if spec.mask_truncated_completions else ""),
    ]
    if spec.beta:
        lines.append(f"  KL         {KL_ESTIMATORS.formula(spec.kl_estimator)}, beta = {spec.beta}")
    else:
        lines.append("  KL         none (beta = 0, no reference model)")
    for key, (value, preset_value) in sorted(overrides.items()):
        lines.append(f"  explicit   {key}={value!r} wins over the preset's {preset_value!r}")
    return "\n".join(lines)
