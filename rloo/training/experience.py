"""Phases 3-4 of the loop: a scored rollout -> the batch the optimizer steps on (``TrainBatch``).

3. log-probs   reference log-probs when beta > 0; "old" log-probs only when the batch feeds
               more than one optimizer step (else the sampling ones, detached, are it);
4. advantages  rewards clipped, the KL penalty where its placement puts it, the estimator's
               baseline and (``normalize_advantages``) batch normalization, statistics global
               over processes; then the batch's metrics, warnings and completions log.

(OpenRLHF calls this step "making experience"; the name is borrowed.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from rloo.algo.advantages import clip_rewards, get_advantage_estimator, normalize_advantages
from rloo.algo.kl import get_kl_estimator, get_kl_placement, kl_penalized_rewards
from rloo.algo.masks import mask_truncated
from rloo.config import RLOOConfig
from rloo.generation.rollout import Rollout
from rloo.pipeline import ScoredRollout
from rloo.training.batches import TrainBatch
from rloo.training.distributed import Ranks
from rloo.training.grad_variance import GradVarianceProbe
from rloo.training.metrics import (
    append_jsonl,
    batch_record,
    batch_warnings,
    completion_rows,
    generation_metrics,
    merge_records,
    nonzero_advantage_tokens,
)
from rloo.training.models import reference_mode
from rloo.training.passes import max_rows_per_pass, no_grad_logprobs


@dataclass
class ExperienceMaker:
    """Turns scored rollouts into train batches for one run.

    ``model``: returns the unwrapped policy (it may be re-wrapped after construction);
    ``reference``: the frozen reference model, or None (no KL, or LoRA: adapters disabled);
    ``autocast``: the mixed-precision context; ``warn``: prints a warning once.
    """

    args: RLOOConfig
    ranks: Ranks
    model: Callable[[], nn.Module]
    reference: nn.Module | None
    reward_names: list[str]
    autocast: Callable[[], Any]
    warn: Callable[[str], None]
    output_dir: Path

    def __post_init__(self) -> None:
        self.spec = self.args.algorithm
        self.reward_beta, self.loss_beta = get_kl_placement(self.spec.kl_placement).coefficients(self.spec.beta)
        self.grad_variance = GradVarianceProbe.for_run(self.args, self.ranks)  # None: log_grad_variance off

    def make(self, scored: ScoredRollout, state: Any) -> TrainBatch:
        """Phases 3-4 for this process's share of a generation batch; ``state``: the trainer state
        (its step decides the completions log; its token count grows by the batch's)."""
        args, spec, rollout = self.args, self.spec, scored.rollout
        scorable = scored.rewards.scorable
        rewards = clip_rewards(scored.rewards.rewards, args.reward_clip_range)
        t0 = time.perf_counter()  # 3. log-probs
        loss_mask = rollout.completion_mask
        if spec.mask_truncated_completions:
            loss_mask = mask_truncated(loss_mask, rollout.truncated)
        reference_logprobs = self.reference_logprobs(rollout) if spec.beta > 0 else None
        old_logprobs = None
        if args.optimizer_steps_per_generation > 1:
            max_rows = self.max_rows(rollout)
            old_logprobs = no_grad_logprobs(
                self.model(),
                rollout,
                args.temperature,
                max_rows,
                self.autocast,
                self.ranks.count_everywhere,
                args.max_logits_memory_mb,
                share_prompts=not self.ranks.lockstep,
            )
        t1 = time.perf_counter()  # 4. advantages
        per_token_kl = None
        if reference_logprobs is not None:
            sampling_logprobs = old_logprobs if old_logprobs is not None else rollout.sampling_logprobs
            per_token_kl = get_kl_estimator(spec.kl_estimator)(sampling_logprobs, reference_logprobs)
            rewards = kl_penalized_rewards(rewards, per_token_kl, loss_mask, self.reward_beta)
        stats = self.ranks.batch_stats  # batch-level statistics span every process's batch
        advantages = get_advantage_estimator(spec.advantage_estimator)(
            rewards, rollout.group_ids, scorable, stats=stats
        )
        if spec.normalize_advantages:
            advantages = normalize_advantages(advantages, scorable, stats=stats)
        metrics = self.batch_metrics(scored, rewards, advantages, per_token_kl, loss_mask)
        metrics["timing/reference"] = t1 - t0
        (seen,) = self.ranks.sum([float(rollout.prompt_mask.sum()) + rollout.num_completion_tokens])
        state.num_input_tokens_seen += int(seen)
        if args.log_completions and state.global_step % args.logging_steps == 0:
            rows = self.ranks.gather_objects(completion_rows(state.global_step, scored, advantages))
            if self.ranks.is_main:
                append_jsonl(self.output_dir / "completions.jsonl", [row for part in rows for row in part])
        batch = TrainBatch(rollout, loss_mask, advantages, old_logprobs, reference_logprobs, metrics)
        if self.grad_variance is not None and self.grad_variance.due(state.global_step):
            metrics.update(self.grad_variance.measure(self.model(), batch, rewards, scorable, self.autocast))
        return batch

    def batch_metrics(
        self,
        scored: ScoredRollout,
        rewards: Tensor,
        advantages: Tensor,
        per_token_kl: Tensor | None,
        loss_mask: Tensor,
    ) -> dict[str, float]:
        """The generation batch's metrics over every process, warning about what looks wrong."""
        records = self.ranks.gather_objects(batch_record(scored, rewards, advantages))
        metrics = generation_metrics(merge_records(records), self.reward_names)
        limit = getattr(self.model().config, "max_position_embeddings", None)
        for message in batch_warnings(metrics, self.reward_names, self.args.max_prompt_length, limit):
            self.warn(message)
        signal, tokens = self.ranks.sum(nonzero_advantage_tokens(advantages, loss_mask, scored.rollout.completion_mask))
        metrics["frac_tokens_nonzero_advantage"] = signal / max(tokens, 1.0)
        if per_token_kl is not None:
            kl_sum, tokens = self.ranks.sum([float((per_token_kl * loss_mask).sum()), float(loss_mask.sum())])
            metrics["kl"] = kl_sum / max(tokens, 1.0)
        # reward functions' log_metric scalars: the mean over the processes that logged each (as TRL)
        logged = [m for m in self.ranks.gather_objects(scored.rewards.log.metric_means()) if m]
        for name in sorted({key for means in logged for key in means}):
            values = [means[name] for means in logged if name in means]
            metrics[name] = sum(values) / len(values)
        return metrics

    def max_rows(self, rollout: Rollout, cap: int | None = None) -> int:
        """Rows per pass over ``rollout`` within ``max_logits_memory_mb`` (at most ``cap``). ``cap`` given:
        the training passes', compiled under ``torch_compile`` (sampling and the reference stay eager)."""
        compiled = cap is not None and self.args.torch_compile
        cap = cap or rollout.completion_ids.shape[0]
        return max_rows_per_pass(self.model(), rollout, self.args.max_logits_memory_mb, cap, compiled)

    def reference_logprobs(self, rollout: Rollout) -> Tensor:
        with reference_mode(self.model(), self.reference) as reference:
            max_rows, count = self.max_rows(rollout), self.ranks.count_everywhere  # lockstep: sharded
            budget, share = self.args.max_logits_memory_mb, not self.ranks.lockstep
            temperature = self.args.temperature
            return no_grad_logprobs(reference, rollout, temperature, max_rows, self.autocast, count, budget, share)
