"""Whole groups of scored rollouts: taken out of a batch, joined into one, moved between devices.

Dynamic sampling (:mod:`rloo.training.rollouts.dynamic_sampling`) trains on groups drawn over several
generation rounds, possibly on another process than the one that sampled them. A group is a prompt's K
consecutive rows; everything per row (tokens, masks, log-probs, rewards, episodes, logged columns) and
per prompt (the prompt, its images) moves with it. Joined batches are padded as the sampler pads: prompts
on the left, completions on the right, with the pad token and a mask of 0, so no sum over tokens changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from rloo.generation.rollout import concat_rollouts
from rloo.pipeline import ScoredRollout
from rloo.rewards.calling import CombinedRewards, RewardScores
from rloo.rewards.reward_log import RewardLog

# the (N, ...) tensors of a Rollout, indexed by row (take_groups)
_ROW_TENSORS = (
    "prompt_ids",
    "prompt_mask",
    "completion_ids",
    "completion_mask",
    "truncated",
    "sampling_logprobs",
    "group_ids",
)


def take_groups(scored: ScoredRollout, groups: Sequence[int]) -> ScoredRollout:
    """The groups at positions ``groups`` (0..P-1, in the batch's order) of ``scored``, in that order.
    What is counted per batch (truncated prompts, failed and non-finite rewards, logged scalars,
    seconds) stays the whole batch's: :func:`with_totals` sets it for a joined batch."""
    n = len(scored.completion_texts)
    k = n // len(scored.prompts)
    rows = [g * k + j for g in groups for j in range(k)]
    rollout, rewards = scored.rollout, scored.rewards
    index = torch.tensor(rows, dtype=torch.long, device=rollout.completion_ids.device)
    picked = dataclasses.replace(
        rollout,
        **{name: getattr(rollout, name)[index] for name in _ROW_TENSORS},
        vision=None if rollout.vision is None else rollout.vision.select(index),
        tool_mask=None if rollout.tool_mask is None else rollout.tool_mask[index],
    )
    scores = dataclasses.replace(rewards.scores, values=rewards.scores.values[index.to(rewards.scores.values.device)])
    extra = {column: [values[i] for i in rows] for column, values in rewards.log.extra.items() if len(values) == n}
    log = RewardLog(extra, rewards.log.metrics)
    return dataclasses.replace(
        scored,
        rollout=picked,
        prompts=[scored.prompts[g] for g in groups],
        completion_texts=[scored.completion_texts[i] for i in rows],
        rewards=CombinedRewards(scores, rewards.rewards[index], rewards.scorable[index], log),
        images=None if scored.images is None else [scored.images[g] for g in groups],
        episodes=None if scored.episodes is None else [scored.episodes[i] for i in rows],
    )


def join(parts: Sequence[ScoredRollout], pad_token_id: int) -> ScoredRollout:
    """``parts``' groups, in order, as one batch (at least one part), their per-batch counts summed: right for
    whole batches; for groups taken from batches (:func:`take_groups`), set them with :func:`with_totals`."""
    if len(parts) == 1:
        return parts[0]
    rollout = concat_rollouts([part.rollout for part in parts], pad_token_id)
    return with_totals(
        ScoredRollout(
            rollout=rollout,
            prompts=[prompt for part in parts for prompt in part.prompts],
            completion_texts=[text for part in parts for text in part.completion_texts],
            rewards=_join_rewards([part.rewards for part in parts], [len(part.completion_texts) for part in parts]),
            num_truncated_prompts=0,
            generate_seconds=0.0,
            score_seconds=0.0,
            policy_version=parts[0].policy_version,
            images=None if parts[0].images is None else [image for part in parts for image in part.images or []],
            episodes=None if parts[0].episodes is None else [e for part in parts for e in part.episodes or []],
        ),
        parts,
    )


def with_totals(batch: ScoredRollout, rounds: Sequence[ScoredRollout]) -> ScoredRollout:
    """``batch`` with the per-batch counts summed over ``rounds``: truncated prompts, non-finite and failed
    rewards, the reward functions' logged scalars, the seconds spent sampling and scoring. Dynamic sampling
    gives it every generation round of this process: they describe what was generated (what the warnings
    are about), not only what is trained."""
    rewards = batch.rewards
    scores = [r.rewards.scores for r in rounds]
    totals = RewardScores(
        values=rewards.scores.values,
        nonfinite_counts=[sum(counts) for counts in zip(*(s.nonfinite_counts for s in scores), strict=True)],
        failed_counts=[sum(counts) for counts in zip(*(s.failed_counts for s in scores), strict=True)],
    )
    metrics: dict[str, list[float]] = {}
    for r in rounds:
        for name, values in r.rewards.log.metrics.items():
            metrics.setdefault(name, []).extend(values)
    return dataclasses.replace(
        batch,
        rewards=CombinedRewards(totals, rewards.rewards, rewards.scorable, RewardLog(rewards.log.extra, metrics)),
        num_truncated_prompts=sum(r.num_truncated_prompts for r in rounds),
        generate_seconds=sum(r.generate_seconds for r in rounds),
        score_seconds=sum(r.score_seconds for r in rounds),
    )


def to_device(scored: ScoredRollout, device: torch.device) -> ScoredRollout:
    """``scored`` with its tensors on ``device`` (the CPU, to send it to another process, and back)."""
    rewards = scored.rewards
    scores = dataclasses.replace(rewards.scores, values=rewards.scores.values.to(device))
    combined = CombinedRewards(scores, rewards.rewards.to(device), rewards.scorable.to(device), rewards.log)
    return dataclasses.replace(scored, rollout=scored.rollout.to(device), rewards=combined)


def _join_rewards(parts: list[CombinedRewards], sizes: list[int]) -> CombinedRewards:
    """The rows of ``parts`` (``sizes`` rows each) as one; per-batch counts are left to :func:`with_totals`."""
    extra: dict[str, list[Any]] = {}
    for column in dict.fromkeys(column for part in parts for column in part.log.extra):
        # a column another round's functions did not log is None on its rows
        extra[column] = [
            v for part, n in zip(parts, sizes, strict=True) for v in part.log.extra.get(column, [None] * n)
        ]
    values = _cat([part.scores.values for part in parts])
    return CombinedRewards(
        RewardScores(values, parts[0].scores.nonfinite_counts, parts[0].scores.failed_counts),
        _cat([part.rewards for part in parts]),
        _cat([part.scorable for part in parts]),
        RewardLog(extra),
    )


def _cat(parts: list[Tensor]) -> Tensor:
    """``parts`` concatenated on the first one's device: a group sent by another process arrives where
    :func:`to_device` put it, which for the reward scores (kept on the CPU by the pipeline) is not theirs."""
    return torch.cat([part.to(parts[0].device) for part in parts])
