"""Forward passes over rows of a train batch: log-probs without gradient, and the loss of a pass.

A micro-batch (``per_device_train_batch_size`` rows) is cut into passes that keep one
float32 logits tensor within ``max_logits_memory_mb``; the loss of every pass is scaled by
whole-step totals, so splitting changes memory, never the gradient. Where the model allows it
(:func:`rloo.generation.logprobs.completion_logprobs`) a pass never builds those logits at all: the
LM head runs in chunks of ~64 MiB, rows of a pass with the same prompt share one forward of it, and
their completions run in length buckets, each padded to its own longest row only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn

from rloo.algo.objective import ObjectiveInputs, ObjectiveSettings, policy_objective
from rloo.algo.stats import masked_mean
from rloo.generation.lm_head import head_is_exact
from rloo.generation.logprobs import completion_logprobs
from rloo.generation.rollout import Rollout
from rloo.training.batches import Pass, PassResult, plan_passes, rows_per_pass

Autocast = Callable[[], AbstractContextManager[Any]]


def max_rows_per_pass(model: nn.Module, rollout: Rollout, budget_mib: float, cap: int, compiled: bool = False) -> int:
    """Rows per pass so a ``(rows, Tp + Tc, V)`` float32 logits tensor fits ``budget_mib``; ``cap`` where
    the passes take the chunked head (:func:`rloo.generation.lm_head.head_is_exact`), whose logits fit
    the budget chunk by chunk whatever the rows (their activations are the micro-batch's, as in TRL).
    ``compiled``: the passes run ``model`` through ``torch.compile``, which takes the plain path."""
    if not compiled and head_is_exact(model, rollout.completion_ids[:1, :2]):
        return cap
    length = rollout.prompt_ids.shape[1] + rollout.completion_ids.shape[1]
    vocab = model.get_output_embeddings().weight.shape[0]  # type: ignore[operator]
    return rows_per_pass(length, int(vocab), budget_mib, cap)


@torch.no_grad()
def no_grad_logprobs(
    model: nn.Module,
    rollout: Rollout,
    temperature: float,
    max_rows: int,
    autocast: Autocast = contextlib.nullcontext,
    count_everywhere: Callable[[int], int] | None = None,
    max_logits_mib: float | None = None,
    share_prompts: bool = True,
) -> Tensor:
    """Log-probs of every completion token under ``model``, without gradient: ``(N, Tc)``, 0 where masked.

    ``count_everywhere(n)``: the number of passes every process runs (lockstep, FSDP); passes
    beyond this process's own repeat its first and are dropped. ``max_logits_mib``: the chunked
    head's logits per chunk; ``share_prompts``: rows may share a prompt's forward (off in lockstep:
    it changes the number of forwards, each a collective under FSDP) (:func:`completion_logprobs`)."""
    out = torch.zeros_like(rollout.sampling_logprobs)
    all_rows = torch.arange(rollout.completion_ids.shape[0], device=out.device)
    passes = plan_passes(all_rows, rollout.completion_mask.sum(dim=1), max_rows)
    total = count_everywhere(len(passes)) if count_everywhere is not None else len(passes)
    for i in range(total):
        rows = passes[i] if i < len(passes) else all_rows[:1]
        tc = max(int(rollout.completion_mask[rows].sum(dim=1).max()), 1)
        with autocast():
            lp = completion_logprobs(
                model,
                rollout.prompt_ids[rows],
                rollout.prompt_mask[rows],
                rollout.completion_ids[rows, :tc],
                rollout.completion_mask[rows, :tc],
                temperature,
                vision=None if rollout.vision is None else rollout.vision.select(rows),
                share_prompts=share_prompts,
                max_logits_mib=max_logits_mib,
            ).logprobs
        if i < len(passes):
            out[rows, : lp.shape[1]] = lp.float()
    return out * rollout.completion_mask


def pass_loss(
    model: nn.Module,
    rows: Pass,
    objective: ObjectiveSettings,
    *,
    temperature: float,
    total_tokens: float,
    total_sequences: float,
    aux_loss_coef: float = 0.0,
    max_logits_mib: float | None = None,
    share_prompts: bool = True,
) -> PassResult:
    """Forward ``rows`` with gradient and build the loss of :func:`rloo.algo.objective.policy_objective`.

    ``total_tokens`` / ``total_sequences``: the whole optimizer step's. Without stored old
    log-probs (the batch feeds one optimizer step) the current ones, detached, are the old ones: ratio 1.
    ``aux_loss_coef`` > 0 (a mixture-of-experts model, ``router_aux_loss_coef``): the model's
    load-balancing loss is added, weighted by the pass's share of the step's sequences, so the step
    adds ``coef x`` its row-weighted mean (TRL adds ``coef x`` each micro-batch's, averaged).
    ``max_logits_mib``, ``share_prompts``: as :func:`no_grad_logprobs` takes them.
    """
    current = completion_logprobs(
        model,
        rows.prompt_ids,
        rows.prompt_mask,
        rows.completion_ids,
        rows.completion_mask,
        temperature,
        with_entropy=True,
        entropy_requires_grad=objective.entropy_coef > 0,
        with_aux_loss=aux_loss_coef > 0,
        vision=rows.vision,
        share_prompts=share_prompts,
        max_logits_mib=max_logits_mib,
    )
    logprobs = current.logprobs.float()
    assert current.entropy is not None
    inputs = ObjectiveInputs(
        logprobs=logprobs,
        old_logprobs=rows.old_logprobs if rows.old_logprobs is not None else logprobs.detach(),
        reference_logprobs=rows.reference_logprobs,
        advantages=rows.advantages,
        loss_mask=rows.loss_mask,
        entropy=current.entropy.float(),
    )
    out = policy_objective(inputs, objective, total_tokens=total_tokens, total_sequences=total_sequences)
    entropy_mask = rows.loss_mask if rows.loss_mask.sum() > 0 else rows.completion_mask
    entropy = float(masked_mean(current.entropy.detach().float(), entropy_mask))
    loss, aux = out.loss, None
    if current.aux_loss is not None:
        aux = float(current.aux_loss.detach())
        loss = loss + aux_loss_coef * current.aux_loss.float() * rows.advantages.shape[0] / total_sequences
    return PassResult(loss, float(loss.detach()), entropy, out.clip, out.kl, float(entropy_mask.sum()), aux)
