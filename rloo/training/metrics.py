"""Metrics of a generation batch and of an optimizer step, named as TRL's where they exist."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from rloo.algo.advantages import frac_zero_std_groups
from rloo.generation.rollout import Rollout
from rloo.pipeline import ScoredRollout
from rloo.rewards.calling import CombinedRewards
from rloo.training.batches import PassResult, TrainBatch


def _std(values: Tensor) -> float:
    return float(values.std()) if values.numel() > 1 else 0.0


def reward_metrics(combined: CombinedRewards, names: list[str]) -> dict[str, float]:
    """``reward``/``reward_std`` over scorable completions (before clipping and KL), and per function."""
    rewards_per_func, nonfinite = combined.scores.values, combined.scores.nonfinite_counts
    scorable = combined.scorable
    scored = combined.rewards[scorable].float()
    metrics = {
        "reward": float(scored.mean()) if scored.numel() else float("nan"),
        "reward_std": _std(scored),
        "rewards/unscorable": float((~scorable).sum()),
    }
    for column, name in enumerate(names):
        values = rewards_per_func[:, column]
        values = values[~torch.isnan(values)]
        metrics[f"rewards/{name}/mean"] = float(values.mean()) if values.numel() else float("nan")
        metrics[f"rewards/{name}/std"] = _std(values)
        if nonfinite[column]:
            metrics[f"rewards/{name}/nonfinite"] = float(nonfinite[column])
        if combined.scores.failed_counts[column]:
            metrics[f"rewards/{name}/failed"] = float(combined.scores.failed_counts[column])
    return metrics


def completion_metrics(rollout: Rollout) -> dict[str, float]:
    """Completion lengths (EOS counted) and the fraction cut at the length limit."""
    lengths = rollout.completion_mask.sum(dim=1)
    terminated = lengths[~rollout.truncated]
    return {
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": float(lengths.min()),
        "completions/max_length": float(lengths.max()),
        "completions/clipped_ratio": float(rollout.truncated.float().mean()),
        "completions/mean_terminated_length": float(terminated.mean()) if terminated.numel() else 0.0,
    }


def generation_metrics(
    scored: ScoredRollout, rewards: Tensor, advantages: Tensor, names: list[str]
) -> dict[str, float]:
    """Every metric of a generation batch: rewards (before clipping and KL), completions,
    advantages, zero-std groups (of the rewards the baseline saw), truncated prompts, timings."""
    combined, group_ids = scored.rewards, scored.rollout.group_ids
    metrics = reward_metrics(combined, names)
    metrics.update(completion_metrics(scored.rollout))
    metrics.update(advantage_metrics(advantages, combined.scorable))
    metrics["frac_reward_zero_std"] = frac_zero_std_groups(rewards, group_ids, combined.scorable)
    # the same of the task rewards alone: the KL penalty breaks ties and hides a reward collapse
    metrics["frac_task_reward_zero_std"] = frac_zero_std_groups(combined.rewards, group_ids, combined.scorable)
    metrics["prompts/truncated"] = float(scored.num_truncated_prompts)
    metrics["prompts/max_length"] = float(scored.rollout.prompt_mask.sum(dim=1).max())
    metrics["timing/generate"], metrics["timing/score"] = scored.generate_seconds, scored.score_seconds
    return metrics


def batch_warnings(
    metrics: dict[str, float], names: list[str], max_prompt_length: int | None, position_limit: int | None
) -> list[str]:
    """What a generation batch's metrics show that the user should hear about. ``position_limit``:
    the model's ``max_position_embeddings`` (None: unknown)."""
    messages = []
    longest = metrics["prompts/max_length"] + metrics["completions/max_length"]
    if position_limit is not None and longest > position_limit:
        messages.append(
            f"prompt + completion reach {longest:.0f} tokens, past the model's max_position_embeddings "
            f"({position_limit}): positions beyond it are untrained; lower max_prompt_length or max_completion_length"
        )
    if metrics["rewards/unscorable"]:
        messages.append("some completions got None from every reward function: they are left out of the baselines")
    if metrics["prompts/truncated"]:
        messages.append(f"prompts longer than max_prompt_length={max_prompt_length} are cut from the left")
    for name in names:
        if metrics.get(f"rewards/{name}/nonfinite"):
            messages.append(f"reward function `{name}` returned NaN/inf: treated as 'does not apply'")
        if metrics.get(f"rewards/{name}/failed"):
            messages.append(
                f"reward function `{name}` failed or timed out: its scores of the batch count as 'does not apply' "
                "(reward_error_policy='skip'; rewards/<name>/failed counts them)"
            )
    return messages


def advantage_metrics(advantages: Tensor, scorable: Tensor) -> dict[str, float]:
    values = advantages[scorable]
    return {
        "advantages/mean": float(values.mean()) if values.numel() else 0.0,
        "advantages/std": _std(values),
    }


def update_metrics(results: list[PassResult]) -> dict[str, float]:
    """Loss (summed over passes: they are pre-scaled), entropy, clip fractions, KL."""
    n = len(results)
    if n == 0:
        return {"loss": 0.0}
    metrics = {
        "loss": sum(r.loss_value for r in results),
        "entropy": sum(r.entropy for r in results) / n,
        "clip_ratio/low_mean": sum(r.clip.low for r in results) / n,
        "clip_ratio/high_mean": sum(r.clip.high for r in results) / n,
        "clip_ratio/region_mean": sum(r.clip.region for r in results) / n,
    }
    kls = [r.kl for r in results if r.kl is not None]
    if kls:
        metrics["kl"] = sum(kls) / len(kls)
    return metrics


def eval_metrics(rewards: Tensor) -> dict[str, float]:
    """``eval_reward`` / ``eval_reward_std`` over the scorable eval completions, and how many were
    unscorable; ``rewards: (N,)`` combined rewards, NaN where unscorable."""
    scored = rewards[~rewards.isnan()]
    return {
        "eval_reward": float(scored.mean()) if scored.numel() else float("nan"),
        "eval_reward_std": _std(scored),
        "eval_unscorable": float(rewards.isnan().sum()),
    }


def step_timing(
    metrics: dict[str, float], train_seconds: float, batch: TrainBatch, steps_per_generation: int
) -> dict[str, float]:
    """``timing/train`` and ``timing/step`` (the step's share of the generation batch's phases
    1-4 plus its own update), and ``tokens_per_second`` generated per second of step time."""
    generation_seconds = metrics["timing/generate"] + metrics["timing/score"] + metrics["timing/reference"]
    seconds = generation_seconds + train_seconds * steps_per_generation
    return {
        "timing/train": train_seconds,
        "timing/step": train_seconds + generation_seconds / steps_per_generation,
        "tokens_per_second": batch.rollout.num_completion_tokens / max(seconds, 1e-9),
    }


def write_completions(path: Path, step: int, scored: ScoredRollout, advantages: Tensor) -> None:
    """Append one JSON line per completion: step, prompt, completion, reward (None when
    unscorable), advantage."""
    rewards, scorable = scored.rewards.rewards, scored.rewards.scorable
    k = len(scored.completion_texts) // len(scored.prompts)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        for i, text in enumerate(scored.completion_texts):
            row = {
                "step": step,
                "prompt": scored.prompts[i // k],
                "completion": text,
                "reward": float(rewards[i]) if bool(scorable[i]) else None,
                "advantage": float(advantages[i]),
            }
            handle.write(json.dumps(row) + "\n")
