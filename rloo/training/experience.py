"""Phases 3-4 of the step: a scored rollout -> the batch the optimizer steps on (``TrainBatch``).

3. log-probs   reference log-probs when beta > 0; "old" log-probs, by the same passes, when the
               batch feeds more than one optimizer step or the KL is a reward penalty (its policy
               side must be the reference side's computation, not the sampler's decode kernels:
               policy == reference then gives KL exactly 0): :meth:`ExperienceMaker.logprobs`;
4. advantages  rewards clipped, the KL penalty where its placement puts it, the estimator's
               baseline and (``normalize_advantages``) batch normalization, statistics global
               over processes; off-policy (``use_vllm``, ``max_staleness``), the importance weights; then the batch's
               metrics and warnings: :meth:`ExperienceMaker.train_batch`.

(OpenRLHF calls this step "making experience"; the name is borrowed.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from rloo.algo.advantages import (
    BatchStats,
    batch_stats,
    get_advantage_estimator,
    normalize_advantages,
    rows_with_baseline,
)
from rloo.algo.importance import engine_importance_weights, weight_stats
from rloo.algo.kl import get_kl_estimator, kl_penalized_rewards
from rloo.algo.masks import mask_truncated
from rloo.algo.objective import ObjectiveInputs, policy_objective
from rloo.config import RLOOConfig
from rloo.generation.engines import engine_entry
from rloo.generation.rollout import Rollout
from rloo.generation.sampling import SamplingParams
from rloo.pipeline import ScoredRollout, task_rewards
from rloo.report import metric_names as names
from rloo.tools.agent import episode_counts, tool_metrics
from rloo.training.metrics import (
    add_image_files,
    append_jsonl,
    batch_record,
    batch_warnings,
    completion_rows,
    generation_metrics,
    merge_records,
    nonzero_advantage_tokens,
)
from rloo.training.parallel.distributed import Ranks
from rloo.training.passes import PendingBatch, TrainBatch, max_rows_per_pass, no_grad_logprobs
from rloo.training.setup.models import reference_mode


@dataclass(frozen=True)
class StoredLogprobs:
    """Phase 3's output, ``(N, Tc)`` each: the reference's log-probs (None without a KL term) and
    the policy's before the update (None when the batch feeds one optimizer step: the current
    ones, detached, are then the old ones)."""

    old: Tensor | None
    reference: Tensor | None
    pending: bool = False  # the old ones are to come from the batch's one training pass (:class:`PendingBatch`)


@dataclass(kw_only=True)
class ExperienceMaker:
    """Phases 3 and 4 for one run: stored log-probs, then the train batch.

    ``model``: returns the unwrapped policy (it may be re-wrapped after construction);
    ``reference``: the frozen reference model, or None (no KL, or LoRA: adapters disabled);
    ``autocast``: the mixed-precision context; ``warn``: prints a warning once; ``reward_weights``: the
    reward functions' weights.
    """

    args: RLOOConfig
    ranks: Ranks
    model: Callable[[], nn.Module]
    reference: nn.Module | None
    reward_names: list[str]
    reward_weights: Tensor  # (F,): normalize_then_sum weighs the normalized functions
    autocast: Callable[[], Any]
    warn: Callable[[str], None]
    output_dir: Path

    def __post_init__(self) -> None:
        args = self.args
        self.spec = args.algorithm
        sampling, engine = SamplingParams.from_config(args), engine_entry(args)
        # the sampler's log-probs are another engine's (vLLM) or older weights' (max_staleness): off-policy
        self.off_policy = engine.separate or args.max_staleness > 0
        # they are of the scored distribution, log_softmax(logits / T): rloo's sampler's always; vLLM's
        # without penalty or truncation
        scored = engine.logprobs_are_scored(sampling)
        self.engine_logprobs = self.off_policy and scored
        self.correct_engines = self.engine_logprobs and args.vllm_importance_sampling_correction
        self.correction_off: str | None = None
        if args.vllm_importance_sampling_correction and not scored:
            # said at the first batch: the run folder (warnings.log) is not open yet
            self.correction_off = (
                "vllm_importance_sampling_correction is off for this run: with top_p < 1, top_k, min_p or "
                "repetition_penalty, vLLM's log-probs are of the truncated or penalized distribution, not the one "
                "rloo scores, so the engines' mismatch cannot be measured or corrected. Sample from the full "
                "distribution (top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0) to keep it, or set "
                "vllm_importance_sampling_correction=False to silence this"
            )

    def logprobs(self, rollout: Rollout, from_update: bool = False) -> StoredLogprobs:
        """Phase 3: the reference's log-probs when beta > 0, the old ones when the batch feeds more
        than one optimizer step or the KL is a reward penalty (it is then ``k(old, reference)``, both
        from the same passes; the sampler's one-token decode log-probs differ from a batched forward's
        in the last bits, in bf16 far more); each in passes within ``max_logits_memory_mb``.
        ``from_update``: the batch's one optimizer step is one pass (:meth:`rloo.training.update.Updater.one_pass`):
        old log-probs it needs are left ``pending``, to be that pass's own (a whole forward saved)."""
        reference = self.reference_logprobs(rollout) if self.spec.beta > 0 else None
        old = None
        # off-policy log-probs (vLLM's, older weights'): rloo's own feed the KL's policy side and the
        # importance weights; with neither, the forward would feed nothing
        engines = self.off_policy and (reference is not None or self.correct_engines)
        reused = self.args.optimizer_steps_per_generation > 1 or engines
        if reused or (reference is not None and self.spec.reward_beta > 0):
            if from_update and self.args.optimizer_steps_per_generation == 1:
                return StoredLogprobs(None, reference, pending=True)
            old = no_grad_logprobs(
                self.model(),
                rollout,
                self.args.temperature,
                self.max_rows(rollout),
                self.autocast,
                self.ranks.count_everywhere,
                self.args.max_logits_memory_mb,
                share_prompts=not self.ranks.lockstep,
                padding_free=self.args.padding_free and not self.ranks.lockstep,
            )
        return StoredLogprobs(old, reference)

    def train_batch(self, scored: ScoredRollout, logprobs: StoredLogprobs) -> TrainBatch | PendingBatch:
        """Phase 4 for this process's share of a generation batch: rewards clipped, the KL penalty
        where its placement puts it, the estimator's baseline and (``normalize_advantages``) batch
        normalization, statistics global over processes; the batch's metrics and warnings. With its old
        log-probs ``pending``: a :class:`PendingBatch` that does all this once they are known."""
        if logprobs.pending:
            return self._pending(scored, logprobs.reference)
        # batch-level statistics span every process's batch
        rewards, loss_mask, per_token_kl, advantages = self._advantages(scored, logprobs, self.ranks.batch_stats)
        metrics = self.batch_metrics(scored, rewards, advantages, per_token_kl, loss_mask)
        if self.correction_off is not None:
            self.warn(self.correction_off)
        rollout, weights = scored.rollout, None
        if self.engine_logprobs and logprobs.old is not None:
            metrics.update(self.engine_gap(logprobs.old, rollout))
        if self.correct_engines:
            assert logprobs.old is not None
            args = self.args
            mode = args.vllm_importance_sampling_mode
            weights = engine_importance_weights(
                logprobs.old,
                rollout.sampling_logprobs,
                rollout.model_mask,
                mode,
                args.vllm_importance_sampling_clip_min,
                args.vllm_importance_sampling_clip_max,
            )
            metrics.update(self.weight_metrics(weights, rollout.model_mask, mode))
        return TrainBatch(
            rollout,
            loss_mask,
            advantages,
            logprobs.old,
            logprobs.reference,
            metrics,
            rewards=rewards,
            engine_weights=weights,
            # the off-policy mask's sampling side: the sampler's own log-probs where they are the scored distribution's
            sampling_logprobs=rollout.sampling_logprobs if not self.off_policy or self.engine_logprobs else None,
        )

    def _pending(self, scored: ScoredRollout, reference: Tensor | None) -> PendingBatch:
        metrics: dict[str, float] = {}

        def complete(old: Tensor) -> TrainBatch:
            batch = self.train_batch(scored, StoredLogprobs(old, reference))
            assert isinstance(batch, TrainBatch)
            batch.metrics.update(metrics)
            return batch

        return PendingBatch(scored.rollout, self._loss_mask(scored.rollout), metrics, complete)

    def _loss_mask(self, rollout: Rollout) -> Tensor:
        """The tokens that carry loss: sampled ones (inserted tool results are context, never trained on), without
        truncated completions' with ``mask_truncated_completions``."""
        loss_mask = rollout.model_mask
        return mask_truncated(loss_mask, rollout.truncated) if self.spec.mask_truncated_completions else loss_mask

    def _advantages(
        self, scored: ScoredRollout, logprobs: StoredLogprobs, stats: BatchStats
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
        """Phase 4's math: ``(rewards, loss_mask, per_token_kl, advantages)``, rewards clipped and
        KL-penalized where the KL is a reward penalty; ``stats``: the batch statistics' reach."""
        spec, rollout = self.spec, scored.rollout
        scorable = scored.rewards.scorable
        rewards = task_rewards(scored, self.args, self.reward_weights)
        loss_mask = self._loss_mask(rollout)
        per_token_kl = None
        if logprobs.reference is not None:
            sampling_logprobs = logprobs.old if logprobs.old is not None else rollout.sampling_logprobs
            per_token_kl = get_kl_estimator(spec.kl_estimator)(sampling_logprobs, logprobs.reference)
            rewards = kl_penalized_rewards(rewards, per_token_kl, loss_mask, spec.reward_beta)
        advantages = get_advantage_estimator(spec.advantage_estimator)(
            rewards, rollout.group_ids, scorable, stats=stats
        )
        if spec.normalize_advantages:  # over the rows with a baseline, by construction
            defined = rows_with_baseline(spec.advantage_estimator, rollout.group_ids, scorable)
            advantages = normalize_advantages(advantages, defined, stats=stats)
        return rewards, loss_mask, per_token_kl, advantages

    def eval_loss(self, scored: ScoredRollout) -> float:
        """TRL's ``eval_loss`` of one evaluation batch: the objective at the current policy (ratio 1:
        the sampling log-probs are the current ones), advantages from the batch's own rewards and
        statistics, the reference's KL where beta > 0; without the entropy bonus (sampling keeps no
        entropies). With one ratio per completion its policy term is -mean(advantage): 0 for the
        leave-one-out baseline; per-token ratios weigh each advantage by its completion's length.
        NaN with one completion per prompt (``num_generations_eval=1``: no baseline to leave one out of)."""
        rollout = scored.rollout
        if len(scored.completion_texts) < 2 * len(scored.prompts):
            return float("nan")
        reference = self.reference_logprobs(rollout) if self.spec.beta > 0 else None
        _, loss_mask, _, advantages = self._advantages(scored, StoredLogprobs(None, reference), batch_stats)
        inputs = ObjectiveInputs(
            logprobs=rollout.sampling_logprobs,
            old_logprobs=rollout.sampling_logprobs,
            reference_logprobs=reference,
            advantages=advantages,
            loss_mask=loss_mask,
            entropy=None,
        )
        settings = self.spec.objective(self.args.max_completion_length, entropy_coef=0.0)
        total_tokens, total_sequences = float(loss_mask.sum()), float(advantages.shape[0])
        return float(
            policy_objective(inputs, settings, total_tokens=total_tokens, total_sequences=total_sequences).loss
        )

    def tokens_seen(self, scored: ScoredRollout) -> int:
        """Prompt and completion tokens generated for the batch, over every process (dynamic sampling: of
        every generation round, :attr:`ScoredRollout.generated_tokens`)."""
        rollout = scored.rollout
        (seen,) = self.ranks.sum(
            [float(rollout.num_tokens if scored.generated_tokens is None else scored.generated_tokens)]
        )
        return int(seen)

    def log_completions(self, step: int, scored: ScoredRollout, advantages: Tensor) -> None:
        """Append every process's completions of the batch to ``completions.jsonl`` (main process); with
        ``log_multimodal``, each prompt's images are saved beside it and named in its rows."""
        images = scored.images if self.args.log_multimodal else None
        parts = self.ranks.gather_objects((completion_rows(step, scored, advantages, self.reward_names), images))
        if self.ranks.is_main:
            for rank, (rows, rank_images) in enumerate(parts):
                if rank_images is not None:
                    add_image_files(rows, rank_images, self.output_dir, f"step-{step}-rank-{rank}")
            append_jsonl(self.output_dir / "completions.jsonl", [row for rows, _ in parts for row in rows])

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
        # with dynamic sampling's metrics of its rounds (global already)
        metrics = generation_metrics(merge_records(records), self.reward_names) | scored.sampling_metrics
        limit = getattr(self.model().config, "max_position_embeddings", None)
        for message in batch_warnings(metrics, self.reward_names, self.args.max_prompt_length, limit):
            self.warn(message)
        signal, tokens = self.ranks.sum(nonzero_advantage_tokens(advantages, loss_mask, scored.rollout.model_mask))
        metrics[names.FRAC_TOKENS_NONZERO_ADVANTAGE] = signal / max(tokens, 1.0)
        if scored.episodes is not None:  # multi-turn: tool calls, failures, turns, inserted tokens, cut episodes
            rollout = scored.rollout
            counts = episode_counts(
                scored.episodes, float(rollout.model_mask.sum()), float(rollout.completion_mask.sum())
            )
            metrics.update(tool_metrics(self.ranks.sum(counts)))
        if per_token_kl is not None:
            kl_sum, tokens = self.ranks.sum([float((per_token_kl * loss_mask).sum()), float(loss_mask.sum())])
            metrics[names.KL] = kl_sum / max(tokens, 1.0)
        # reward functions' log_metric scalars: the mean over the processes that logged each (as TRL)
        logged = [m for m in self.ranks.gather_objects(scored.rewards.log.metric_means()) if m]
        for name in sorted({key for means in logged for key in means}):
            values = [means[name] for means in logged if name in means]
            metrics[name] = sum(values) / len(values)
        return metrics

    def engine_gap(self, old: Tensor, rollout: Rollout) -> dict[str, float]:
        """How far vLLM's log-probs of the sampled tokens are from the trainer's (``old``, the same policy),
        over every process's completion tokens: TRL's ``sampling/sampling_logp_difference``."""
        mask = rollout.model_mask.bool()
        gap = (old - rollout.sampling_logprobs).abs()[mask]
        total, tokens = self.ranks.sum([float(gap.sum()), float(gap.numel())])
        largest = max(self.ranks.gather_objects(float(gap.max()) if gap.numel() else 0.0))
        return {names.ENGINE_GAP_MEAN: total / max(tokens, 1.0), names.ENGINE_GAP_MAX: largest}

    def weight_metrics(self, weights: Tensor, mask: Tensor, mode: str) -> dict[str, float]:
        """The engines' importance weights over every process's actions: TRL's
        ``sampling/importance_sampling_ratio/{min,mean,max}``, and the share a ``*_mask`` mode zeroed."""
        parts = self.ranks.gather_objects(weight_stats(weights, mask, mode))
        seen = [part for part in parts if part.actions]
        actions = sum(part.actions for part in seen)
        if not seen:
            return {}
        return {
            names.IS_RATIO_MIN: min(part.min for part in seen),
            names.IS_RATIO_MEAN: sum(part.mean * part.actions for part in seen) / actions,
            names.IS_RATIO_MAX: max(part.max for part in seen),
            names.IS_MASKED_FRAC: sum(part.masked_frac * part.actions for part in seen) / actions,
        }

    def max_rows(self, rollout: Rollout) -> int:
        """Rows per no-grad pass over ``rollout``: at most a training micro-batch's
        (``per_device_train_batch_size``), and within ``max_logits_memory_mb`` (eager, never compiled).
        Not the whole generation batch: the chunked head bounds the logits, not the transformer's
        activations (all rows x all tokens of one layer's MLP), so a batch that samples fine could run
        out of memory here; a no-grad pass of a micro-batch's rows needs less than its training pass."""
        cap = min(rollout.completion_ids.shape[0], self.args.per_device_train_batch_size)
        return max_rows_per_pass(self.model(), rollout, self.args.max_logits_memory_mb, cap, autocast=self.autocast)

    def reference_logprobs(self, rollout: Rollout) -> Tensor:
        with reference_mode(self.model(), self.reference) as reference:
            max_rows, count = self.max_rows(rollout), self.ranks.count_everywhere  # lockstep: sharded
            budget, share = self.args.max_logits_memory_mb, not self.ranks.lockstep
            temperature = self.args.temperature
            packing = self.args.padding_free and share
            return no_grad_logprobs(
                reference, rollout, temperature, max_rows, self.autocast, count, budget, share, packing
            )
