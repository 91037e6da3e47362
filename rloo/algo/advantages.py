"""Rewards -> advantages: combination, clipping, baselines and normalization.

Pure torch: tensors in, tensors out; no model, no config object, no I/O.

Notation: N completions in a generation batch, made of P prompts x K samples each
(N = P*K in the usual case). Rewards are flat ``(N,)`` tensors and every completion
carries the id of its prompt's group in ``group_ids: (N,)``; groups are found from these
ids, never from positions, so a partly unscorable group or a singleton is handled by the
one rule stated in :func:`compute_advantages`.

A completion that no reward function applies to ("unscorable") is left out of its group's
baseline and of the normalization statistics and gets advantage 0, as in TRL since trl#5902
(checked in the 1.13.0 and 1.16.0 sources; ``tests/algo/test_trl_equivalence.py`` compares partly
unscorable batches). The one departure: a completion whose group has no other scorable member
gets advantage 0 in both, and with batch normalization rloo counts that 0 in the statistics
where TRL leaves it out. With every completion scorable, the ``rloo`` estimator is exactly
TRL's ``r_i - (sum_j r_j - r_i) / (K - 1)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from rloo.algo.registry import Registry

Level = Literal["group", "batch", "none"]
LEVELS: tuple[str, ...] = ("group", "batch", "none")
DEFAULT_STD_EPS = 1e-4


def combine_rewards(rewards_per_func: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """Weighted sum of several reward functions, skipping the ones that do not apply.

    ``r_n = sum_{f : R[n, f] is not NaN} w_f * R[n, f]``;
    ``scorable_n = exists f with R[n, f] not NaN``.

    Args:
        rewards_per_func: ``(N, F)`` float, NaN where function f does not apply to
            completion n (a reward function returned ``None``).
        weights: ``(F,)`` per-function weights.

    Returns:
        ``(rewards, scorable)``: ``(N,)`` float with 0.0 for unscorable rows, and
        ``(N,)`` bool.
    """
    if rewards_per_func.dim() != 2:
        raise ValueError(f"rewards_per_func must be (N, F), got shape {tuple(rewards_per_func.shape)}")
    if weights.shape != (rewards_per_func.shape[1],):
        raise ValueError(
            f"weights must have one entry per reward function ({rewards_per_func.shape[1]}), "
            f"got shape {tuple(weights.shape)}"
        )
    applies = ~torch.isnan(rewards_per_func)
    weighted = torch.where(applies, rewards_per_func * weights.to(rewards_per_func), 0.0)
    return weighted.sum(dim=1), applies.any(dim=1)


MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def normalize_then_sum(
    rewards_per_func: Tensor, weights: Tensor, group_ids: Tensor, eps: float = DEFAULT_STD_EPS
) -> Tensor:
    """GDPO's combination (TRL's ``multi_objective_aggregation='normalize_then_sum'``): each reward function
    normalized within each group, then the weighted sum:

        r'_nf = (R_nf - mean_g(R_f)) / (std_g(R_f) + eps),   r_n = sum_{f : R_nf is not NaN} w_f r'_nf

    with ``mean_g``, ``std_g`` (ddof=1; 0 with fewer than 2) over the rows of n's group where f applies
    (``R`` not NaN): a function that does not apply to some completions never turns its group's statistics
    into NaN. ``(N, F)``, ``(F,)``, ``(N,)`` -> ``(N,)``, 0.0 where no function applies."""
    index, num_groups = _dense_group_index(group_ids)
    applies = ~torch.isnan(rewards_per_func)
    values = torch.where(applies, rewards_per_func, 0.0)
    counts = torch.zeros(num_groups, rewards_per_func.shape[1], dtype=values.dtype, device=values.device)
    counts = counts.index_add_(0, index, applies.to(values.dtype))[index]
    sums = torch.zeros_like(counts[:num_groups]).index_add_(0, index, values)[index]
    mean = sums / counts.clamp(min=1.0)
    squares = torch.where(applies, (values - mean) ** 2, 0.0)
    spread = torch.zeros_like(counts[:num_groups]).index_add_(0, index, squares)[index]
    std = torch.where(counts >= 2, torch.sqrt(spread / (counts - 1).clamp(min=1.0)), 0.0)
    normalized = torch.where(applies, (values - mean) / (std + eps), 0.0)
    return (normalized * weights.to(normalized)).sum(dim=1)


def clip_rewards(rewards: Tensor, clip_range: tuple[float, float] | None) -> Tensor:
    """``clamp(r, low, high)``; identity when ``clip_range`` is None. ``rewards: (N,)``."""
    if clip_range is None:
        return rewards
    low, high = clip_range
    if low > high:
        raise ValueError(f"reward clip range must have low <= high, got {clip_range}")
    return rewards.clamp(min=low, max=high)


def _dense_group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary group ids ``(N,)`` to ``0..G-1``; returns ``(index (N,), G)``."""
    unique, index = torch.unique(group_ids, return_inverse=True)
    return index, int(unique.numel())


def _per_sample_group_sum(values: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """``out_n = sum_{m in group(n)} values_m``, shapes ``(N,)``."""
    sums = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    return sums.index_add_(0, index, values)[index]


def _masked_std(values: Tensor, scorable: Tensor) -> Tensor:
    """Sample std (ddof=1) of ``values[scorable]`` as a 0-dim tensor; 0 when fewer than 2."""
    count = scorable.sum()
    if count < 2:
        return values.new_zeros(())
    mean = values[scorable].mean()
    return torch.sqrt(((values[scorable] - mean) ** 2).sum() / (count - 1))


def batch_stats(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(sum, count, std)`` of ``values[mask]`` (std: ddof=1, 0 when fewer than 2), 0-dim tensors.

    The batch-level statistics of one process; data-parallel training passes a function with
    the same signature that reduces over every process's batch (see
    :class:`rloo.training.parallel.distributed.Ranks`)."""
    return values[mask].sum(), mask.sum().to(values.dtype), _masked_std(values, mask)


BatchStats = Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


def compute_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    scorable: Tensor,
    *,
    mean_level: Level = "group",
    leave_one_out: bool = True,
    std_level: Level = "none",
    eps: float = DEFAULT_STD_EPS,
    stats: BatchStats = batch_stats,
) -> Tensor:
    """Advantages from rewards with a configurable baseline and scale.

    ``A_i = (r_i - b_i) / (s_i + eps)`` where, over the *scorable* completions,

    - ``b_i`` (``mean_level``): ``group`` -> mean of i's group, ``batch`` -> mean of the
      batch, ``none`` -> 0. With ``leave_one_out`` the mean leaves r_i out:
      ``b_i = (sum_j r_j - r_i) / (n - 1)``, so for a group of K,
      ``A_i = r_i - 1/(K-1) sum_{j != i} r_j = K/(K-1) (r_i - mean(r))``.
    - ``s_i`` (``std_level``): sample std (ddof=1, as ``torch.std``) of the rewards in
      i's group / the batch; with ``none`` there is no division and no eps.

    Rules: unscorable completions get advantage 0 and enter no statistic. When the baseline
    or the std is taken per group, a completion whose group has fewer than 2 scorable members
    gets advantage 0 (it has no other sample to compare with).

    Args:
        rewards: ``(N,)`` float. group_ids: ``(N,)`` int, equal for the K samples of a
            prompt. scorable: ``(N,)`` bool, False where no reward function applied.
        stats: ``(sum, count, std)`` of the batch (:func:`batch_stats`); the batch levels use it.

    Raises:
        ValueError: a leave-one-out baseline on a batch where no group has 2 members,
            which means fewer than 2 completions per prompt (``num_generations`` < 2).
    """
    if mean_level not in LEVELS or std_level not in LEVELS:
        raise ValueError(f"mean_level and std_level must be one of {LEVELS}, got {mean_level!r}, {std_level!r}")
    if not (rewards.shape == group_ids.shape == scorable.shape) or rewards.dim() != 1:
        raise ValueError(
            "rewards, group_ids and scorable must all be (N,), got "
            f"{tuple(rewards.shape)}, {tuple(group_ids.shape)}, {tuple(scorable.shape)}"
        )
    index, num_groups = _dense_group_index(group_ids)
    ones = scorable.to(rewards.dtype)
    r = torch.where(scorable, rewards, 0.0)
    group_size = torch.bincount(index, minlength=num_groups)
    if leave_one_out and mean_level == "group" and rewards.numel() > 0 and group_size.max() < 2:
        raise ValueError(
            "the leave-one-out baseline needs at least 2 completions per prompt; every group "
            "here has 1. Set num_generations >= 2."
        )
    group_count = _per_sample_group_sum(ones, index, num_groups)
    if mean_level == "group":
        total, count = _per_sample_group_sum(r, index, num_groups), group_count
    elif mean_level == "batch":
        batch_total, batch_count, _ = stats(r, scorable)
        total, count = batch_total.expand_as(r), batch_count.expand_as(r)
    else:
        total, count = torch.zeros_like(r), torch.ones_like(r)
    if mean_level != "none" and leave_one_out:
        baseline = (total - r) / (count - 1).clamp(min=1)
    else:
        baseline = total / count.clamp(min=1)
    advantages = r - baseline

    if std_level == "group":
        mean = _per_sample_group_sum(r, index, num_groups) / group_count.clamp(min=1)
        sq = _per_sample_group_sum(torch.where(scorable, (r - mean) ** 2, 0.0), index, num_groups)
        std = torch.sqrt(sq / (group_count - 1).clamp(min=1))
        advantages = advantages / (std + eps)
    elif std_level == "batch":
        advantages = advantages / (stats(r, scorable)[2] + eps)
    return torch.where(_defined(group_count, scorable, mean_level, std_level), advantages, 0.0)


def _defined(group_count: Tensor, scorable: Tensor, mean_level: Level, std_level: Level) -> Tensor:
    """The rows an estimator gives an advantage: scorable, and where its baseline or std is per
    group, in a group with at least 2 scorable members. ``group_count``: each row's group's scorable count."""
    if "group" in (mean_level, std_level):
        return scorable & (group_count >= 2)
    return scorable


def rows_with_baseline(estimator: str, group_ids: Tensor, scorable: Tensor) -> Tensor:
    """``(N,)`` bool: the rows ``estimator`` (a registered name) defines an advantage for; the rest
    got 0 from it and belong in no batch statistic (:func:`normalize_advantages`' ``scorable``)."""
    return get_advantage_estimator(estimator).rows_with_baseline(group_ids, scorable)


def normalize_advantages(
    advantages: Tensor, scorable: Tensor, eps: float = DEFAULT_STD_EPS, stats: BatchStats = batch_stats
) -> Tensor:
    """Batch whitening after the baseline: ``(A - mean(A)) / (std(A) + eps)``.

    Statistics over the ``scorable`` rows only (std with ddof=1, as TRL's ``advantages.std()``): pass
    :func:`rows_with_baseline`, so rows the estimator gave no advantage (a group with one scorable
    member) neither shrink the std nor get one; the other rows stay at 0. Shapes ``(N,)``.
    ``stats``: as in :func:`compute_advantages`.
    """
    total, count, std = stats(advantages, scorable)
    if count == 0:
        return advantages
    whitened = (advantages - total / count) / (std + eps)
    return torch.where(scorable, whitened, 0.0)


class AdvantageFunction(Protocol):
    """The one signature every estimator's function has (``eps``, ``stats``: as in :func:`compute_advantages`)."""

    def __call__(
        self, rewards: Tensor, group_ids: Tensor, scorable: Tensor, *, eps: float = ..., stats: BatchStats = ...
    ) -> Tensor: ...


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator: its function, and where its baseline and its scale are taken, which is what
    the rest of the step reads about it (which rows get an advantage, whether a group of equal rewards gets 0).
    ``baseline`` / ``scale``: ``group`` (each row's prompt group), ``batch`` or ``none``.

    Called as its function is: ``estimator(rewards, group_ids, scorable, eps=..., stats=...)`` -> ``(N,)``.
    """

    function: AdvantageFunction
    baseline: Level
    scale: Level

    def __post_init__(self) -> None:
        if self.baseline not in LEVELS or self.scale not in LEVELS:
            raise ValueError(f"baseline and scale must be one of {LEVELS}, got {self.baseline!r}, {self.scale!r}")

    @classmethod
    def variant(cls, mean_level: Level, leave_one_out: bool, std_level: Level) -> AdvantageEstimator:
        """:func:`compute_advantages` with these knobs."""
        function = functools.partial(
            compute_advantages, mean_level=mean_level, leave_one_out=leave_one_out, std_level=std_level
        )
        return cls(function, baseline=mean_level, scale=std_level)

    def __call__(self, rewards: Tensor, group_ids: Tensor, scorable: Tensor, **options: Any) -> Tensor:
        return self.function(rewards, group_ids, scorable, **options)

    @property
    def group_baseline(self) -> bool:
        """Whether it subtracts a per-group baseline, so that a group whose rewards are all equal gets 0."""
        return self.baseline == "group"

    def rows_with_baseline(self, group_ids: Tensor, scorable: Tensor) -> Tensor:
        """``(N,)`` bool: the rows it defines an advantage for: scorable, and, where its baseline or scale is
        per group, in a group of at least 2 scorable rows (:func:`_defined`)."""
        index, num_groups = _dense_group_index(group_ids)
        counts = _per_sample_group_sum(scorable.to(torch.float64), index, num_groups)
        return _defined(counts, scorable, self.baseline, self.scale)


class EstimatorRegistry(Registry[AdvantageEstimator]):
    """The advantage estimators: each entry an :class:`AdvantageEstimator`, so its properties travel with it."""

    def add(self, name: str, entry: AdvantageEstimator, formula: str) -> AdvantageEstimator:
        if not isinstance(entry, AdvantageEstimator):
            raise TypeError(
                f"advantage estimator {name!r}: register AdvantageEstimator(function, baseline=..., scale=...) "
                f"(each one of {LEVELS}), not a {type(entry).__name__}: the step reads where its baseline is "
                "taken (which rows get an advantage, whether dynamic sampling may drop a group)"
            )
        return super().add(name, entry, formula)


ADVANTAGE_ESTIMATORS = EstimatorRegistry("advantage estimator")
# name, compute_advantages knobs (mean_level, leave_one_out, std_level), printed formula
_VARIANTS: tuple[tuple[str, Level, bool, Level, str], ...] = (
    ("rloo", "group", True, "none", "A_i = R_i - 1/(K-1) sum_{j!=i} R_j"),  # Ahmadian et al. 2024; TRL
    ("grpo", "group", False, "group", "A_i = (R_i - mean_group R) / (std_group R + 1e-4)"),  # Shao et al. 2024
    ("group_mean", "group", False, "none", "A_i = R_i - mean_group R"),  # Dr. GRPO: no std scaling
    ("reinforce", "none", False, "none", "A_i = R_i"),  # plain REINFORCE, no baseline
    ("reinforce_pp", "batch", False, "batch", "A_i = (R_i - mean_batch R) / (std_batch R + 1e-4)"),  # Hu 2025
    ("reinforce_pp_baseline", "group", False, "batch", "A_i = (R_i - mean_group R) / (std_batch R + 1e-4)"),
)
for _name, _mean, _loo, _std, _formula in _VARIANTS:
    ADVANTAGE_ESTIMATORS.add(_name, AdvantageEstimator.variant(_mean, _loo, _std), _formula)


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """Look an estimator up by name; an unknown name lists the valid ones."""
    return ADVANTAGE_ESTIMATORS.get_entry(name)


def groups_with_signal(rewards: Tensor, group_ids: Tensor, scorable: Tensor, atol: float = 1e-6) -> Tensor:
    """``(G,)`` bool, one per group in sorted group-id order: whether its scorable rewards differ, i.e.
    ``max - min > atol`` over them. A group whose rewards are all equal, or with fewer than 2 scorable
    members, gets advantage 0 from every group baseline: it has no learning signal. Shapes ``(N,)``."""
    index, num_groups = _dense_group_index(group_ids)
    r = rewards.to(torch.float64)
    high = torch.full((num_groups,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(
        0, index[scorable], r[scorable], reduce="amax"
    )
    low = torch.full((num_groups,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(
        0, index[scorable], r[scorable], reduce="amin"
    )
    spread = torch.where(torch.isfinite(high - low), high - low, 0.0)
    return spread > atol


def frac_zero_std_groups(rewards: Tensor, group_ids: Tensor, scorable: Tensor, atol: float = 1e-6) -> float:
    """Fraction of groups whose scorable rewards are all equal (so every advantage is 0): the groups
    :func:`groups_with_signal` finds none in, groups with fewer than 2 scorable members included.
    Shapes ``(N,)``."""
    signal = groups_with_signal(rewards, group_ids, scorable, atol)
    return float((~signal).to(torch.float64).mean()) if signal.numel() else 0.0


def group_baseline(estimator: str) -> bool:
    """Whether ``estimator`` (a registered name) subtracts a per-group baseline, so that a group whose
    rewards are all equal gets advantage 0 (``rloo``, ``grpo``, ``group_mean``, ``reinforce_pp_baseline``)."""
    return get_advantage_estimator(estimator).group_baseline
