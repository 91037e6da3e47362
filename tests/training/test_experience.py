"""Phases 3-4 outside the trainer: ``ExperienceMaker`` advantages and ``eval_loss`` against hand-computed values."""

from __future__ import annotations

import contextlib
import dataclasses
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
        reward_weights=torch.ones(1),
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


# ------------------------------------------------ the engines' importance weights, with a stand-in engine
class ShiftedEngine:
    """rloo's own sampler standing in for vLLM, reporting each sampled token's log-prob ``shift`` nats higher
    than it is (an engine that overrates its tokens): the trainer's importance weight is ``exp(-shift)`` a token."""

    def __init__(self, shift: float) -> None:
        self.shift = shift

    def __call__(self, model: Any, *args: Any, step: int = 0, **kwargs: Any) -> Rollout:
        from rloo.generation.rollout import generate_rollouts

        rollout = generate_rollouts(model, *args, **kwargs)
        shifted = (rollout.sampling_logprobs + self.shift) * rollout.completion_mask
        return dataclasses.replace(rollout, sampling_logprobs=shifted)


def shifted_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shift: float, **overrides: Any) -> dict[str, float]:
    from rloo import pipeline
    from tests.helpers.models import last_train_log

    monkeypatch.setattr(pipeline, "build_engine", lambda args: ShiftedEngine(shift) if args.use_vllm else None)
    run = trainer(tmp_path, use_vllm=True, max_steps=1, **overrides)
    run.train()
    return last_train_log(run)


def test_token_weights_scale_the_loss_by_the_engines_ratio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every token overrated by log 2: a token_truncate weight of 1/2 each halves the loss (same samples, seed 0)."""
    common = {"vllm_importance_sampling_mode": "token_truncate", "ratio_level": "token"}
    plain = shifted_run(tmp_path / "a", monkeypatch, 0.0, **common)
    halved = shifted_run(tmp_path / "b", monkeypatch, math.log(2.0), **common)
    off = shifted_run(tmp_path / "c", monkeypatch, math.log(2.0), vllm_importance_sampling_correction=False, **common)
    assert plain["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-5)
    assert halved["sampling/importance_sampling_ratio/max"] == pytest.approx(0.5, abs=1e-5)
    assert halved["sampling/sampling_logp_difference/mean"] == pytest.approx(math.log(2.0), abs=1e-5)
    assert halved["loss"] == pytest.approx(plain["loss"] / 2, rel=1e-4)
    assert (
        off["loss"] == pytest.approx(plain["loss"], rel=1e-6) and "sampling/importance_sampling_ratio/mean" not in off
    )


def test_sequence_mask_drops_completions_an_engine_rates_far_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token underrated by 1 nat each: a completion of L tokens has weight e^L > 3, masked (TRL's default
    sequence_mask with clip_max 3), so nothing is trained; with clip_max above every e^L all are kept."""
    masked = shifted_run(tmp_path / "a", monkeypatch, -1.0)
    assert masked["sampling/importance_sampling_ratio/masked_frac"] == 1.0 and masked["loss"] == 0.0
    kept = shifted_run(tmp_path / "b", monkeypatch, -1.0, vllm_importance_sampling_clip_max=1e4)
    assert kept["sampling/importance_sampling_ratio/masked_frac"] == 0.0 and kept["loss"] != 0.0


def test_truncated_sampling_turns_the_correction_off_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    logged = shifted_run(tmp_path, monkeypatch, math.log(2.0), top_p=0.9)
    assert "vllm_importance_sampling_correction is off for this run: with top_p < 1" in capsys.readouterr().err
    assert "sampling/importance_sampling_ratio/mean" not in logged
    assert "sampling/sampling_logp_difference/mean" not in logged


def test_the_off_policy_mask_leaves_out_negative_advantages_the_sampler_rated_higher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampler's log-probs 1 nat above the current policy's: a mean KL of 1 > delta 0.5, so each completion
    with a negative advantage leaves the loss (with A >= 0 only, the token-mean loss is <= 0)."""
    common = {"vllm_importance_sampling_correction": False, "ratio_level": "token"}
    plain = shifted_run(tmp_path / "a", monkeypatch, 1.0, **common)
    masked = shifted_run(tmp_path / "b", monkeypatch, 1.0, off_policy_mask_threshold=0.5, **common)
    near = shifted_run(tmp_path / "c", monkeypatch, 1.0, off_policy_mask_threshold=1.5, **common)
    assert masked["loss"] < plain["loss"] and masked["loss"] <= 0.0
    assert near["loss"] == pytest.approx(plain["loss"], rel=1e-6)


def test_normalize_then_sum_forms_the_advantages_from_each_functions_group_normalized_scores(tmp_path: Path) -> None:
    """Two functions, one prompt of K = 2: f0 = (1, 0), f1 = (0, 3) with weights (1, 1). GDPO: each normalized
    within the group ((1, -1) / (std + eps) each, std = 1/sqrt(2) and 3/sqrt(2)), then summed: (a - b, b - a)
    with a = 0.5 / (0.7071 + 1e-4), b = 1.5 / (2.1213 + 1e-4); rloo's baseline then doubles it (K = 2)."""
    one = scored([1.0, 0.0], [2, 2], k=2)
    values = torch.tensor([[1.0, 0.0], [0.0, 3.0]])
    combined = CombinedRewards(RewardScores(values, [0, 0], [0, 0]), values.sum(dim=1), torch.ones(2, dtype=torch.bool))
    two = dataclasses.replace(one, rewards=combined)
    m = maker(tmp_path, multi_objective_aggregation="normalize_then_sum")
    m.reward_weights = torch.ones(2)
    _, _, _, advantages = m._advantages(two, StoredLogprobs(None, None), batch_stats)
    a, b = 0.5 / (math.sqrt(0.5) + 1e-4), 1.5 / (3 * math.sqrt(0.5) + 1e-4)
    assert advantages.tolist() == pytest.approx([2 * (a - b), 2 * (b - a)], abs=1e-5)
    summed = maker(tmp_path, multi_objective_aggregation="sum_then_normalize")
    _, _, _, plain = summed._advantages(two, StoredLogprobs(None, None), batch_stats)
    assert plain.tolist() == pytest.approx([-2.0, 2.0])  # rewards 1 and 3: each minus the other
