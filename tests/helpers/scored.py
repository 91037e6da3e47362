"""Scored batches built by hand: every field of a ``ScoredRollout`` filled with values that say where they came from."""

from __future__ import annotations

import torch

from rloo.generation.multimodal import VisionInputs
from rloo.generation.rollout import Rollout
from rloo.pipeline import ScoredRollout
from rloo.rewards.calling import CombinedRewards, RewardScores
from rloo.rewards.reward_log import RewardLog
from rloo.tools.episodes import Episode

PAD = 9


def batch(
    first: int, groups: int, k: int, prompt_width: int, completion_width: int, rewards: torch.Tensor | None = None
) -> ScoredRollout:
    """``groups`` groups of ``k`` rows, group ids ``first...``. Completion j of group g is the same in any batch:
    its tokens are ``100 * g + j`` (the prompt's: one real token, left-padded to ``prompt_width``), ``1 + (g + j) % 2``
    of them (right-padded to ``completion_width`` >= 2), its text ``"text g.j"``; every row scored by one reward
    function: ``rewards`` ``(groups * k,)``, else ``10 * g + j``, all different."""
    n = groups * k
    ids = torch.arange(first, first + groups).repeat_interleave(k)
    j = torch.arange(n) % k
    tokens = 100 * ids + j
    prompt_ids = torch.full((n, prompt_width), PAD)
    prompt_ids[:, -1] = tokens
    prompt_mask = torch.zeros((n, prompt_width), dtype=torch.long)
    prompt_mask[:, -1] = 1
    lengths = 1 + (ids + j) % 2
    completion_mask = (torch.arange(completion_width) < lengths[:, None]).float()
    completion_ids = torch.where(completion_mask.bool(), tokens[:, None], PAD)
    rollout = Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        truncated=j == 0,
        sampling_logprobs=-completion_mask * (1 + tokens)[:, None],
        group_ids=ids,
        vision=VisionInputs(
            [{"pixel_values": torch.full((1, 2), float(i))} for i in ids.tolist()],
            {"token_type_ids": prompt_mask.clone()},
        ),
        tool_mask=completion_mask.clone(),
    )
    rewards = (ids * 10 + j).float() if rewards is None else rewards.float()
    scores = RewardScores(rewards[:, None].clone(), nonfinite_counts=[first], failed_counts=[1])
    names = [f"{g}.{c}" for g, c in zip(ids.tolist(), j.tolist(), strict=True)]
    log = RewardLog({"note": [f"row {name}" for name in names]}, {"calls": [float(first)]})
    return ScoredRollout(
        rollout=rollout,
        prompts=[f"prompt {g}" for g in range(first, first + groups)],
        completion_texts=[f"text {name}" for name in names],
        rewards=CombinedRewards(scores, rewards, torch.ones(n, dtype=torch.bool), log),
        num_truncated_prompts=first,
        generate_seconds=1.0,
        score_seconds=0.5,
        policy_version=3,
        images=[[f"image {g}"] for g in range(first, first + groups)],
        episodes=[Episode(turns=int(t)) for t in tokens],
    )
