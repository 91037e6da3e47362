"""Metrics of a generation batch and of an optimizer step, named as TRL's where they exist."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rloo.generation.rollout import Rollout
from rloo.training.batches import MicroBatchResult


def _std(values: Tensor) -> float:
    return float(values.std()) if values.numel() > 1 else 0.0


def reward_metrics(
    rewards_per_func: Tensor, rewards: Tensor, scorable: Tensor, names: list[str], nonfinite: list[int]
) -> dict[str, float]:
    """``reward``/``reward_std`` over scorable completions (before clipping and KL), and per function.

    rewards_per_func: ``(N, F)`` with NaN where a function did not apply.
    """
    scored = rewards[scorable].float()
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


def advantage_metrics(advantages: Tensor, scorable: Tensor) -> dict[str, float]:
    values = advantages[scorable]
    return {
        "advantages/mean": float(values.mean()) if values.numel() else 0.0,
        "advantages/std": _std(values),
    }


def update_metrics(results: list[MicroBatchResult]) -> dict[str, float]:
    """Loss (summed over micro-batches: they are pre-scaled), entropy, clip fractions, KL."""
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


def write_completions(
    path: Path,
    step: int,
    prompts: list[Any],
    texts: list[str],
    rewards: Tensor,
    scorable: Tensor,
    advantages: Tensor,
) -> None:
    """Append one JSON line per completion: step, prompt, completion, reward, advantage."""
    k = len(texts) // len(prompts)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        for i, text in enumerate(texts):
            row = {
                "step": step,
                "prompt": prompts[i // k],
                "completion": text,
                "reward": float(rewards[i]) if bool(scorable[i]) else None,
                "advantage": float(advantages[i]),
            }
            handle.write(json.dumps(row) + "\n")
