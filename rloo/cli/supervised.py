"""Supervised training on demonstrations, and greedy accuracy, for small tasks on tiny models.

Used by ``rloo demo`` (its warm start and its supervised controls) and by the learning study
(``benchmarks/learning.py``) on each of its tasks. A demonstration is a ``(prompt, target)`` pair
of strings: the model learns to write ``target`` and then EOS after ``prompt``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from rloo.generation.sampling import SamplingParams
from rloo.pipeline import RolloutSettings, generate_and_score
from rloo.rewards.calling import RewardFunctions

Demonstration = tuple[str, str]


def encode_demonstrations(demonstrations: Sequence[Demonstration], tokenizer: Any) -> list[tuple[list[int], list[int]]]:
    """Each demonstration as ``(input_ids, labels)``: prompt + target + EOS, prompt labels -100."""
    encoded = []
    for prompt_text, target_text in demonstrations:
        prompt = tokenizer(prompt_text)["input_ids"]
        target = tokenizer(target_text)["input_ids"] + [tokenizer.eos_token_id]
        encoded.append((prompt + target, [-100] * len(prompt) + target))
    return encoded


def supervised_batch(
    encoded: Sequence[tuple[list[int], list[int]]], pad_token_id: int, batch_size: int, generator: random.Random
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` encoded demonstrations drawn with replacement, right-padded: ``(input_ids, labels)``."""
    rows = [encoded[generator.randrange(len(encoded))] for _ in range(batch_size)]
    length = max(len(ids) for ids, _ in rows)
    ids = torch.full((batch_size, length), pad_token_id)
    labels = torch.full((batch_size, length), -100)
    for row, (x, y) in enumerate(rows):
        ids[row, : len(x)] = torch.tensor(x)
        labels[row, : len(y)] = torch.tensor(y)
    return ids, labels


def supervised_train(
    model: nn.Module,
    tokenizer: Any,
    demonstrations: Sequence[Demonstration],
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    warmup_steps: int = 100,
    seed: int = 0,
    stop_when: Callable[[nn.Module], bool] | None = None,
    check_every: int = 50,
    encoded: Sequence[tuple[list[int], list[int]]] | None = None,
) -> int:
    """Cross-entropy on the demonstrations' targets for ``steps`` steps; returns the steps taken.

    ``stop_when(model)``, asked every ``check_every`` steps, stops training early when true
    (the early-stopped warm start). ``encoded``: the demonstrations already as ``(input_ids, labels)``
    (labels -100 where not trained, e.g. a tool's answers), instead of ``demonstrations``.
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    # a short warm-up and gradient clipping get the tiny model past its early plateau fast
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup_steps))
    rng = random.Random(seed)
    device = next(model.parameters()).device
    if encoded is None:  # once: tokenizing every batch was most of its time
        encoded = encode_demonstrations(demonstrations, tokenizer)
    step = 0
    while step < steps:
        model.train()
        ids, labels = supervised_batch(encoded, tokenizer.pad_token_id, batch_size, rng)
        ids, labels = ids.to(device), labels.to(device)
        loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(), labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if stop_when is not None and step % check_every == 0 and stop_when(model):
            break
    return step


@torch.no_grad()
def greedy_scores(
    model: nn.Module,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    rewards: RewardFunctions,
    max_completion_length: int,
) -> torch.Tensor:
    """Each reward of each row's greedy completion, ``(len(rows), len(rewards))``, scored by the
    training pipeline; ``rows`` hold a ``prompt`` and the columns the rewards read."""
    prompts = [row["prompt"] for row in rows]
    columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
    settings = RolloutSettings(1, max_completion_length, SamplingParams(top_k=1))
    return generate_and_score(model, tokenizer, prompts, columns, rewards, settings).rewards.scores.values


def greedy_accuracy(
    model: nn.Module, tokenizer: Any, rows: Sequence[dict[str, Any]], reward: Any, max_completion_length: int
) -> float:
    """Share of ``rows`` whose greedy completion gets ``reward`` 1."""
    scores = greedy_scores(model, tokenizer, rows, RewardFunctions([reward]), max_completion_length)
    return float((scores[:, 0] == 1).sum()) / len(rows)
