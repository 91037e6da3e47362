"""The update's containers and row planning: a train batch, the passes over its rows.

Stages and their containers: the sampler gives a ``Rollout`` (:mod:`rloo.generation.rollout`),
the pipeline a ``ScoredRollout`` (:mod:`rloo.pipeline`), the trainer a :class:`TrainBatch`
(advantages, loss mask, reference/old log-probs), and each forward/backward takes a
:class:`Pass`: some rows of the train batch, padding columns trimmed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.algo.stats import ClipFractions
from rloo.generation.multimodal import VisionInputs
from rloo.generation.rollout import Rollout


@dataclass(frozen=True)
class TrainBatch:
    """A generation batch ready for the update (N rows, ``Tc`` completion tokens).

    loss_mask: ``(N, Tc)`` tokens that carry loss (the completion mask, with truncated
    completions zeroed when ``mask_truncated_completions``). advantages: ``(N,)``.
    old_logprobs / reference_logprobs: ``(N, Tc)`` or None (None old log-probs: the batch
    is used in one optimizer step, so the current log-probs, detached, are the old ones).
    metrics: generation-side metrics of this batch. rewards: ``(N,)`` what the baseline saw
    (clipped, KL-penalized where the KL is a reward penalty).
    """

    rollout: Rollout
    loss_mask: Tensor
    advantages: Tensor
    old_logprobs: Tensor | None
    reference_logprobs: Tensor | None
    metrics: dict[str, float]
    rewards: Tensor | None = None

    @property
    def num_rows(self) -> int:
        return int(self.advantages.shape[0])


@dataclass(frozen=True)
class Pass:
    """Rows of a :class:`TrainBatch` for one forward/backward, with padding columns trimmed.

    completion_mask: real completion tokens (attention); loss_mask: the tokens that carry loss.
    vision: the rows' image inputs (a vision-language policy), prompt columns trimmed alike.
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    completion_ids: Tensor
    completion_mask: Tensor
    loss_mask: Tensor
    advantages: Tensor
    old_logprobs: Tensor | None
    reference_logprobs: Tensor | None
    vision: VisionInputs | None = None


def _trim_columns(rollout: Rollout, rows: Tensor) -> tuple[slice, slice]:
    """Prompt columns from the first one any row uses; completion columns up to the longest."""
    prompt_used = rollout.prompt_mask[rows].any(dim=0)
    first = int(prompt_used.int().argmax()) if bool(prompt_used.any()) else rollout.prompt_mask.shape[1]
    completion_len = int(rollout.completion_mask[rows].sum(dim=1).max())
    return slice(first, None), slice(0, max(completion_len, 1))


def take_rows(batch: TrainBatch, rows: Tensor) -> Pass:
    """Select ``rows`` (1-D index tensor) and drop all-padding columns."""
    r = batch.rollout
    p, c = _trim_columns(r, rows)

    def pick(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[rows][:, c]

    return Pass(
        prompt_ids=r.prompt_ids[rows][:, p],
        prompt_mask=r.prompt_mask[rows][:, p],
        completion_ids=r.completion_ids[rows][:, c],
        completion_mask=r.completion_mask[rows][:, c],
        loss_mask=batch.loss_mask[rows][:, c],
        advantages=batch.advantages[rows],
        old_logprobs=pick(batch.old_logprobs),
        reference_logprobs=pick(batch.reference_logprobs),
        vision=None if r.vision is None else r.vision.select(rows, p),
    )


def micro_batch_rows(num_rows: int, size: int, device: torch.device) -> list[Tensor]:
    """Consecutive row indices in chunks of ``size``."""
    return [torch.arange(start, min(start + size, num_rows), device=device) for start in range(0, num_rows, size)]


@dataclass(frozen=True)
class PassResult:
    """What one pass's forward reports: the loss to backpropagate and its metrics."""

    loss: Tensor
    loss_value: float
    entropy: float
    clip: ClipFractions
    kl: float | None
    tokens: float  # the tokens its means are over: weights when passes (or processes) are combined
    aux_loss: float | None = None  # a mixture-of-experts model's load-balancing loss (unscaled)


def rows_per_pass(sequence_length: int, vocab_size: int, budget_mib: float, cap: int) -> int:
    """Rows per forward pass so that one ``(rows, T, V)`` float32 logits tensor fits ``budget_mib``.

    Splitting a micro-batch into passes does not change the gradient (the loss is normalized
    by whole-step totals), only the peak memory: activations and logits scale with the rows.
    """
    per_row = sequence_length * vocab_size * 4
    return max(1, min(cap, int(budget_mib * 2**20) // max(1, per_row)))


def plan_passes(rows: Tensor, lengths: Tensor, max_rows: int) -> list[Tensor]:
    """Cut ``rows`` into passes of at most ``max_rows``, longest first, so each pass pads little.

    rows: ``(n,)`` indices; lengths: ``(N,)`` completion length of every row of the batch.
    """
    if rows.numel() == 0:
        return []
    ordered = rows[torch.argsort(lengths[rows], descending=True, stable=True)]
    return list(torch.split(ordered, max_rows))


def trainable_rows(rows: Tensor, advantages: Tensor, skip_zero_advantage: bool) -> Tensor:
    """The rows whose loss can have a gradient.

    With only the clipped surrogate in the loss, a completion with ``A_i = 0`` has loss
    ``-min(rho * 0, clip(rho) * 0) = 0`` and zero gradient, so leaving it out of the forward
    and backward is exact (groups whose K rewards are all equal have A = 0 everywhere).
    """
    if not skip_zero_advantage:
        return rows
    return rows[advantages[rows] != 0]
