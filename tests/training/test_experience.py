"""Phases 3-4 outside the trainer: ``ExperienceMaker`` advantages and ``eval_loss`` against hand-computed values."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from rloo import RLOOConfig
from rloo.algo.advantages import batch_stats
from rloo.generation.rollout import Rollout
from rloo.pipeline import ScoredRollout
from rloo.rewards.calling import CombinedRewards, RewardScores
from rloo.training.experience import ExperienceMaker, StoredLogprobs
from rloo.training.parallel.distributed import Ranks
from tests.helpers.models import trainer


def scored(rewards: list[float], lengths: list[int], k: int, scorable: list[bool] | None = None) -> ScoredRollout:
    """``len(rewards) // k`` prompts x ``k`` completions of the given lengths, sampled with log-prob 0."""
    n, longest = len(rewards), max(lengths)
    mask = torch.tensor([[1.0] * length + [0.0] * (longest - length) for length in lengths])
    rollout = Rollout(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.ones(n, longest, dtype=torch.long),
        completion_mask=mask,
        truncated=torch.zeros(n, dtype=torch.bool),
        sampling_logprobs=torch.zeros(n, longest),
        group_ids=torch.arange(n) // k,
    )
    values = torch.tensor(rewards)
    applies = torch.ones(n, dtype=torch.bool) if scorable is None else torch.tensor(scorable)
    combined = CombinedRewards(RewardScores(values.unsqueeze(1), [0], [0]), values, applies)
    prompts = [f"p{i}" for i in range(n // k)]
    return ScoredRollout(rollout, prompts, ["c"] * n, combined, 0, 0.0, 0.0)


def maker(tmp_path: Path, **config: object) -> ExperienceMaker:
    args = RLOOConfig(output_dir=str(tmp_path), beta=0.0, **config)  # type: ignore[arg-type]
    return ExperienceMaker(
        args=args,
        ranks=Ranks(),
        model=lambda: torch.nn.Linear(1, 1),
        reference=None,
        reward_names=["r"],
        autocast=contextlib.nullcontext,
        warn=lambda message: None,
        output_dir=tmp_path,
    )


# rewards (1, 0), completion lengths (1, 3), ratio 1 (on-policy); GRPO's advantage: (r - mean) / (std + 1e-4)
GRPO_ADVANTAGE = 0.5 / (math.sqrt(0.5) + 1e-4)


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        # leave-one-out advantages (1, -1), one ratio per completion: -(1/N) sum_i A_i = 0 whatever the lengths
        ("trl", 0.0),
        # advantages (a, -a), one ratio per token, token_mean: -sum_i A_i L_i / sum_i L_i = 2a / 4
        ("dapo", -(GRPO_ADVANTAGE * 1 - GRPO_ADVANTAGE * 3) / 4),
    ],
)
def test_eval_loss_is_the_objective_at_the_sampling_policy(tmp_path: Path, preset: str, expected: float) -> None:
    loss = maker(tmp_path, preset=preset).eval_loss(scored([1.0, 0.0], [1, 3], k=2))
    assert loss == pytest.approx(expected, abs=1e-6)


def test_eval_loss_is_nan_with_one_completion_per_prompt(tmp_path: Path) -> None:
    assert math.isnan(maker(tmp_path).eval_loss(scored([1.0, 0.0], [1, 3], k=1)))


def test_normalized_advantages_take_their_statistics_over_the_rows_with_a_baseline(tmp_path: Path) -> None:
    # group 0: rewards 1, 2, 3 -> leave-one-out advantages -1.5, 0, 1.5; group 1: one scorable row of 3,
    # so no baseline: advantage 0, and (before: it entered the std, sqrt(4.5 / 3) instead of sqrt(4.5 / 2))
    # it must not shrink the statistics nor be whitened
    batch = scored([1.0, 2.0, 3.0, 5.0, 0.0, 0.0], [1] * 6, k=3, scorable=[True] * 4 + [False] * 2)
    _, _, _, advantages = maker(
        tmp_path, normalize_advantages=True, num_generations=3, per_device_train_batch_size=6
    )._advantages(batch, StoredLogprobs(old=None, reference=None), batch_stats)
    scale = 1.5 / (1.5 + 1e-4)  # std of (-1.5, 0, 1.5) with ddof 1 is 1.5
    torch.testing.assert_close(advantages, torch.tensor([-scale, 0.0, scale, 0.0, 0.0, 0.0]))


def test_no_grad_passes_take_at_most_a_training_micro_batch(tmp_path: Path) -> None:
    # before: the reference and old log-prob passes ran the whole generation batch (16 rows here) in one
    # forward; the chunked head bounds the logits, not the activations (issue 25)
    run = trainer(tmp_path, beta=0.05, steps_per_generation=2, per_device_train_batch_size=8, num_iterations=2)
    rollout = run._next_rollouts().rollout  # sampled before the hooks: only phase 3's forwards count
    rows: list[int] = []

    def record(module: Any, args: Any, kwargs: Any) -> None:
        rows.append(kwargs["input_ids"].shape[0])

    hooks = [model.register_forward_pre_hook(record, with_kwargs=True) for model in (run.model, run.ref_model)]
    try:
        stored = run.experience.logprobs(rollout)
    finally:
        for hook in hooks:
            hook.remove()
    assert stored.old is not None and stored.reference is not None and stored.old.shape[0] == 16
    assert rows and max(rows) <= 8
