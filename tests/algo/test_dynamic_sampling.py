"""Tests for rloo.algo.dynamic_sampling: which drawn groups fill a batch, and when to draw another round."""

from __future__ import annotations

import pytest
import torch

from rloo.algo.dynamic_sampling import needs_another_round, select_groups


def flags(text: str) -> torch.Tensor:
    """``"10110"`` -> ``[True, False, True, True, False]``: one character per drawn group."""
    return torch.tensor([c == "1" for c in text], dtype=torch.bool)


@pytest.mark.parametrize(
    ("signal", "target", "chosen"),
    [
        ("1111", 4, [0, 1, 2, 3]),  # every group teaches: the batch as drawn
        ("0101" + "1100", 4, [1, 3, 4, 5]),  # round 2 completes round 1's two
        ("0101" + "1111", 4, [1, 3, 4, 5]),  # the surplus of round 2 (6, 7) is dropped, not carried over
        ("0100" + "0010", 4, [0, 1, 2, 6]),  # too few (1 and 6): the earliest without a signal fill it (0, 2)
        ("0000" + "0000", 4, [0, 1, 2, 3]),  # none: the first round, as without dynamic sampling
        ("10" + "01" + "11", 3, [0, 3, 4]),  # three rounds of two
    ],
)
def test_select_groups_hand_computed(signal: str, target: int, chosen: list[int]) -> None:
    assert select_groups(flags(signal), target).tolist() == chosen


def test_select_groups_refuses_too_few_or_non_boolean_groups() -> None:
    with pytest.raises(ValueError, match="3 groups were drawn, fewer than the 4"):
        select_groups(flags("111"), 4)
    with pytest.raises(ValueError, match=r"\(G,\) bool tensor"):
        select_groups(torch.tensor([1, 0, 1]), 2)


@pytest.mark.parametrize(
    ("found", "rounds", "more"),
    [(0, 0, True), (3, 1, True), (4, 1, False), (9, 2, False), (3, 3, False)],
)
def test_another_round_until_the_batch_is_full_or_the_limit(found: int, rounds: int, more: bool) -> None:
    assert needs_another_round(found, target=4, rounds=rounds, max_rounds=3) is more
