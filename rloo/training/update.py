"""Phase 5 of the loop: one optimizer step over a set of micro-batches.

The loss of every pass is normalized by the totals of the whole step, summed over processes
(:mod:`rloo.training.parallel.distributed`); rows with zero advantage skip their backward when that is
exact (no KL or entropy term in the loss: the step's entropy is then over the trained rows, its clip
fractions still count the skipped rows' actions, never clipped); the rest is cut into passes that keep
the logits within ``max_logits_memory_mb``. A batch whose one optimizer step is one pass comes pending
(:class:`rloo.training.passes.PendingBatch`): that pass's forward gives the old log-probs its advantages need
(the KL reward penalty's policy side), the batch is completed, then the loss is built on the same forward
and backpropagated; every row is trained. Gradients are summed over processes once, after the last pass,
then clipped; a step whose loss or gradient is not finite makes no update
(:class:`rloo.training.monitoring.nonfinite.NonFiniteGuard`), on every process alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rloo.algo.losses import count_actions
from rloo.algo.objective import ObjectiveSettings
from rloo.config import RLOOConfig
from rloo.forward.packing import host_to_device
from rloo.generation.rollout import Rollout
from rloo.report import metric_names as names
from rloo.training.metrics import update_metrics
from rloo.training.monitoring.nonfinite import NonFiniteGuard
from rloo.training.parallel.distributed import Ranks, reduce_step_metrics
from rloo.training.parallel.fsdp import clip_grad_norm, is_sharded
from rloo.training.passes import (
    PendingBatch,
    TrainBatch,
    max_rows_per_pass,
    pass_forward,
    pass_loss,
    plan_passes,
    take_rows,
    trainable_rows,
)
from rloo.training.regional_compile import compile_for_training
from rloo.training.setup.activation_offload import offload_context
from rloo.training.setup.models import draws_dropout
from rloo.training.setup.optimization import zero_grads_if_none


def _text_config(model: Any) -> Any:
    config = getattr(model, "config", None)
    return config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config


def is_mixture_of_experts(model: Any) -> bool:
    """A mixture-of-experts model with a load-balancing loss: its config can ask for router logits and
    declares the loss's coefficient (TRL's test). GLM-4-MoE and DeepSeek-V3 route without one (a
    bias keeps the experts balanced), and Nemotron-H has the flag but no such loss: none is added."""
    text_config = _text_config(model)
    return getattr(text_config, "output_router_logits", None) is not None and hasattr(
        text_config, "router_aux_loss_coef"
    )


def router_loss_coef(model: Any, coef: float | None) -> float:
    """The weight of ``model``'s load-balancing loss in the loss, as TRL 1.16 takes it: ``coef``
    (``router_aux_loss_coef``), or where None the model config's own; 0 where the model has no such loss.
    The loss is added whatever the config's ``output_router_logits`` (the training forwards ask for the
    router logits themselves), as TRL's. A coefficient set for a model without the loss is warned about where
    TRL raises: every config.yaml rloo wrote before this default records 0.001, and resuming one must work."""
    if not is_mixture_of_experts(model):
        if coef:
            warnings.warn(
                f"RLOOConfig.router_aux_loss_coef={coef!r} has no effect on {type(model).__name__}: it has no "
                "load-balancing loss to weight (not a mixture-of-experts model whose config declares "
                "router_aux_loss_coef and output_router_logits); leave router_aux_loss_coef unset (None) or 0",
                stacklevel=3,
            )
        return 0.0
    if coef is None:
        return float(getattr(_text_config(model), "router_aux_loss_coef", 0.0) or 0.0)
    return coef


def completed(pending: PendingBatch, rows: Tensor, logprobs: Tensor) -> TrainBatch:
    """``pending`` completed with the log-probs of its one pass over ``rows`` (``(len(rows), tc)``, in the pass's
    row order), detached: the batch's old log-probs for its advantages. The batch returned has none stored: it
    feeds this one optimizer step, whose ratio is then exactly 1 (the current ones, detached, are the old ones)."""
    rollout = pending.rollout
    old = rollout.completion_mask.new_zeros(rollout.completion_mask.shape, dtype=torch.float32)
    old[rows, : logprobs.shape[1]] = logprobs.detach().float()
    batch = pending.complete(old * rollout.completion_mask)
    return dataclasses.replace(batch, old_logprobs=None)


@dataclass
class StepOutcome:
    metrics: dict[str, float]
    skipped: bool  # non-finite loss or gradient: no update was made
    batch: TrainBatch  # what the batch's later steps train on: the first step's with its fresh old log-probs


class Updater:
    """Takes optimizer steps for one run: the model, its optimizer and schedule, the processes.

    ``model`` is the unwrapped module: under DDP its wrapper only broadcast the initial weights;
    passes bypass it, so no per-backward all-reduce or buffer broadcast runs (processes may run
    different numbers of passes, which DDP's collectives would not survive), and the gradients
    are summed by one all-reduce per step instead. Under FSDP (``model`` sharded) every process
    runs as many passes (fillers count 0) and FSDP sums the gradients in each backward.
    """

    def __init__(
        self,
        *,
        model: Any,
        optimizer: Any,
        scheduler: Any,
        accelerator: Any,
        ranks: Ranks,
        args: RLOOConfig,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.accelerator, self.ranks, self.args = accelerator, ranks, args
        self.objective: ObjectiveSettings = dataclasses.replace(
            args.algorithm.objective(args.max_completion_length, args.entropy_coef),
            off_policy_threshold=args.off_policy_mask_threshold,
        )
        # torch_compile: the decoder layers compiled for the training passes (rloo.training.regional_compile)
        self.forward_model, self.compiled = compile_for_training(model, args)
        self.compiled_whole = self.forward_model is not model
        self.aux_loss_coef = router_loss_coef(model, args.router_aux_loss_coef)
        self.exact_skip = (
            args.skip_zero_advantage
            and args.entropy_coef == 0
            and self.objective.kl_coef == 0
            and not self.aux_loss_coef
        )
        self.guard = NonFiniteGuard(args.max_nonfinite_steps)
        self.sharded = is_sharded(model)
        # activation_offloading: what each pass's forward saves for its backward waits in CPU memory
        self.offload = offload_context(args.activation_offloading, accelerator.device)

    def one_pass(self, rollout: Rollout) -> bool:
        """Whether a generation batch of ``rollout`` trains in one optimizer step of one pass (each process's
        rows within a pass's): that pass's forward can then give the batch the old log-probs its advantages
        need, before its backward (:class:`rloo.training.passes.PendingBatch`), and no other forward computes them.
        Not with dropout drawn in training (``disable_dropout=False``): the advantages would then share the
        gradient's dropout draw (a separate pass draws its own, as TRL's)."""
        if self.args.optimizer_steps_per_generation != 1 or draws_dropout(self.model):
            return False
        return rollout.completion_ids.shape[0] <= self._max_rows(rollout)

    def _max_rows(self, rollout: Rollout) -> int:
        """Rows per pass within ``max_logits_memory_mb``; a model compiled whole takes the plain head."""
        args = self.args
        cap = args.per_device_train_batch_size
        autocast = self.accelerator.autocast  # the probe in the passes' precision
        return max_rows_per_pass(self.model, rollout, args.max_logits_memory_mb, cap, self.compiled_whole, autocast)

    def _passes_context(self) -> contextlib.ExitStack:
        """What a training pass runs in: mixed precision, activation offloading, the compiled layers."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.accelerator.autocast())
        stack.enter_context(self.offload())
        if self.compiled is not None:
            stack.enter_context(self.compiled.active())
        return stack

    def step(
        self,
        batch: TrainBatch | PendingBatch,
        step_rows: list[Tensor],
        global_step: int,
        first: bool = False,
        on_completed: Callable[[TrainBatch], None] | None = None,
    ) -> StepOutcome:
        """One optimizer step over ``step_rows`` (this process's micro-batches of the step). ``first``: the
        batch's first optimizer step, on-policy: its rows' stored old log-probs are replaced by the training
        pass's own (:func:`pass_loss`'s ``fresh_old``) in the returned batch, which the batch's later steps then
        compare with (``batch`` itself, frozen, is left as it is). A :class:`PendingBatch` (:meth:`one_pass`) is
        completed with its pass's log-probs before the loss, then handed to ``on_completed`` before the backward
        (the weights are still those it was sampled with: the trainer's completion log and gradient-variance
        probe); the returned batch is the completed one."""
        args = self.args
        fresh_old, all_rows = None, torch.cat(step_rows)
        if isinstance(batch, PendingBatch):
            active = all_rows  # every row takes its one pass: no advantages to skip rows by yet
        else:
            if first and batch.old_logprobs is not None:
                fresh_old = batch.old_logprobs.clone()
            active = trainable_rows(all_rows, batch.advantages, self.exact_skip)
        tokens, sequences, trained = self.ranks.sum(
            [float(batch.loss_mask[all_rows].sum()), float(all_rows.numel()), float(active.numel())]
        )
        self.model.train()
        lengths = [int(n) for n in batch.rollout.completion_mask.sum(dim=1).tolist()]
        planned = plan_passes(active.tolist(), lengths, self._max_rows(batch.rollout))
        passes = [host_to_device(rows, all_rows.device) for rows in planned]
        share = not self.ranks.lockstep  # lockstep (FSDP): the same forwards everywhere
        packing = args.padding_free and share
        current = None
        if isinstance(batch, PendingBatch):
            (rows,) = passes  # one pass (one_pass): its forward's log-probs complete the batch
            with self._passes_context():
                inputs = batch.inputs(rows)
                current = pass_forward(
                    self.forward_model,
                    inputs,
                    self.objective,
                    args.temperature,
                    self.aux_loss_coef,
                    args.max_logits_memory_mb,
                    share,
                    packing,
                )
            batch = completed(batch, rows, current.logprobs)
            if on_completed is not None:
                on_completed(batch)
        assert isinstance(batch, TrainBatch)
        results = []
        for i in range(self.ranks.count_everywhere(len(passes))):
            filler = i >= len(passes)  # lockstep (FSDP): a pass whose loss counts 0, on any row
            with self._passes_context():
                result = pass_loss(
                    self.forward_model,
                    take_rows(batch, all_rows[:1] if filler else passes[i]),
                    self.objective,
                    temperature=args.temperature,
                    total_tokens=tokens,
                    total_sequences=sequences,
                    aux_loss_coef=self.aux_loss_coef,
                    max_logits_mib=args.max_logits_memory_mb,
                    share_prompts=share,
                    padding_free=packing,
                    fresh_old=fresh_old is not None,
                    current=current if i == 0 else None,
                )
            loss = result.loss * 0.0 if filler else result.loss
            # a pass of empty completions only scores no token: a constant loss, nothing to backpropagate (in
            # lockstep every backward is a collective: it runs, and raises, rather than leave the rest waiting)
            if loss.requires_grad or self.ranks.lockstep:
                self.accelerator.backward(loss)
            if not filler:
                results.append(result)
                if result.current is not None and fresh_old is not None:
                    fresh_old[passes[i], : result.current.shape[1]] = result.current.to(fresh_old.dtype)
        zero_grads_if_none(self.model)
        grad_norm = self.reduce_and_clip()
        # clip fractions over every row's actions: a skipped row (A = 0) is never clipped
        local = update_metrics(results, count_actions(self.objective.ratio_level, batch.loss_mask[all_rows]))
        local[names.SKIPPED_ROWS_FRAC] = 1.0 - trained / max(1.0, sequences)  # every process's rows
        metrics = reduce_step_metrics(self.ranks.gather_objects(local))
        if self.accelerator.scaler is not None:
            # fp16: an inf gradient is the scaler's overflow, handled by it (the step is skipped and the
            # scale lowered inside optimizer.step()); only a non-finite loss counts as a bad step
            skipped = not self.guard.step_is_finite([metrics["loss"]], 0.0, global_step + 1)
            self.optimizer.step()
            skipped = skipped or self.accelerator.optimizer_step_was_skipped  # the scaler's overflow
        else:
            skipped = not self.guard.step_is_finite([metrics["loss"]], grad_norm, global_step + 1)
            if not skipped:
                self.optimizer.step()
        if not skipped:  # a skipped step moves no weight, so the schedule does not advance either (transformers)
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        metrics["train/nonfinite_steps"] = float(self.guard.total)
        metrics["grad_norm"] = grad_norm
        metrics["learning_rate"] = self.scheduler.get_last_lr()[0]
        after = batch if fresh_old is None else dataclasses.replace(batch, old_logprobs=fresh_old)
        return StepOutcome(metrics, skipped, after)

    def reduce_and_clip(self) -> float:
        """Sum the gradients over processes (FSDP has, in its backward hooks) and clip them to
        ``max_grad_norm``; returns their global norm before clipping."""
        max_norm = self.args.max_grad_norm if self.args.max_grad_norm > 0 else float("inf")
        if self.sharded:  # no fp16 scaler under FSDP (refused)
            return clip_grad_norm([p for p in self.model.parameters() if p.requires_grad], max_norm)
        self.ranks.sum_gradients(self.model)
        return float(self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm))
