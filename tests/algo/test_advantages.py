"""Tests for rloo.algo.advantages: reward combination, clipping, baselines, normalization."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from rloo.algo import advantages
from rloo.algo.advantages import (
    ADVANTAGE_ESTIMATORS,
    LEVELS,
    AdvantageEstimator,
    EstimatorRegistry,
    clip_rewards,
    combine_rewards,
    compute_advantages,
    frac_zero_std_groups,
    get_advantage_estimator,
    group_baseline,
    groups_with_signal,
    normalize_advantages,
    rows_with_baseline,
)

NAN = float("nan")
EPS = 1e-4


def t(values: list[float], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def close(actual: torch.Tensor, expected: list[float] | torch.Tensor, atol: float = 1e-6) -> None:
    expected_t = torch.as_tensor(expected, dtype=actual.dtype)
    torch.testing.assert_close(actual, expected_t, atol=atol, rtol=0.0)


# --------------------------------------------------------------------------- combine_rewards


def test_combine_rewards_weights_and_nan_skipping() -> None:
    rewards_per_func = t([[1.0, 2.0], [NAN, 4.0], [3.0, NAN], [NAN, NAN]], torch.float32)
    weights = t([1.0, 0.5], torch.float32)
    rewards, scorable = combine_rewards(rewards_per_func, weights)
    # row 0: 1*1 + 0.5*2 = 2 ; row 1: 0.5*4 = 2 (f0 skipped) ; row 2: 1*3 = 3 (f1 skipped)
    # row 3: nothing applies -> 0.0 and unscorable
    close(rewards, [2.0, 2.0, 3.0, 0.0])
    assert scorable.tolist() == [True, True, True, False]
    assert not torch.isnan(rewards).any()


def test_combine_rewards_negative_and_zero_weights() -> None:
    rewards_per_func = t([[1.0, 2.0], [NAN, 4.0], [3.0, NAN]])
    rewards, scorable = combine_rewards(rewards_per_func, t([2.0, -1.0]))
    # 2*1 - 2 = 0 ; -4 ; 2*3 = 6
    close(rewards, [0.0, -4.0, 6.0])
    assert scorable.all()
    # A zero weight still makes the row scorable (the function applied), with reward 0*r.
    rewards, scorable = combine_rewards(t([[NAN, 5.0]]), t([1.0, 0.0]))
    close(rewards, [0.0])
    assert scorable.tolist() == [True]


def test_combine_rewards_single_function_none() -> None:
    rewards, scorable = combine_rewards(t([[0.25], [NAN]]), t([4.0]))
    close(rewards, [1.0, 0.0])
    assert scorable.tolist() == [True, False]


def test_combine_rewards_shape_errors() -> None:
    with pytest.raises(ValueError, match=r"\(N, F\)"):
        combine_rewards(t([1.0, 2.0]), t([1.0]))
    with pytest.raises(ValueError, match="one entry per reward function"):
        combine_rewards(t([[1.0, 2.0]]), t([1.0, 1.0, 1.0]))


# --------------------------------------------------------------------------- clip_rewards


def test_clip_rewards() -> None:
    close(clip_rewards(t([-2.0, 0.5, 3.0, -1.0, 2.0]), (-1.0, 2.0)), [-1.0, 0.5, 2.0, -1.0, 2.0])
    close(clip_rewards(t([-2.0, 0.5, 3.0]), (1.0, 1.0)), [1.0, 1.0, 1.0])
    r = t([-7.0, 9.0])
    close(clip_rewards(r, None), [-7.0, 9.0])


def test_clip_rewards_low_above_high() -> None:
    with pytest.raises(ValueError, match="low <= high"):
        clip_rewards(t([0.0]), (2.0, 1.0))


# --------------------------------------------------------------------------- compute_advantages: hand values

# Two groups of K=3:  group 0: r = [1, 2, 6] (sum 9, mean 3);  group 1: r = [0, 0, 3] (sum 3, mean 1).
# Whole batch: sum 12, mean 2, N = 6.
REWARDS = [1.0, 2.0, 6.0, 0.0, 0.0, 3.0]
GROUPS = [0, 0, 0, 1, 1, 1]

# Baselines r_i - b_i, by (mean_level, leave_one_out):
BASE = {
    # group LOO: K/(K-1) (r - mean) = 1.5 * [-2, -1, 3 | -1, -1, 2]
    #   e.g. 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5
    ("group", True): [-3.0, -1.5, 4.5, -1.5, -1.5, 3.0],
    # group mean: r - mean_group
    ("group", False): [-2.0, -1.0, 3.0, -1.0, -1.0, 2.0],
    # batch LOO: N/(N-1) (r - 2) = 1.2 * [-1, 0, 4, -2, -2, 1]
    ("batch", True): [-1.2, 0.0, 4.8, -2.4, -2.4, 1.2],
    # batch mean: r - 2
    ("batch", False): [-1.0, 0.0, 4.0, -2.0, -2.0, 1.0],
    # no baseline (leave_one_out is meaningless without a mean)
    ("none", True): REWARDS,
    ("none", False): REWARDS,
}
# Sample std (ddof=1) of the rewards, per element:
#   group 0: deviations -2,-1,3 -> (4+1+9)/2 = 7 -> sqrt(7) = 2.6457513110645907
#   group 1: deviations -1,-1,2 -> (1+1+4)/2 = 3 -> sqrt(3) = 1.7320508075688772
#   batch:   deviations -1,0,4,-2,-2,1 -> (1+0+16+4+4+1)/5 = 5.2 -> sqrt(5.2) = 2.280350850198276
SQRT7, SQRT3, SQRT52 = 2.6457513110645907, 1.7320508075688772, 2.280350850198276
STD = {
    "group": [SQRT7] * 3 + [SQRT3] * 3,
    "batch": [SQRT52] * 6,
}


@pytest.mark.parametrize("std_level", LEVELS)
@pytest.mark.parametrize("leave_one_out", [True, False])
@pytest.mark.parametrize("mean_level", LEVELS)
def test_compute_advantages_all_combinations(mean_level: str, leave_one_out: bool, std_level: str) -> None:
    base = BASE[(mean_level, leave_one_out)]
    # std "none": no division and no eps
    expected = base if std_level == "none" else [b / (s + EPS) for b, s in zip(base, STD[std_level], strict=True)]
    scorable = torch.ones(6, dtype=torch.bool)
    for dtype in (torch.float32, torch.float64):
        adv = compute_advantages(
            t(REWARDS, dtype),
            torch.tensor(GROUPS),
            scorable,
            mean_level=mean_level,  # type: ignore[arg-type]
            leave_one_out=leave_one_out,
            std_level=std_level,  # type: ignore[arg-type]
        )
        assert adv.dtype == dtype
        close(adv, expected)


# Registry: literal expected advantages on REWARDS/GROUPS.
REGISTRY_EXPECTED = {
    "rloo": [-3.0, -1.5, 4.5, -1.5, -1.5, 3.0],
    # [-2,-1,3]/(sqrt7+1e-4), [-1,-1,2]/(sqrt3+1e-4)
    "grpo": [
        -0.7559003756697406,
        -0.3779501878348703,
        1.133850563504611,
        -0.5773169377806823,
        -0.5773169377806823,
        1.1546338755613645,
    ],
    "group_mean": [-2.0, -1.0, 3.0, -1.0, -1.0, 2.0],
    "reinforce": [1.0, 2.0, 6.0, 0.0, 0.0, 3.0],
    # [-1,0,4,-2,-2,1]/(sqrt5.2+1e-4)
    "reinforce_pp": [
        -0.4385097797275718,
        0.0,
        1.7540391189102873,
        -0.8770195594551436,
        -0.8770195594551436,
        0.4385097797275718,
    ],
    # [-2,-1,3,-1,-1,2]/(sqrt5.2+1e-4)
    "reinforce_pp_baseline": [
        -0.8770195594551436,
        -0.4385097797275718,
        1.3155293391827154,
        -0.4385097797275718,
        -0.4385097797275718,
        0.8770195594551436,
    ],
}


def test_registry_names() -> None:
    assert set(ADVANTAGE_ESTIMATORS) == set(REGISTRY_EXPECTED)


@pytest.mark.parametrize("name", sorted(REGISTRY_EXPECTED))
def test_registry_hand_values(name: str) -> None:
    estimator = get_advantage_estimator(name)
    assert estimator is ADVANTAGE_ESTIMATORS[name]
    adv = estimator(t(REWARDS), torch.tensor(GROUPS), torch.ones(6, dtype=torch.bool))
    close(adv, REGISTRY_EXPECTED[name])


def test_grpo_eps_argument() -> None:
    adv = get_advantage_estimator("grpo")(t([0.0, 2.0]), torch.tensor([0, 0]), torch.ones(2, dtype=torch.bool), eps=1.0)
    # mean 1, std sqrt(2) -> [-1, 1] / (sqrt(2) + 1)
    close(adv, [-0.41421356237309503, 0.41421356237309503])


def test_get_advantage_estimator_unknown_lists_names() -> None:
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'") as info:
        get_advantage_estimator("ppo")
    for name in ADVANTAGE_ESTIMATORS:
        assert repr(name) in str(info.value)


def test_invalid_levels_and_shapes() -> None:
    r, g, v = t([1.0, 2.0]), torch.tensor([0, 0]), torch.ones(2, dtype=torch.bool)
    with pytest.raises(ValueError, match="mean_level and std_level"):
        compute_advantages(r, g, v, mean_level="prompt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mean_level and std_level"):
        compute_advantages(r, g, v, std_level="global")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"must all be \(N,\)"):
        compute_advantages(r, torch.tensor([0, 0, 0]), v)
    with pytest.raises(ValueError, match=r"must all be \(N,\)"):
        compute_advantages(r.reshape(1, 2), g.reshape(1, 2), v.reshape(1, 2))


# --------------------------------------------------------------------------- group ids


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_group_ids_arbitrary_integers_and_shuffled(name: str) -> None:
    estimator = get_advantage_estimator(name)
    scorable = torch.ones(6, dtype=torch.bool)
    reference = estimator(t(REWARDS), torch.tensor(GROUPS), scorable)
    # Same groups, arbitrary (negative, large, non-contiguous) labels, in the reverse label order.
    relabeled = estimator(t(REWARDS), torch.tensor([907, 907, 907, -3, -3, -3]), scorable)
    close(relabeled, reference, atol=1e-12)
    # Interleave the rows: the same advantages follow their completion.
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    shuffled = estimator(t(REWARDS)[perm], torch.tensor([42, 10, 42, 10, 42, 10]), scorable)
    close(shuffled, reference[perm], atol=1e-12)


def test_group_ids_are_not_positions() -> None:
    # Positions [0, 1 | 2, 3] would pair r=0 with r=10; the ids pair 0 with 2 and 10 with 20.
    adv = get_advantage_estimator("rloo")(
        t([0.0, 10.0, 2.0, 20.0]), torch.tensor([5, 6, 5, 6]), torch.ones(4, dtype=torch.bool)
    )
    # group 5: [0, 2] -> [0-2, 2-0] ; group 6: [10, 20] -> [-10, 10]
    close(adv, [-2.0, -10.0, 2.0, 10.0])


# --------------------------------------------------------------------------- unscorable / small groups


def test_partial_unscorable_group_rloo() -> None:
    # Group of 4 with one unscorable completion (its reward value must not matter, not even NaN).
    scorable = torch.tensor([True, True, True, False])
    for junk in (0.0, 100.0, NAN):
        adv = get_advantage_estimator("rloo")(t([1.0, 3.0, 5.0, junk]), torch.tensor([0, 0, 0, 0]), scorable)
        # Valid: [1, 3, 5], mean 3, K=3 -> 1.5 * [-2, 0, 2]; unscorable -> 0
        close(adv, [-3.0, 0.0, 3.0, 0.0])


def test_partial_unscorable_group_grpo_and_batch_stats() -> None:
    rewards = t([1.0, 3.0, 5.0, NAN, 2.0, 4.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    scorable = torch.tensor([True, True, True, False, True, True])
    # grpo: group 0 scorable [1,3,5]: mean 3, std 2 -> [-2,0,2]/2.0001; group 1 [2,4]: mean 3, std sqrt2
    adv = get_advantage_estimator("grpo")(rewards, groups, scorable)
    s2 = 1.4142135623730951
    close(adv, [-2 / 2.0001, 0.0, 2 / 2.0001, 0.0, -1 / (s2 + EPS), 1 / (s2 + EPS)])
    # reinforce_pp: batch of scorable [1,3,5,2,4]: mean 3, deviations [-2,0,2,-1,1] -> var 10/4 = 2.5
    adv = get_advantage_estimator("reinforce_pp")(rewards, groups, scorable)
    s = 1.5811388300841898  # sqrt(2.5)
    close(adv, [-2 / (s + EPS), 0.0, 2 / (s + EPS), 0.0, -1 / (s + EPS), 1 / (s + EPS)])


@pytest.mark.parametrize("name", ["rloo", "grpo", "group_mean", "reinforce_pp_baseline"])
def test_singleton_valid_group_gets_zero(name: str) -> None:
    rewards = t([7.0, 5.0, 1.0, 3.0, 9.0])
    groups = torch.tensor([0, 0, 1, 1, 2])  # group 0: one scorable member ; group 2: size 1
    scorable = torch.tensor([True, False, True, True, True])
    adv = get_advantage_estimator(name)(rewards, groups, scorable)
    assert adv[0].item() == 0.0 and adv[1].item() == 0.0 and adv[4].item() == 0.0
    # group 1 [1, 3] still gets a real advantage
    assert adv[2].item() < 0.0 < adv[3].item()


def test_singleton_with_group_std_only() -> None:
    # std taken per group -> a singleton group gets 0 even with no group baseline.
    adv = compute_advantages(t([4.0, 1.0, 3.0]), torch.tensor([0, 1, 1]), torch.ones(3, dtype=torch.bool),
                             mean_level="none", leave_one_out=False, std_level="group")  # fmt: skip
    # group 1: std of [1, 3] is sqrt(2)
    close(adv, [0.0, 1 / (1.4142135623730951 + EPS), 3 / (1.4142135623730951 + EPS)])


def test_reinforce_singleton_keeps_reward() -> None:
    adv = get_advantage_estimator("reinforce")(t([4.0, 2.0]), torch.tensor([0, 1]), torch.tensor([True, False]))
    close(adv, [4.0, 0.0])


def test_all_unscorable_group() -> None:
    adv = get_advantage_estimator("rloo")(
        t([0.0, 0.0, 1.0, 2.0]), torch.tensor([0, 0, 1, 1]), torch.tensor([False, False, True, True])
    )
    close(adv, [0.0, 0.0, -1.0, 1.0])


def test_leave_one_out_needs_two_generations() -> None:
    scorable = torch.ones(3, dtype=torch.bool)
    with pytest.raises(ValueError, match="num_generations"):
        get_advantage_estimator("rloo")(t([1.0, 2.0, 3.0]), torch.tensor([0, 1, 2]), scorable)
    with pytest.raises(ValueError, match="num_generations"):
        compute_advantages(t([1.0]), torch.tensor([4]), torch.ones(1, dtype=torch.bool))
    # Not an error: one group of 2 exists; the singletons get 0.
    adv = get_advantage_estimator("rloo")(t([1.0, 2.0, 3.0]), torch.tensor([0, 1, 1]), scorable)
    close(adv, [0.0, -1.0, 1.0])
    # Not an error for estimators without a leave-one-out baseline.
    close(get_advantage_estimator("grpo")(t([1.0, 2.0]), torch.tensor([0, 1]), scorable[:2]), [0.0, 0.0])
    close(get_advantage_estimator("reinforce")(t([1.0, 2.0]), torch.tensor([0, 1]), scorable[:2]), [1.0, 2.0])


def test_empty_batch() -> None:
    empty = torch.zeros(0, dtype=torch.float64)
    adv = get_advantage_estimator("rloo")(empty, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.bool))
    assert adv.shape == (0,)


# --------------------------------------------------------------------------- normalize_advantages


def test_normalize_advantages_hand_values() -> None:
    # mean 2.5, deviations [-1.5,-0.5,0.5,1.5], var 5/3, std 1.2909944487358056
    adv = normalize_advantages(t([1.0, 2.0, 3.0, 4.0]), torch.ones(4, dtype=torch.bool))
    s = 1.2909944487358056 + EPS
    close(adv, [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s])


def test_normalize_advantages_skips_invalid() -> None:
    # scorable [1, 3]: mean 2, std sqrt(2); the invalid 99 enters no statistic and stays 0
    adv = normalize_advantages(t([1.0, 99.0, 3.0]), torch.tensor([True, False, True]))
    s = 1.4142135623730951 + EPS
    close(adv, [-1 / s, 0.0, 1 / s])
    adv = normalize_advantages(t([1.0, 99.0, 3.0]), torch.tensor([True, False, True]), eps=1.0)
    close(adv, [-1 / 2.4142135623730951, 0.0, 1 / 2.4142135623730951])


def test_normalize_advantages_degenerate() -> None:
    # nothing scorable -> unchanged ; one scorable -> 0 (no spread to scale by)
    close(normalize_advantages(t([1.0, 2.0]), torch.tensor([False, False])), [1.0, 2.0])
    close(normalize_advantages(t([5.0, 2.0]), torch.tensor([True, False])), [0.0, 0.0])


# --------------------------------------------------------------------------- frac_zero_std_groups


def test_frac_zero_std_groups() -> None:
    rewards = t([1.0, 1.0, 1.0, 2.0, 5.0, 7.0, 3.0, 3.0, 3.0000001, 0.0, 9.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 3, 4, 4])
    scorable = torch.tensor([True, True, True, True, True, False, True, True, True, False, False])
    # g0 equal -> zero ; g1 [1,2] -> not ; g2 one scorable -> zero ; g3 spread 1e-7 <= 1e-6 -> zero ;
    # g4 no scorable -> zero.  4 of 5.
    assert frac_zero_std_groups(rewards, groups, scorable) == pytest.approx(0.8, abs=1e-12)
    # with a tighter tolerance g3 is no longer zero-std: 3 of 5
    assert frac_zero_std_groups(rewards, groups, scorable, atol=1e-9) == pytest.approx(0.6, abs=1e-12)
    # the invalid 7.0 in g2 and 9.0 in g4 would make them non-zero-std if counted
    all_valid = torch.ones(11, dtype=torch.bool)
    assert frac_zero_std_groups(rewards, groups, all_valid) == pytest.approx(0.4, abs=1e-12)


def test_frac_zero_std_groups_none_and_shuffled_ids() -> None:
    scorable = torch.ones(4, dtype=torch.bool)
    assert frac_zero_std_groups(t([1.0, 2.0, 3.0, 4.0]), torch.tensor([9, 9, -1, -1]), scorable) == 0.0
    assert frac_zero_std_groups(t([1.0, 2.0, 2.0, 4.0]), torch.tensor([9, -1, 9, -1]), scorable) == 0.0
    assert frac_zero_std_groups(t([2.0, 1.0, 2.0, 4.0]), torch.tensor([9, -1, 9, -1]), scorable) == 0.5


# --------------------------------------------------------------------------- properties


@st.composite
def grouped_batches(draw: st.DrawFn, min_size: int = 1, all_valid: bool = False) -> dict[str, list]:
    """Groups of random sizes, random rewards/validity, shuffled rows, arbitrary integer ids."""
    sizes = draw(st.lists(st.integers(min_size, 6), min_size=1, max_size=6))
    labels = draw(st.lists(st.integers(-1000, 1000), min_size=len(sizes), max_size=len(sizes), unique=True))
    ids = [label for label, size in zip(labels, sizes, strict=True) for _ in range(size)]
    n = len(ids)
    rewards = draw(st.lists(st.floats(-10, 10, allow_nan=False), min_size=n, max_size=n))
    scorable = [True] * n if all_valid else draw(st.lists(st.booleans(), min_size=n, max_size=n))
    order = draw(st.permutations(range(n)))
    return {
        "rewards": [rewards[i] for i in order],
        "ids": [ids[i] for i in order],
        "scorable": [scorable[i] for i in order],
    }


def reference_advantages(
    rewards: list[float],
    ids: list[int],
    scorable: list[bool],
    mean_level: str,
    leave_one_out: bool,
    std_level: str,
    eps: float = EPS,
) -> list[float]:
    """Slow, loop-by-loop statement of the documented rule."""
    n = len(rewards)
    everyone = [j for j in range(n) if scorable[j]]
    out = [0.0] * n
    for i in range(n):
        if not scorable[i]:
            continue
        mates = [j for j in range(n) if scorable[j] and ids[j] == ids[i]]
        if "group" in (mean_level, std_level) and len(mates) < 2:
            continue
        if mean_level == "none":
            baseline = 0.0
        else:
            pool = mates if mean_level == "group" else everyone
            if leave_one_out:
                baseline = sum(rewards[j] for j in pool if j != i) / (len(pool) - 1)
            else:
                baseline = sum(rewards[j] for j in pool) / len(pool)
        a = rewards[i] - baseline
        if std_level != "none":
            pool = mates if std_level == "group" else everyone
            m = sum(rewards[j] for j in pool) / len(pool)
            std = math.sqrt(sum((rewards[j] - m) ** 2 for j in pool) / (len(pool) - 1))
            a /= std + eps
        out[i] = a
    return out


@pytest.mark.parametrize("std_level", LEVELS)
@pytest.mark.parametrize("leave_one_out", [True, False])
@pytest.mark.parametrize("mean_level", LEVELS)
@given(batch=grouped_batches())
def test_matches_loop_reference(batch: dict[str, list], mean_level: str, leave_one_out: bool, std_level: str) -> None:
    # Batch-level statistics with fewer than 2 scorable completions in the whole batch are not
    # defined by the documented formula; leave them out.
    assume(sum(batch["scorable"]) >= 2)
    rewards, ids, scorable = t(batch["rewards"]), torch.tensor(batch["ids"]), torch.tensor(batch["scorable"])
    kwargs = {"mean_level": mean_level, "leave_one_out": leave_one_out, "std_level": std_level}
    sizes = {i: batch["ids"].count(i) for i in batch["ids"]}
    if leave_one_out and mean_level == "group" and max(sizes.values()) < 2:
        with pytest.raises(ValueError, match="num_generations"):
            compute_advantages(rewards, ids, scorable, **kwargs)  # type: ignore[arg-type]
        return
    actual = compute_advantages(rewards, ids, scorable, **kwargs)  # type: ignore[arg-type]
    expected = reference_advantages(batch["rewards"], batch["ids"], batch["scorable"], **kwargs)  # type: ignore[arg-type]
    torch.testing.assert_close(actual, t(expected), atol=1e-8, rtol=1e-8)


def _group_sums(values: torch.Tensor, ids: list[int]) -> dict[int, float]:
    sums: dict[int, float] = {}
    for v, g in zip(values.tolist(), ids, strict=True):
        sums[g] = sums.get(g, 0.0) + v
    return sums


@given(batch=grouped_batches(min_size=2))
def test_loo_advantages_sum_to_zero_per_group(batch: dict[str, list]) -> None:
    rewards, ids, scorable = t(batch["rewards"]), torch.tensor(batch["ids"]), torch.tensor(batch["scorable"])
    adv = get_advantage_estimator("rloo")(rewards, ids, scorable)
    assert (adv[~scorable] == 0).all()
    for total in _group_sums(adv, batch["ids"]).values():
        assert abs(total) < 1e-9


@given(batch=grouped_batches(min_size=2, all_valid=True))
def test_loo_equals_scaled_deviation_from_group_mean(batch: dict[str, list]) -> None:
    rewards, ids = batch["rewards"], batch["ids"]
    adv = get_advantage_estimator("rloo")(t(rewards), torch.tensor(ids), torch.ones(len(ids), dtype=torch.bool))
    sums = _group_sums(t(rewards), ids)
    for i, (r, g) in enumerate(zip(rewards, ids, strict=True)):
        k = ids.count(g)
        expected = k / (k - 1) * (r - sums[g] / k)
        assert adv[i].item() == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("name", ["rloo", "grpo", "group_mean"])
@given(batch=grouped_batches(min_size=2), shifts=st.lists(st.floats(-50, 50), min_size=6, max_size=6))
def test_per_group_constant_leaves_advantages_unchanged(name: str, batch: dict[str, list], shifts: list[float]) -> None:
    rewards, ids, scorable = t(batch["rewards"]), torch.tensor(batch["ids"]), torch.tensor(batch["scorable"])
    labels = sorted(set(batch["ids"]))
    shift = t([shifts[labels.index(g)] for g in batch["ids"]])
    estimator = get_advantage_estimator(name)
    torch.testing.assert_close(
        estimator(rewards + shift, ids, scorable), estimator(rewards, ids, scorable), atol=1e-7, rtol=0
    )


@given(batch=grouped_batches(min_size=2, all_valid=True), c=st.floats(1.0, 50.0))
def test_per_group_constant_changes_reinforce(batch: dict[str, list], c: float) -> None:
    # Sanity check that the invariance above is not vacuous: no baseline -> shifted.
    rewards, ids = t(batch["rewards"]), torch.tensor(batch["ids"])
    scorable = torch.ones(len(ids), dtype=torch.bool)
    estimator = get_advantage_estimator("reinforce")
    torch.testing.assert_close(estimator(rewards + c, ids, scorable), estimator(rewards, ids, scorable) + c)


# ------------------------------------------------------------ GDPO's normalize_then_sum (several rewards)
def test_normalize_then_sum_normalizes_each_function_within_its_group() -> None:
    from rloo.algo.advantages import normalize_then_sum

    nan = float("nan")
    scores = torch.tensor([[1.0, 0.0], [0.0, nan], [1.0, 1.0], [3.0, 5.0]])
    out = normalize_then_sum(scores, torch.tensor([1.0, 2.0]), torch.tensor([0, 0, 0, 1]))
    # group 0, f0 = (1, 0, 1): mean 2/3, std 1/sqrt(3); f1 = (0, -, 1) over the 2 rows it applies to: mean 1/2,
    # std 1/sqrt(2); group 1 has one row: std 0, each normalized score 0
    s0, s1 = 1 / math.sqrt(3) + 1e-4, 1 / math.sqrt(2) + 1e-4
    expected = [(1 / 3) / s0 + 2 * (-0.5 / s1), (-2 / 3) / s0, (1 / 3) / s0 + 2 * (0.5 / s1), 0.0]
    assert out.tolist() == pytest.approx(expected, abs=1e-6)


@given(st.lists(st.floats(-5, 5), min_size=2, max_size=6), st.integers(0, 5))
def test_normalize_then_sum_is_finite_whatever_applies(values: list[float], missing: int) -> None:
    """A function that does not apply to some completions (None -> NaN) never makes the group's result NaN
    (the bug ms-swift#8123 reports); a group whose every completion lacks it contributes 0 for it."""
    from rloo.algo.advantages import normalize_then_sum

    n = len(values)
    second = [float("nan") if i <= missing else v for i, v in enumerate(values)]
    scores = torch.tensor([values, second]).T
    out = normalize_then_sum(scores, torch.tensor([1.0, 1.0]), torch.zeros(n, dtype=torch.long))
    assert torch.isfinite(out).all()
    alone = normalize_then_sum(scores[:, :1], torch.tensor([1.0]), torch.zeros(n, dtype=torch.long))
    if missing >= n - 1:  # the second function applies to at most one completion: it adds nothing
        assert torch.allclose(out, alone)


def test_groups_with_signal_in_sorted_group_order() -> None:
    rewards = t([1.0, 1.0, 0.0, 1.0, 5.0, 7.0, 3.0, 3.0000001, 2.0, 2.0])
    groups = torch.tensor([4, 4, 1, 1, 2, 2, 3, 3, 0, 0])
    scorable = torch.tensor([True, True, True, True, True, False, True, True, True, True])
    # g0 [2, 2] equal; g1 [0, 1] differ; g2 one scorable (7.0 unscorable); g3 spread 1e-7 <= 1e-6; g4 [1, 1] equal
    assert groups_with_signal(rewards, groups, scorable).tolist() == [False, True, False, False, False]
    assert groups_with_signal(rewards, groups, scorable, atol=1e-9).tolist() == [False, True, False, True, False]
    assert groups_with_signal(rewards, groups, torch.ones(10, dtype=torch.bool))[2]  # 5 vs 7 once 7 counts
    assert frac_zero_std_groups(rewards, groups, scorable) == pytest.approx(0.8, abs=1e-12)  # its complement


def test_group_baseline_names_the_estimators_that_zero_an_equal_group() -> None:
    with_group_mean = {name for name in ADVANTAGE_ESTIMATORS if group_baseline(name)}
    assert with_group_mean == {"rloo", "grpo", "group_mean", "reinforce_pp_baseline"}
    equal = torch.tensor([1.0, 1.0, 0.0, 1.0])
    groups, scorable = torch.tensor([0, 0, 1, 1]), torch.ones(4, dtype=torch.bool)
    for name in ADVANTAGE_ESTIMATORS:  # what the name promises: group 0 gets 0 exactly when it has one
        zeroed = bool((get_advantage_estimator(name)(equal, groups, scorable)[:2] == 0).all())
        assert zeroed == group_baseline(name), name


# --------------------------------------------------------------------------- a new estimator


def median_baseline(
    rewards: torch.Tensor, group_ids: torch.Tensor, scorable: torch.Tensor, *, eps: float = EPS, stats: object = None
) -> torch.Tensor:
    """``A_i = r_i - median of i's group`` (scorable rows; 0 in a group of fewer than 2): no compute_advantages knob."""
    out = torch.zeros_like(rewards)
    for group in group_ids.unique():
        rows = (group_ids == group) & scorable
        if rows.sum() >= 2:
            out[rows] = rewards[rows] - rewards[rows].median()
    return out


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> EstimatorRegistry:
    """A copy of the registry for one test (entries cannot be removed from the real one)."""
    fresh = EstimatorRegistry("advantage estimator")
    for name in ADVANTAGE_ESTIMATORS:
        fresh.add(name, ADVANTAGE_ESTIMATORS[name], ADVANTAGE_ESTIMATORS.formula(name))
    monkeypatch.setattr(advantages, "ADVANTAGE_ESTIMATORS", fresh)
    return fresh


def test_an_estimator_that_is_no_compute_advantages_variant_carries_its_own_properties(
    registry: EstimatorRegistry,
) -> None:
    # before, the properties sat in a side table keyed by the built-in names: rows_with_baseline and
    # group_baseline raised KeyError for any other estimator
    registry.add("median", AdvantageEstimator(median_baseline, baseline="group", scale="none"), "A_i = R_i - med_g R")
    rewards, groups = t([1.0, 2.0, 6.0, 3.0, 5.0]), torch.tensor([0, 0, 0, 1, 1])
    scorable = torch.tensor([True, True, True, True, False])  # group 1 keeps one scorable row
    adv = get_advantage_estimator("median")(rewards, groups, scorable)
    close(adv, [-1.0, 0.0, 4.0, 0.0, 0.0])
    assert rows_with_baseline("median", groups, scorable).tolist() == [True, True, True, False, False]
    assert group_baseline("median")
    close(normalize_advantages(adv, rows_with_baseline("median", groups, scorable))[3:], [0.0, 0.0])
    registry.add("raw", AdvantageEstimator(median_baseline, baseline="none", scale="none"), "A_i = R_i - med_g R")
    assert rows_with_baseline("raw", groups, scorable).tolist() == scorable.tolist()
    assert not group_baseline("raw")


def test_an_estimator_is_registered_with_its_properties(registry: EstimatorRegistry) -> None:
    with pytest.raises(TypeError, match=r"register AdvantageEstimator\(function, baseline=\.\.\., scale=\.\.\.\)"):
        registry.add("bare", median_baseline, "A_i = R_i - med_g R")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="baseline and scale must be one of"):
        AdvantageEstimator(median_baseline, baseline="prompt", scale="none")  # type: ignore[arg-type]


def test_the_built_in_estimators_declare_their_baselines() -> None:
    declared = {
        name: (ADVANTAGE_ESTIMATORS[name].baseline, ADVANTAGE_ESTIMATORS[name].scale) for name in REGISTRY_EXPECTED
    }
    assert declared == {
        "rloo": ("group", "none"),
        "grpo": ("group", "group"),
        "group_mean": ("group", "none"),
        "reinforce": ("none", "none"),
        "reinforce_pp": ("batch", "batch"),
        "reinforce_pp_baseline": ("group", "batch"),
    }
