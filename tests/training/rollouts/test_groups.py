"""Whole groups of a scored batch (rloo.training.rollouts.groups): taken, joined, counted, moved."""

from __future__ import annotations

import dataclasses

import torch

from rloo.rewards.reward_log import RewardLog
from rloo.training.rollouts.groups import join, take_groups, to_device, with_totals
from tests.helpers.scored import PAD, batch


def test_taking_groups_keeps_every_row_field_with_its_group() -> None:
    scored = batch(first=10, groups=3, k=2, prompt_width=2, completion_width=3)
    taken = take_groups(scored, [2, 0])
    rows = [4, 5, 0, 1]  # group 2's two rows, then group 0's
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated", "group_ids"):
        assert torch.equal(getattr(taken.rollout, name), getattr(scored.rollout, name)[rows]), name
    assert taken.rollout.group_ids.tolist() == [12, 12, 10, 10]
    assert taken.prompts == ["prompt 12", "prompt 10"] and taken.images == [["image 12"], ["image 10"]]
    assert taken.completion_texts == ["text 12.0", "text 12.1", "text 10.0", "text 10.1"]
    assert [e.turns for e in taken.episodes or []] == [1200, 1201, 1000, 1001]
    assert taken.rewards.rewards.tolist() == [120.0, 121.0, 100.0, 101.0]
    assert taken.rewards.scores.values[:, 0].tolist() == [120.0, 121.0, 100.0, 101.0]
    assert taken.rewards.log.extra["note"] == ["row 12.0", "row 12.1", "row 10.0", "row 10.1"]
    assert taken.rollout.vision is not None and taken.rollout.vision.images[0]["pixel_values"][0, 0] == 12.0
    assert taken.num_truncated_prompts == 10 and taken.policy_version == 3  # per batch: left as it was


def test_taking_every_group_and_joining_them_gives_the_batch_back() -> None:
    scored = batch(first=0, groups=3, k=2, prompt_width=2, completion_width=3)
    rejoined = with_totals(join([take_groups(scored, [g]) for g in range(3)], PAD), [scored])
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated", "group_ids"):
        assert torch.equal(getattr(rejoined.rollout, name), getattr(scored.rollout, name)), name
    assert torch.equal(rejoined.rollout.sampling_logprobs, scored.rollout.sampling_logprobs)
    assert rejoined.rewards.scores.nonfinite_counts == [0] and rejoined.rewards.log.metrics == {"calls": [0.0]}
    assert dataclasses.replace(rejoined, rollout=scored.rollout, rewards=scored.rewards) == dataclasses.replace(
        scored, rollout=scored.rollout, rewards=scored.rewards
    )


def test_joining_pads_prompts_left_and_completions_right_with_masks_of_zero() -> None:
    narrow, wide = (
        batch(0, 1, 2, prompt_width=1, completion_width=2),
        batch(5, 1, 2, prompt_width=3, completion_width=4),
    )
    joined = join([narrow, wide], PAD)
    r = joined.rollout
    assert r.prompt_ids.shape == (4, 3) and r.completion_ids.shape == (4, 4)
    assert r.prompt_ids[:2, :2].eq(PAD).all() and r.prompt_mask[:2, :2].eq(0).all()  # left
    assert torch.equal(r.prompt_ids[:2, 2], narrow.rollout.prompt_ids[:, 0])
    assert r.completion_ids[:2, 2:].eq(PAD).all() and r.completion_mask[:2, 2:].eq(0).all()  # right
    assert r.sampling_logprobs[:2, 2:].eq(0).all() and r.tool_mask is not None and r.tool_mask[:2, 2:].eq(0).all()
    assert torch.equal(r.completion_mask[2:], wide.rollout.completion_mask)
    assert r.num_tokens == narrow.rollout.num_tokens + wide.rollout.num_tokens  # no padding counted
    assert r.vision is not None and r.vision.token_types["token_type_ids"].shape == (4, 3)
    assert [int(row["pixel_values"][0, 0]) for row in r.vision.images] == [0, 0, 5, 5]
    assert joined.prompts == ["prompt 0", "prompt 5"] and joined.rewards.rewards.tolist() == [0.0, 1.0, 50.0, 51.0]
    # whole batches: their counts add up
    assert joined.num_truncated_prompts == 5 and joined.rewards.scores.failed_counts == [2]
    assert joined.rewards.scores.nonfinite_counts == [5] and joined.rewards.log.metrics == {"calls": [0.0, 5.0]}
    assert joined.generate_seconds == 2.0 and joined.score_seconds == 1.0


def test_a_column_one_part_did_not_log_is_none_on_its_rows_and_missing_tool_masks_are_the_completion() -> None:
    logged, plain = batch(0, 1, 2, 1, 2), batch(1, 1, 2, 1, 2)
    plain = dataclasses.replace(
        plain,
        rollout=dataclasses.replace(plain.rollout, tool_mask=None),
        rewards=dataclasses.replace(plain.rewards, log=RewardLog()),
    )
    joined = join([logged, plain], PAD)
    assert joined.rewards.log.extra == {"note": ["row 0.0", "row 0.1", None, None]}
    assert joined.rollout.tool_mask is not None
    assert torch.equal(joined.rollout.model_mask[2:], plain.rollout.completion_mask)


def test_totals_count_every_round_not_the_groups_taken() -> None:
    first, second = batch(0, 2, 2, 1, 2), batch(2, 2, 2, 1, 2)
    picked = join([take_groups(first, [1]), take_groups(second, [0]), take_groups(second, [1])], PAD)
    assert picked.rewards.scores.nonfinite_counts == [4]  # second's batch count twice: what with_totals fixes
    total = with_totals(picked, [first, second])
    assert total.rewards.scores.nonfinite_counts == [2] and total.rewards.scores.failed_counts == [2]
    assert total.num_truncated_prompts == 2 and total.rewards.log.metrics == {"calls": [0.0, 2.0]}
    assert total.generate_seconds == 2.0 and torch.equal(total.rollout.group_ids, torch.tensor([1, 1, 2, 2, 3, 3]))


def test_moving_to_a_device_moves_every_tensor() -> None:
    scored = batch(0, 2, 2, 1, 2)
    moved = to_device(scored, torch.device("meta"))
    assert moved.rollout.completion_ids.is_meta and moved.rollout.group_ids.is_meta and moved.rewards.scorable.is_meta
    assert moved.rollout.vision is not None and moved.rollout.vision.images[0]["pixel_values"].is_meta
    assert moved.rewards.scores.values.is_meta and moved.completion_texts == scored.completion_texts
