"""Tests for rloo.algo.masks: completion masks from EOS, truncation."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from rloo.algo.masks import completion_mask_from_ids, mask_truncated

EOS, PAD = 2, 0


def ids(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)


def test_eos_in_middle_first_and_last() -> None:
    completion_ids = ids(
        [
            [5, 6, EOS, 7, PAD],  # EOS at t=2: keep 0..2 (EOS included); 7 was sampled past EOS
            [EOS, 5, 6, 7, 8],  # EOS first: only the EOS counts
            [5, 6, 7, 8, EOS],  # EOS last: all tokens, not truncated
            [5, EOS, EOS, PAD, PAD],  # two EOS: the first one ends it
        ]
    )
    mask, truncated = completion_mask_from_ids(completion_ids, [EOS])
    assert mask.dtype == torch.float32
    assert mask.tolist() == [
        [1.0, 1.0, 1.0, 0.0, 0.0],
        [1.0, 0.0, 0.0, 0.0, 0.0],
        [1.0, 1.0, 1.0, 1.0, 1.0],
        [1.0, 1.0, 0.0, 0.0, 0.0],
    ]
    assert truncated.tolist() == [False, False, False, False]


def test_no_eos_is_truncated() -> None:
    mask, truncated = completion_mask_from_ids(ids([[5, 6, 7], [5, EOS, 7], [PAD, PAD, PAD]]), [EOS])
    # Without EOS every token counts (padding id is not an end marker) and the row is truncated.
    assert mask.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    assert truncated.tolist() == [True, False, True]


def test_several_eos_ids() -> None:
    completion_ids = ids([[5, 9, EOS, PAD], [5, 6, EOS, 9], [5, 6, 7, 8], [9, 5, 5, 5]])
    mask, truncated = completion_mask_from_ids(completion_ids, [EOS, 9])
    # row 0: first end marker is 9 at t=1 ; row 1: EOS at t=2 ; row 2: none ; row 3: 9 at t=0
    assert mask.tolist() == [
        [1.0, 1.0, 0.0, 0.0],
        [1.0, 1.0, 1.0, 0.0],
        [1.0, 1.0, 1.0, 1.0],
        [1.0, 0.0, 0.0, 0.0],
    ]
    assert truncated.tolist() == [False, False, True, False]
    # the same ids with only EOS as end marker
    mask, truncated = completion_mask_from_ids(completion_ids, (EOS,))
    assert mask.tolist()[0] == [1.0, 1.0, 1.0, 0.0]
    assert mask.tolist()[3] == [1.0, 1.0, 1.0, 1.0]
    assert truncated.tolist() == [False, False, True, True]


def test_mask_truncated() -> None:
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    truncated = torch.tensor([True, False, False])
    out = mask_truncated(mask, truncated)
    assert out.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    assert out.dtype == mask.dtype
    # nothing truncated: unchanged ; integer masks keep their dtype
    int_mask = mask.long()
    out = mask_truncated(int_mask, torch.tensor([False, False, True]))
    assert out.dtype == torch.long
    assert out.tolist() == [[1, 1, 1], [1, 1, 0], [0, 0, 0]]


def test_mask_then_truncate_pipeline() -> None:
    mask, truncated = completion_mask_from_ids(ids([[5, EOS, 5], [5, 5, 5]]), [EOS])
    assert mask_truncated(mask, truncated).tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]


def trl_completion_mask(completion_ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """TRL 1.13's EOS masking, verbatim (RLOOTrainer._generate, transformers path)."""
    is_eos = completion_ids == eos_token_id
    eos_idx = torch.full((is_eos.size(0),), is_eos.size(1), dtype=torch.long)
    eos_idx[is_eos.any(dim=1)] = is_eos.int().argmax(dim=1)[is_eos.any(dim=1)]
    sequence_indices = torch.arange(is_eos.size(1)).expand(is_eos.size(0), -1)
    return (sequence_indices <= eos_idx.unsqueeze(1)).int()


@given(
    rows=st.integers(1, 6).flatmap(
        lambda t: st.lists(st.lists(st.integers(0, 4), min_size=t, max_size=t), min_size=1, max_size=5)
    )
)
def test_matches_trl_masking(rows: list[list[int]]) -> None:
    completion_ids = ids(rows)
    mask, truncated = completion_mask_from_ids(completion_ids, [EOS])
    assert torch.equal(mask, trl_completion_mask(completion_ids, EOS).float())
    assert truncated.tolist() == [EOS not in row for row in rows]
    # lengths: up to and including the first EOS, else the whole row
    lengths = [row.index(EOS) + 1 if EOS in row else len(row) for row in rows]
    assert mask.sum(dim=1).tolist() == lengths
