"""Metrics of a generation batch and of an optimizer step, named as TRL's where they exist."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from rloo.algo.advantages import frac_zero_std_groups
from rloo.algo.stats import pass_at_k
from rloo.pipeline import ScoredRollout
from rloo.report import metric_names
from rloo.training.passes import PassResult


def _std(values: Tensor) -> float:
    return float(values.std()) if values.numel() > 1 else 0.0


@dataclass
class BatchRecord:
    """What a generation batch's metrics are computed from, per completion (CPU tensors): one
    process's batch, or every process's joined by :func:`merge_records`, so that each metric is
    a mean / std / min / max over all completions, never over one process's share."""

    scores: Tensor  # (N, F) per reward function, NaN where it did not apply
    nonfinite: list[int]  # per function: NaN/inf values returned
    failed: list[int]  # per function: completions blanked by reward_error_policy="skip"
    rewards: Tensor  # (N,) combined task rewards (before clipping and KL)
    scorable: Tensor  # (N,) bool
    penalized: Tensor  # (N,) the rewards the baseline saw (after clipping and KL)
    advantages: Tensor  # (N,)
    group_ids: Tensor  # (N,)
    lengths: Tensor  # (N,) completion tokens, EOS counted
    truncated: Tensor  # (N,) bool, cut at max_completion_length
    prompt_max_length: float
    truncated_prompts: float


def _cpu(values: Tensor) -> Tensor:
    return values.detach().cpu()


def batch_record(scored: ScoredRollout, rewards: Tensor, advantages: Tensor) -> BatchRecord:
    """The record of one process's batch; ``rewards``: after clipping and KL."""
    combined, rollout = scored.rewards, scored.rollout
    return BatchRecord(
        scores=_cpu(combined.scores.values),
        nonfinite=list(combined.scores.nonfinite_counts),
        failed=list(combined.scores.failed_counts),
        rewards=_cpu(combined.rewards),
        scorable=_cpu(combined.scorable),
        penalized=_cpu(rewards),
        advantages=_cpu(advantages),
        group_ids=_cpu(rollout.group_ids),
        lengths=_cpu(rollout.model_mask.sum(dim=1)),  # the model's tokens (TRL: tool results not counted)
        truncated=_cpu(rollout.truncated),
        prompt_max_length=float(rollout.prompt_mask.sum(dim=1).max()),
        truncated_prompts=float(scored.num_truncated_prompts),
    )


def merge_records(records: list[BatchRecord]) -> BatchRecord:
    """Every process's records as one batch."""
    if len(records) == 1:
        return records[0]

    def cat(name: str) -> Tensor:
        return torch.cat([getattr(r, name) for r in records])

    return BatchRecord(
        scores=cat("scores"),
        nonfinite=[sum(counts) for counts in zip(*(r.nonfinite for r in records), strict=True)],
        failed=[sum(counts) for counts in zip(*(r.failed for r in records), strict=True)],
        rewards=cat("rewards"),
        scorable=cat("scorable"),
        penalized=cat("penalized"),
        advantages=cat("advantages"),
        group_ids=cat("group_ids"),
        lengths=cat("lengths"),
        truncated=cat("truncated"),
        prompt_max_length=max(r.prompt_max_length for r in records),
        truncated_prompts=sum(r.truncated_prompts for r in records),
    )


def reward_metrics(record: BatchRecord, names: list[str]) -> dict[str, float]:
    """``reward``/``reward_std`` over scorable completions (before clipping and KL), and per function."""
    scored = record.rewards[record.scorable].float()
    metrics = {
        metric_names.REWARD: float(scored.mean()) if scored.numel() else float("nan"),
        metric_names.REWARD_STD: _std(scored),
        "rewards/unscorable": float((~record.scorable).sum()),
    }
    for column, name in enumerate(names):
        values = record.scores[:, column]
        values = values[~torch.isnan(values)]
        metrics[f"rewards/{name}/mean"] = float(values.mean()) if values.numel() else float("nan")
        metrics[f"rewards/{name}/std"] = _std(values)
        if record.nonfinite[column]:
            metrics[f"rewards/{name}/nonfinite"] = float(record.nonfinite[column])
        if record.failed[column]:
            metrics[f"rewards/{name}/failed"] = float(record.failed[column])
    return metrics


def completion_metrics(lengths: Tensor, truncated: Tensor) -> dict[str, float]:
    """Completion lengths (EOS counted) and the fraction cut at the length limit."""
    terminated = lengths[~truncated]
    return {
        metric_names.MEAN_LENGTH: float(lengths.float().mean()),
        metric_names.MIN_LENGTH: float(lengths.min()),
        metric_names.MAX_LENGTH: float(lengths.max()),
        metric_names.CLIPPED_RATIO: float(truncated.float().mean()),
        # as TRL: 0 when no completion terminated
        "completions/mean_terminated_length": float(terminated.float().mean()) if terminated.numel() else 0.0,
        "completions/min_terminated_length": float(terminated.min()) if terminated.numel() else 0.0,
        "completions/max_terminated_length": float(terminated.max()) if terminated.numel() else 0.0,
    }


def generation_metrics(record: BatchRecord, names: list[str]) -> dict[str, float]:
    """Every metric of a generation batch: rewards (before clipping and KL), completions,
    advantages, zero-std groups (of the rewards the baseline saw, and of the task rewards),
    truncated prompts (timings: :mod:`rloo.training.timing`)."""
    metrics = reward_metrics(record, names)
    metrics.update(completion_metrics(record.lengths, record.truncated))
    metrics["completions/total_tokens"] = float(record.lengths.sum())  # over every process
    metrics.update(advantage_metrics(record.advantages, record.scorable))
    metrics[metric_names.FRAC_REWARD_ZERO_STD] = frac_zero_std_groups(
        record.penalized, record.group_ids, record.scorable
    )
    # the same of the task rewards alone: the KL penalty breaks ties and hides a reward collapse
    metrics[metric_names.FRAC_TASK_REWARD_ZERO_STD] = frac_zero_std_groups(
        record.rewards, record.group_ids, record.scorable
    )
    metrics["prompts/truncated"] = record.truncated_prompts
    metrics["prompts/max_length"] = record.prompt_max_length
    return metrics


DYNAMIC_SAMPLING_FILLED = (
    "dynamic_sampling: max_num_gen_batches generation rounds found fewer groups with a learning signal than a "
    "batch holds, so groups whose task rewards are all equal completed it (dynamic_sampling/filled_groups counts "
    "them); raise max_num_gen_batches, or the prompts are too easy or too hard for the policy now"
)


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
    if metrics["prompts/truncated"]:
        messages.append(f"prompts longer than max_prompt_length={max_prompt_length} are cut from the left")
    if metrics.get(metric_names.FILLED_GROUPS):
        messages.append(DYNAMIC_SAMPLING_FILLED)
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


def nonzero_advantage_tokens(advantages: Tensor, loss_mask: Tensor, completion_mask: Tensor) -> list[float]:
    """``[loss tokens of completions with a non-zero advantage, completion tokens]`` of one process's
    batch (summed over processes, their ratio is ``frac_tokens_nonzero_advantage``: the share of the
    generated tokens that carry a learning signal). ``advantages: (N,)``, masks ``(N, Tc)``."""
    carrying = loss_mask * (advantages != 0).unsqueeze(1).to(loss_mask.dtype)
    return [float(carrying.sum()), float(completion_mask.sum())]


def update_metrics(results: list[PassResult], actions: float) -> dict[str, float]:
    """Loss (summed over passes: they are pre-scaled); entropy, KL, aux loss and the first step's log
    ratio as means over the trained rows' tokens (each pass weighted by its tokens, reported as
    ``_tokens``); clip fractions over ``actions``, this process's actions of every row of the step
    (``_actions``): rows left out of the passes (A = 0) count, never clipped, so they are the fractions
    of a step that trains every row. ``_tokens`` / ``_actions`` weigh the reduction over processes
    (:func:`rloo.training.parallel.distributed.reduce_step_metrics`)."""
    metrics = {metric_names.LOSS: sum((r.loss_value for r in results), 0.0)}
    if actions > 0:
        metrics |= _clip_metrics(results, actions)
    if not results:
        return metrics
    weights = [r.tokens for r in results]
    total = sum(weights)
    if total <= 0:
        weights, total = [1.0] * len(results), float(len(results))

    def mean(values: list[float]) -> float:
        return sum(w * v for w, v in zip(weights, values, strict=True)) / total

    metrics |= {metric_names.ENTROPY: mean([r.entropy for r in results]), "_tokens": total}
    if all(r.kl is not None for r in results):
        metrics[metric_names.KL] = mean([r.kl for r in results if r.kl is not None])
    if all(r.aux_loss is not None for r in results):
        metrics["aux_loss"] = mean([r.aux_loss for r in results if r.aux_loss is not None])
    if all(r.old_gap is not None for r in results):  # a reused batch's first, on-policy step
        metrics[metric_names.FIRST_STEP_LOG_RATIO] = mean([r.old_gap for r in results if r.old_gap is not None])
    return metrics


def _clip_metrics(results: list[PassResult], actions: float) -> dict[str, float]:
    """Clipped actions of the passes over ``actions`` (> 0), which may include rows no pass ran."""
    low_mean, high_mean, region_mean = metric_names.CLIP_RATIO_MEANS
    low = sum(r.clip.low * r.actions for r in results) / actions
    high = sum(r.clip.high * r.actions for r in results) / actions
    return {
        low_mean: low,
        high_mean: high,
        region_mean: sum(r.clip.region * r.actions for r in results) / actions,
        # this process's fractions; over processes the min and max (TRL's nanmin / nanmax of the gathered)
        "clip_ratio/low_min": low,
        "clip_ratio/high_max": high,
        "_actions": actions,
    }


def eval_metrics(values: Tensor, names: Sequence[str] = (), prefix: str = "eval", k: int = 1) -> dict[str, float]:
    """``eval_reward`` / ``eval_reward_std`` over the scorable eval completions, how many were
    unscorable, each reward function's mean and std (``eval_rewards/<name>/mean``, ``/std``: of its own
    scores, unweighted, over the completions it applies to), and ``eval_loss``. ``values``: ``(N,)``
    combined rewards, or ``(N, 1 + F)`` with each function's scores after them, NaN where unscorable /
    not applicable, or ``(N, 2 + F)`` with the loss of each row's eval batch last (its mean: the batches'
    mean weighted by their rows, as transformers'). ``prefix``: ``eval``, or ``eval_<set>`` for a named
    eval set (as transformers names them).
    ``k``: the samples per prompt (a prompt's consecutive rows); with k >= 2, the unbiased pass@j for
    j = 1..k (:func:`rloo.algo.stats.pass_at_k`): ``<prefix>_pass@j`` with a combined reward >= 1 as a success,
    and ``<prefix>_rewards/<name>/pass@j`` for each function whose scores are all 0 or 1 (a 1 is a success)."""
    values = values if values.dim() == 2 else values.unsqueeze(1)
    rewards = values[:, 0]
    scored = rewards[~rewards.isnan()]
    metrics = {f"{prefix}_loss": float(values[:, -1].mean())} if values.shape[1] == len(names) + 2 else {}
    metrics |= {
        f"{prefix}_reward": float(scored.mean()) if scored.numel() else float("nan"),
        f"{prefix}_reward_std": _std(scored),
        f"{prefix}_unscorable": float(rewards.isnan().sum()),
    }
    for column, name in enumerate(names, start=1):
        applied = values[:, column][~values[:, column].isnan()]
        metrics[f"{prefix}_rewards/{name}/mean"] = float(applied.mean()) if applied.numel() else float("nan")
        metrics[f"{prefix}_rewards/{name}/std"] = _std(applied)  # as training's (and TRL's eval) logs it
    if k >= 2 and values.shape[0] % k == 0 and values.shape[0]:
        for j in range(1, k + 1):
            metrics[f"{prefix}_pass@{j}"] = pass_at_k((rewards >= 1).view(-1, k), j)  # NaN: never a success
        for column, name in enumerate(names, start=1):
            applied = values[:, column][~values[:, column].isnan()]
            if applied.numel() and bool(((applied == 0) | (applied == 1)).all()):
                for j in range(1, k + 1):
                    metrics[f"{prefix}_rewards/{name}/pass@{j}"] = pass_at_k((values[:, column] == 1).view(-1, k), j)
    return metrics


def headline_eval_reward(logs: dict[str, float]) -> float:
    """The eval reward the health monitors follow: ``eval_reward``, or the first named set's."""
    if "eval_reward" in logs:
        return logs["eval_reward"]
    return next(value for key, value in logs.items() if key.startswith("eval_") and key.endswith("_reward"))


def completion_rows(
    step: int, scored: ScoredRollout, advantages: Tensor, reward_names: Sequence[str]
) -> list[dict[str, Any]]:
    """One JSON-ready row per completion: step (that of the metrics row it is part of), prompt, completion (a
    multi-turn episode's messages, tool answers included), reward (the combined one; None when unscorable),
    rewards (each function's own, unweighted, by name; None where it does not apply), advantage."""
    rewards, scorable = scored.rewards.rewards, scored.rewards.scorable
    scores = scored.rewards.scores.values.tolist()  # (N, F), NaN where a function does not apply
    k, n = len(scored.completion_texts) // len(scored.prompts), len(scored.completion_texts)
    extra = scored.rewards.log.extra  # reward functions' log_extra columns
    for column, values in extra.items():
        if len(values) != n:
            raise ValueError(
                f"log_extra({column!r}, ...) got {len(values)} values for {n} completions; give one per completion"
            )
    return [
        {
            "step": step,
            "prompt": scored.prompts[i // k],
            "completion": text if scored.episodes is None else scored.episodes[i].messages,
            "reward": float(rewards[i]) if bool(scorable[i]) else None,
            "rewards": {name: None if math.isnan(v) else v for name, v in zip(reward_names, scores[i], strict=True)},
            "advantage": float(advantages[i]),
            "policy_version": scored.policy_version,  # the optimizer steps of the policy that sampled it
            **{column: values[i] for column, values in extra.items()},
        }
        for i, text in enumerate(scored.completion_texts)
    ]


def add_image_files(rows: list[dict[str, Any]], images: list[list[Any]], output_dir: Path, folder: str) -> None:
    """Save each prompt's images (PIL) as PNG files in ``output_dir/completion_images/<folder>`` and name
    them, relative to ``output_dir``, under ``images`` in its completions' ``rows`` (K per prompt, in order)."""
    k = len(rows) // max(len(images), 1)
    for i, prompt_images in enumerate(images):
        paths = []
        for j, image in enumerate(prompt_images):
            path = output_dir / "completion_images" / folder / f"prompt-{i}-image-{j}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            image.save(path)
            paths.append(str(path.relative_to(output_dir)))
        for row in rows[i * k : (i + 1) * k]:
            row["images"] = paths


def append_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in rows)
