"""The passes over a train batch: its containers, how its rows are cut into passes, and running them.

Stages and their containers: the sampler gives a ``Rollout`` (:mod:`rloo.generation.rollout`),
the pipeline a ``ScoredRollout`` (:mod:`rloo.pipeline`), the trainer a :class:`TrainBatch`
(advantages, loss mask, reference/old log-probs), and each forward/backward takes a
:class:`Pass`: some rows of the train batch, padding columns trimmed.

A micro-batch (``per_device_train_batch_size`` rows) is cut into passes that keep one
float32 logits tensor within ``max_logits_memory_mb``; the loss of every pass is scaled by
whole-step totals, so splitting changes memory, never the gradient. Where the model allows it
(:func:`rloo.forward.logprobs.completion_logprobs`) a pass never builds those logits at all: the
LM head runs in chunks of ~64 MiB, rows of a pass with the same prompt share one forward of it, and
their completions run in length buckets, each padded to its own longest row only.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rloo.algo.losses import count_actions
from rloo.algo.objective import ObjectiveInputs, ObjectiveSettings, policy_objective
from rloo.algo.stats import ClipFractions, masked_mean
from rloo.forward.lm_head import Autocast, head_is_exact
from rloo.forward.logprobs import TokenLogprobs, completion_logprobs
from rloo.forward.packing import host_to_device
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
    (clipped, KL-penalized where the KL is a reward penalty). engine_weights: ``(N, Tc)`` the engines'
    importance weights (``use_vllm``), or None; sampling_logprobs: ``(N, Tc)`` the sampling policy's
    log-probs of the sampled tokens where they are the scored distribution's (the off-policy mask's), or None.
    """

    rollout: Rollout
    loss_mask: Tensor
    advantages: Tensor
    old_logprobs: Tensor | None
    reference_logprobs: Tensor | None
    metrics: dict[str, float]
    rewards: Tensor | None = None
    engine_weights: Tensor | None = None
    sampling_logprobs: Tensor | None = None

    @property
    def num_rows(self) -> int:
        return int(self.advantages.shape[0])


@dataclass(frozen=True)
class PendingBatch:
    """A generation batch whose one optimizer step is one pass, before its advantages: the old log-probs
    they need (the KL reward penalty's policy side, the engines' importance weights) are that pass's own,
    detached, so no no-grad policy forward runs for them. :meth:`rloo.training.update.Updater.step` runs the
    pass's forward, builds the batch with :attr:`complete`, then the loss and its backward.

    loss_mask: ``(N, Tc)`` as :class:`TrainBatch`'s; metrics: the trainer's metrics of the batch, merged into
    the completed batch's; complete: ``(N, Tc)`` old log-probs (0 where masked) -> the batch."""

    rollout: Rollout
    loss_mask: Tensor
    metrics: dict[str, float]
    complete: Callable[[Tensor], TrainBatch]

    @property
    def num_rows(self) -> int:
        return int(self.loss_mask.shape[0])

    def inputs(self, rows: Tensor) -> Pass:
        """``rows``' forward inputs (advantages 0: not known yet), columns trimmed as :func:`take_rows` trims them."""
        zeros = self.loss_mask.new_zeros(self.num_rows, dtype=torch.float32)
        return take_rows(TrainBatch(self.rollout, self.loss_mask, zeros, None, None, {}), rows)


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
    engine_weights: Tensor | None = None
    sampling_logprobs: Tensor | None = None


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
        engine_weights=pick(batch.engine_weights),
        sampling_logprobs=pick(batch.sampling_logprobs),
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
    actions: float  # the actions its clip fractions are over (count_actions)
    aux_loss: float | None = None  # a mixture-of-experts model's load-balancing loss (unscaled)
    # fresh_old passes: the current log-probs, detached (the batch's old ones from now on), and the
    # mean |log ratio| the stored old ones would have given at this on-policy step
    current: Tensor | None = None
    old_gap: float | None = None


def rows_per_pass(sequence_length: int, vocab_size: int, budget_mib: float, cap: int) -> int:
    """Rows per forward pass so that one ``(rows, T, V)`` float32 logits tensor fits ``budget_mib``.

    Splitting a micro-batch into passes does not change the gradient (the loss is normalized
    by whole-step totals), only the peak memory: activations and logits scale with the rows.
    """
    per_row = sequence_length * vocab_size * 4
    return max(1, min(cap, int(budget_mib * 2**20) // max(1, per_row)))


def plan_passes(rows: Sequence[int], lengths: Sequence[int], max_rows: int) -> list[list[int]]:
    """Cut ``rows`` into passes of at most ``max_rows``, longest first (ties in order), so each pass pads
    little. On the host: ``rows`` indices, ``lengths`` the completion length of every row of the batch
    (read once per batch, so planning makes no host sync per pass)."""
    ordered = sorted(rows, key=lambda row: -lengths[row])
    return [ordered[start : start + max_rows] for start in range(0, len(ordered), max_rows)]


def trainable_rows(rows: Tensor, advantages: Tensor, skip_zero_advantage: bool) -> Tensor:
    """The rows whose loss can have a gradient.

    With only the clipped surrogate in the loss, a completion with ``A_i = 0`` has loss
    ``-min(rho * 0, clip(rho) * 0) = 0`` and zero gradient, so leaving it out of the forward
    and backward is exact (groups whose K rewards are all equal have A = 0 everywhere).
    """
    if not skip_zero_advantage:
        return rows
    return rows[advantages[rows] != 0]


def max_rows_per_pass(
    model: nn.Module,
    rollout: Rollout,
    budget_mib: float,
    cap: int,
    compiled: bool = False,
    autocast: Autocast = contextlib.nullcontext,
) -> int:
    """Rows per pass, by the head path the passes will take: ``cap`` where they take the chunked head
    (:func:`rloo.forward.lm_head.head_is_exact`, probed in ``autocast``, the passes' precision), whose
    logits fit the budget chunk by chunk whatever the rows (their activations are the micro-batch's, as
    in TRL); else so a ``(rows, Tp + Tc, V)`` float32 logits tensor fits ``budget_mib``.
    ``compiled``: the passes run ``model`` through ``torch.compile``, which takes the plain path."""
    if not compiled and head_is_exact(model, rollout.completion_ids[:1, :2], autocast):
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
    padding_free: bool = False,
) -> Tensor:
    """Log-probs of every completion token under ``model``, without gradient: ``(N, Tc)``, 0 where masked.

    ``count_everywhere(n)``: the number of passes every process runs (lockstep, FSDP); passes
    beyond this process's own repeat its first and are dropped. ``max_logits_mib``: the chunked
    head's logits per chunk; ``share_prompts``: rows may share a prompt's forward (off in lockstep:
    it changes the number of forwards, each a collective under FSDP) and ``padding_free``: rows may be packed
    end to end (:func:`completion_logprobs`)."""
    out = torch.zeros_like(rollout.sampling_logprobs)
    all_rows = torch.arange(rollout.completion_ids.shape[0], device=out.device)
    host_lengths = [int(n) for n in rollout.completion_mask.sum(dim=1).tolist()]  # the batch's one host read
    host_passes = plan_passes(range(len(host_lengths)), host_lengths, max_rows)
    passes = [host_to_device(rows, out.device) for rows in host_passes]
    total = count_everywhere(len(passes)) if count_everywhere is not None else len(passes)
    for i in range(total):
        rows = passes[i] if i < len(passes) else all_rows[:1]
        tc = max(max(host_lengths[row] for row in host_passes[i]) if i < len(passes) else host_lengths[0], 1)
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
                padding_free=padding_free,
            ).logprobs
        if i < len(passes):
            out[rows, : lp.shape[1]] = lp.float()
    return out * rollout.completion_mask


def pass_forward(
    model: nn.Module,
    rows: Pass,
    objective: ObjectiveSettings,
    temperature: float,
    aux_loss_coef: float,
    max_logits_mib: float | None,
    share_prompts: bool,
    padding_free: bool,
) -> TokenLogprobs:
    """The forward of :func:`pass_loss`, with gradient: ``rows``' log-probs, entropies (with gradient where
    the objective has an entropy bonus) and a mixture-of-experts model's load-balancing loss where it is weighted.
    ``rows``' advantages are not read."""
    return completion_logprobs(
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
        padding_free=padding_free,
    )


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
    padding_free: bool = False,
    fresh_old: bool = False,
    current: TokenLogprobs | None = None,
) -> PassResult:
    """Forward ``rows`` with gradient and build the loss of :func:`rloo.algo.objective.policy_objective`.

    ``total_tokens`` / ``total_sequences``: the whole optimizer step's. Without stored old
    log-probs (the batch feeds one optimizer step) the current ones, detached, are the old ones: ratio 1.
    ``aux_loss_coef`` > 0 (a mixture-of-experts model, ``router_aux_loss_coef``): the model's
    load-balancing loss is added, weighted by the pass's share of the step's sequences, so the step
    adds ``coef x`` its row-weighted mean (TRL adds ``coef x`` each micro-batch's, averaged).
    ``max_logits_mib``, ``share_prompts``, ``padding_free``: as :func:`no_grad_logprobs` takes them.
    ``fresh_old``: the first optimizer step on the batch, where the policy is still the sampling one:
    the current log-probs, detached, are the old ones (ratio exactly 1) rather than the stored ones,
    which a differently shaped pass computed (in bf16 their per-token noise, summed over a sequence,
    could clip an on-policy step); the result carries them, and the stored ones' mean |log ratio|.
    ``current``: the pass's forward, already run (:func:`pass_forward`; a one-pass step's, whose log-probs
    completed the batch this pass takes its advantages from).
    """
    if current is None:
        current = pass_forward(
            model, rows, objective, temperature, aux_loss_coef, max_logits_mib, share_prompts, padding_free
        )
    logprobs = current.logprobs.float()
    assert current.entropy is not None
    stored = None if fresh_old else rows.old_logprobs
    inputs = ObjectiveInputs(
        logprobs=logprobs,
        old_logprobs=stored if stored is not None else logprobs.detach(),
        reference_logprobs=rows.reference_logprobs,
        advantages=rows.advantages,
        loss_mask=rows.loss_mask,
        entropy=current.entropy.float(),
        engine_weights=rows.engine_weights,
        sampling_logprobs=rows.sampling_logprobs,
    )
    out = policy_objective(inputs, objective, total_tokens=total_tokens, total_sequences=total_sequences)
    entropy_mask = rows.loss_mask if rows.loss_mask.sum() > 0 else rows.completion_mask
    entropy = float(masked_mean(current.entropy.detach().float(), entropy_mask))
    loss, aux = out.loss, None
    if current.aux_loss is not None:
        aux = float(current.aux_loss.detach())
        loss = loss + aux_loss_coef * current.aux_loss.float() * rows.advantages.shape[0] / total_sequences
    result = PassResult(
        loss,
        float(loss.detach()),
        entropy,
        out.clip,
        out.kl,
        tokens=float(entropy_mask.sum()),
        actions=count_actions(objective.ratio_level, rows.loss_mask),
        aux_loss=aux,
    )
    if fresh_old and rows.old_logprobs is not None:
        gap = masked_mean((logprobs.detach() - rows.old_logprobs.float()).abs(), entropy_mask)
        result = dataclasses.replace(result, current=logprobs.detach(), old_gap=float(gap))
    return result
