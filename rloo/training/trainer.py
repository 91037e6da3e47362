"""``RLOOTrainer``: the training loop, top to bottom.

One *generation batch* is P prompts x K completions. Each goes through numbered phases:

1. generate  K completions per prompt with the policy (KV cache, eval mode);
2. score     reward functions -> combined, clipped rewards; unscorable rows flagged;
3. log-probs reference log-probs when beta > 0; "old" log-probs only when the batch
             feeds more than one optimizer step (else the current ones, detached, are it);
4. advantages KL penalty (in the reward) and the baseline of the chosen estimator;
5. update    ``num_iterations`` passes of micro-batches with gradient accumulation,
             clipping, AdamW and the LR schedule; then logging and checkpoints.

Departures from TRL are listed in :mod:`rloo.config` and :mod:`rloo.algo.advantages`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from accelerate import Accelerator
from accelerate.utils import set_seed
from rich.console import Console
from transformers import PreTrainedModel, PreTrainedTokenizerBase, get_scheduler

from rloo.algo.advantages import (
    clip_rewards,
    combine_rewards,
    frac_zero_std_groups,
    get_advantage_estimator,
    normalize_advantages,
)
from rloo.algo.kl import get_kl_estimator, kl_penalized_rewards
from rloo.algo.masks import mask_truncated
from rloo.algo.objective import MicroBatchInputs, micro_batch_objective
from rloo.algo.stats import masked_mean
from rloo.config import RLOOConfig
from rloo.data import loading as data_lib
from rloo.generation.logprobs import completion_logprobs
from rloo.generation.rollout import Rollout, generate_rollouts
from rloo.generation.sampling import SamplingParams
from rloo.rewards.calling import as_completions, compute_rewards, load_reward_funcs, reward_func_names
from rloo.training.batches import (
    MicroBatch,
    MicroBatchResult,
    SampledBatch,
    ScoredBatch,
    micro_batch,
    micro_batch_rows,
    plan_passes,
    rows_per_pass,
    trainable_rows,
)
from rloo.training.checkpoints import (
    latest_checkpoint,
    load_checkpoint_states,
    resolve_resume_path,
    restore_rng_state,
    rng_state,
    save_checkpoint,
    save_pretrained_quietly,
)
from rloo.training.metrics import (
    advantage_metrics,
    completion_metrics,
    reward_metrics,
    update_metrics,
    write_completions,
)
from rloo.training.models import (
    apply_peft,
    build_reference,
    count_parameters,
    disable_dropout,
    enable_gradient_checkpointing,
    load_policy,
    load_tokenizer,
    reference_mode,
    resolve_mixed_precision,
)
from rloo.training.progress import StopRequest, TrainingProgress
from rloo.training.tracking import MetricsSink, TrainerState, mean_metrics, run_callbacks
from rloo.training.weights import load_model_weights


class RLOOTrainer:
    """Online RLOO fine-tuning of a causal LM. The interface follows TRL's ``RLOOTrainer``."""

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: Any,
        args: RLOOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        reward_processing_classes: Any = None,
        peft_config: Any = None,
        callbacks: list[Any] | None = None,
    ) -> None:
        self.args = args = args if args is not None else RLOOConfig()
        self.spec = args.algorithm
        set_seed(args.seed)
        self.accelerator = Accelerator(mixed_precision=resolve_mixed_precision(args.bf16))
        self.console = Console(stderr=True)
        if train_dataset is None:
            raise ValueError("train_dataset is required: a datasets.Dataset, a list of dicts or a file path")
        self.train_dataset = data_lib.load_prompt_dataset(train_dataset)
        self.eval_dataset = None if eval_dataset is None else data_lib.load_prompt_dataset(eval_dataset)

        policy: torch.nn.Module = load_policy(model, args.model_init_kwargs)
        self.processing_class = load_tokenizer(model, processing_class)
        if args.disable_dropout:
            disable_dropout(policy)
        if peft_config is not None:
            policy = apply_peft(policy, peft_config, args.gradient_checkpointing)
        if args.gradient_checkpointing:
            enable_gradient_checkpointing(policy)
        self.ref_model = build_reference(model, policy, self.spec.beta, args.model_init_kwargs)

        self.reward_funcs = load_reward_funcs(reward_funcs, reward_processing_classes)
        self.reward_names = reward_func_names(self.reward_funcs)
        weights = args.reward_weights or [1.0] * len(self.reward_funcs)
        if len(weights) != len(self.reward_funcs):
            raise ValueError(
                f"RLOOConfig.reward_weights has {len(weights)} entries but there are "
                f"{len(self.reward_funcs)} reward functions; give one weight per function"
            )
        self.reward_weights = torch.tensor(weights, dtype=torch.float32)

        self.sampler = data_lib.PromptSampler(len(self.train_dataset), args.seed, args.shuffle_dataset)
        self.state = TrainerState(max_steps=self._total_steps())
        trainable = [p for p in policy.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            trainable,
            lr=args.learning_rate,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
            weight_decay=args.weight_decay,
        )
        warmup = args.warmup_steps or math.ceil(args.warmup_ratio * self.state.max_steps)
        self.scheduler = get_scheduler(args.lr_scheduler_type, optimizer, warmup, self.state.max_steps)
        self.model, self.optimizer = self.accelerator.prepare(policy, optimizer)
        device = self.accelerator.device
        if self.ref_model is not None:
            self.ref_model.to(device)
        for func in self.reward_funcs:
            if hasattr(func, "to"):
                func.to(device)
        self.generator = torch.Generator(device=device).manual_seed(args.seed)
        self.sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.min_p, args.repetition_penalty)
        eos = self.processing_class.eos_token_id
        self.eos_token_ids = [eos] if isinstance(eos, int) else list(eos)
        self.callbacks = list(callbacks or [])
        self.output_dir = Path(args.output_dir)
        # the full run file when built by ``rloo train``; written as config.yaml
        self.run_config: dict[str, Any] | None = None
        self._window: list[dict[str, float]] = []
        self._warned: set[str] = set()
        self._stop = StopRequest()

    # ------------------------------------------------------------------ setup helpers
    def _total_steps(self) -> int:
        if self.args.max_steps > 0:
            return self.args.max_steps
        generations = math.ceil(self.args.num_train_epochs * len(self.train_dataset) / self.args.prompts_per_generation)
        return max(1, generations * self.args.optimizer_steps_per_generation)

    @property
    def unwrapped_model(self) -> Any:
        return self.accelerator.unwrap_model(self.model)

    # ------------------------------------------------------------------ the loop
    def train(self, resume_from_checkpoint: bool | str | None = None) -> TrainerState:
        """Train until ``max_steps``; ``resume_from_checkpoint``: True (latest) or a folder."""
        resume_path = resolve_resume_path(resume_from_checkpoint, self.output_dir)
        if resume_path is None and latest_checkpoint(self.output_dir) is not None:
            raise ValueError(
                f"output_dir {str(self.output_dir)!r} already holds checkpoints of an earlier run; pass "
                "resume_from_checkpoint=True to continue it, or choose a new output_dir (nothing was changed)"
            )
        if resume_path is None:
            self._set_aside_old_logs()
        self.sink = MetricsSink(self.output_dir, self.args.report_to, self.args.to_dict())
        if resume_path is not None:
            self._load_checkpoint(resume_path)
            self.sink.rewrite(self.state.log_history)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / "config.yaml").write_text(self._config_yaml())
        self._announce()
        run_callbacks(self.callbacks, "on_train_begin", self)
        self.progress = TrainingProgress(self.console, self.state.max_steps, self.state.global_step)
        try:
            with self._stop, self.progress:
                while self.state.global_step < self.state.max_steps and not self._stop.requested:
                    batch = self._generate_and_score()  # phases 1-4
                    self._update(batch)  # phase 5
        finally:
            self.sink.close()
        if self._stop.requested:
            path = self._save_checkpoint()
            self.console.print(
                f"interrupted at step {self.state.global_step}: checkpoint saved to {path}. Resume with "
                "trainer.train(resume_from_checkpoint=True) or `rloo train CONFIG --resume`."
            )
            raise KeyboardInterrupt
        self.save_model(str(self.output_dir / "final"))
        run_callbacks(self.callbacks, "on_train_end", self)
        return self.state

    def _set_aside_old_logs(self) -> None:
        """A fresh run into a folder with logs of an earlier run (that never checkpointed)
        renames them instead of appending to or overwriting them."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for name in ("metrics.jsonl", "completions.jsonl", "warnings.log"):
            path = self.output_dir / name
            if path.exists():
                kept = path.with_name(f"{path.stem}.before-{stamp}{path.suffix}")
                path.rename(kept)
                self.console.print(f"kept the earlier run's {name} as {kept.name}")

    def _announce(self) -> None:
        trainable, total = count_parameters(self.model)
        self.console.print(self.args.describe_algorithm())
        self.console.print(
            f"model: {trainable:,} trainable / {total:,} parameters on {self.accelerator.device} "
            f"({self.accelerator.mixed_precision}); {self.state.max_steps} steps of "
            f"{self.args.prompts_per_generation} prompts x {self.args.num_generations} completions per generation"
        )

    # ------------------------------------------------------------------ phases 1-4
    def _generate_and_score(self) -> ScoredBatch:
        args = self.args
        indices = self.sampler.next_indices(args.prompts_per_generation)
        t0 = time.perf_counter()  # 1-2. generate and score
        sample = self._sample_and_score(self.train_dataset, indices, self.generator)
        rollout, scorable = sample.rollout, sample.scorable
        rewards = clip_rewards(sample.raw_rewards, args.reward_clip_range)
        t2 = time.perf_counter()  # 3. log-probs
        loss_mask = rollout.completion_mask
        if self.spec.mask_truncated_completions:
            loss_mask = mask_truncated(loss_mask, rollout.truncated)
        reference_logprobs = self._reference_logprobs(rollout) if self.spec.beta > 0 else None
        needs_old = args.optimizer_steps_per_generation > 1
        old_logprobs = self._no_grad_logprobs(self.model, rollout) if needs_old else None
        t3 = time.perf_counter()  # 4. advantages
        per_token_kl = None
        if reference_logprobs is not None:
            sampling_logprobs = old_logprobs if old_logprobs is not None else rollout.sampler_logprobs
            per_token_kl = get_kl_estimator(self.spec.kl_estimator)(sampling_logprobs, reference_logprobs)
            if self.spec.kl_placement == "reward":
                rewards = kl_penalized_rewards(rewards, per_token_kl, loss_mask, self.spec.beta)
        advantages = get_advantage_estimator(self.spec.advantage_estimator)(rewards, rollout.group_ids, scorable)
        if self.spec.normalize_advantages:
            advantages = normalize_advantages(advantages, scorable)

        metrics = sample.metrics
        self._warn_about(metrics)
        metrics.update(advantage_metrics(advantages, scorable))
        metrics["frac_reward_zero_std"] = frac_zero_std_groups(rewards, rollout.group_ids, scorable)
        if per_token_kl is not None:
            metrics["kl"] = float(masked_mean(per_token_kl, loss_mask))
        metrics.update({"timing/generate": sample.generate_seconds, "timing/score": t2 - t0 - sample.generate_seconds})
        metrics["timing/reference"] = t3 - t2
        self.state.num_input_tokens_seen += int(rollout.prompt_mask.sum()) + rollout.num_completion_tokens
        if args.log_completions and self.state.global_step % args.logging_steps == 0:
            write_completions(
                self.output_dir / "completions.jsonl",
                self.state.global_step,
                sample.prompts,
                sample.completion_texts,
                sample.raw_rewards,
                scorable,
                advantages,
            )
        return ScoredBatch(rollout, loss_mask, advantages, old_logprobs, reference_logprobs, metrics)

    def _warn_about(self, metrics: dict[str, float]) -> None:
        if metrics["rewards/unscorable"]:
            self.warn("some completions got None from every reward function: they are left out of the baselines")
        if metrics["prompts/truncated"]:
            self.warn(f"prompts longer than max_prompt_length={self.args.max_prompt_length} are cut from the left")
        for name in self.reward_names:
            if metrics.get(f"rewards/{name}/nonfinite"):
                self.warn(f"reward function `{name}` returned NaN/inf: treated as 'does not apply'")

    def _sample_and_score(self, dataset: Any, indices: list[int], generator: torch.Generator) -> SampledBatch:
        """Phases 1-2 for the prompts at ``indices``: K completions each, scored."""
        args, tok, k = self.args, self.processing_class, self.args.num_generations
        raw_prompts = [dataset[i]["prompt"] for i in indices]
        tokenized = data_lib.encode_prompts(raw_prompts, tok, args.max_prompt_length)
        group_ids = list(range(self.state.num_groups_seen, self.state.num_groups_seen + len(indices)))
        self.state.num_groups_seen += len(indices)
        t0 = time.perf_counter()
        rollout = self._rollout(tokenized.ids, group_ids, generator)
        generate_seconds = time.perf_counter() - t0
        texts = tok.batch_decode(rollout.completion_ids, skip_special_tokens=True)
        completions = as_completions(texts, data_lib.is_conversational(raw_prompts[0]))
        scores = compute_rewards(
            self.reward_funcs,
            prompts=[p for p in raw_prompts for _ in range(k)],
            completions=completions,
            completion_ids=rollout.completion_id_lists(),
            columns=data_lib.gather_columns(dataset, indices, k),
            trainer_state=self.state,
            names=self.reward_names,
        )
        device = rollout.completion_ids.device
        raw_rewards, scorable = combine_rewards(scores.values.to(device), self.reward_weights.to(device))
        metrics = reward_metrics(scores.values, raw_rewards, scorable, self.reward_names, scores.nonfinite_counts)
        metrics.update(completion_metrics(rollout))
        metrics["prompts/truncated"] = float(tokenized.num_truncated)
        return SampledBatch(rollout, raw_prompts, texts, raw_rewards, scorable, metrics, generate_seconds)

    def _rollout(self, prompt_ids: list[list[int]], group_ids: list[int], generator: torch.Generator) -> Rollout:
        model = self.unwrapped_model
        model.eval()
        try:
            with self.accelerator.autocast():
                return generate_rollouts(
                    model,
                    prompt_ids,
                    group_ids,
                    num_generations=self.args.num_generations,
                    max_new_tokens=self.args.max_completion_length,
                    params=self.sampling,
                    eos_token_ids=self.eos_token_ids,
                    pad_token_id=self.processing_class.pad_token_id,
                    generator=generator,
                )
        finally:
            model.train()

    @torch.no_grad()
    def _no_grad_logprobs(self, model: torch.nn.Module, rollout: Rollout) -> torch.Tensor:
        """Log-probs of the whole batch in passes within the logits budget, without gradient: ``(N, Tc)``."""
        out = torch.zeros_like(rollout.sampler_logprobs)
        n = rollout.completion_ids.shape[0]
        max_rows = self._rows_per_pass(rollout, cap=n)
        all_rows = torch.arange(n, device=out.device)
        for rows in plan_passes(all_rows, rollout.completion_mask.sum(dim=1), max_rows):
            tc = int(rollout.completion_mask[rows].sum(dim=1).max())
            with self.accelerator.autocast():
                lp = completion_logprobs(
                    model,
                    rollout.prompt_ids[rows],
                    rollout.prompt_mask[rows],
                    rollout.completion_ids[rows, : max(tc, 1)],
                    rollout.completion_mask[rows, : max(tc, 1)],
                    self.args.temperature,
                ).logprobs
            out[rows, : lp.shape[1]] = lp.float()
        return out * rollout.completion_mask

    def _reference_logprobs(self, rollout: Rollout) -> torch.Tensor:
        with reference_mode(self.unwrapped_model, self.ref_model) as reference:
            return self._no_grad_logprobs(reference, rollout)

    # ------------------------------------------------------------------ phase 5
    def _update(self, batch: ScoredBatch) -> None:
        args = self.args
        rows = micro_batch_rows(batch.num_rows, args.per_device_train_batch_size, batch.advantages.device)
        accumulation = args.gradient_accumulation_steps
        for _ in range(args.num_iterations):
            for start in range(0, len(rows), accumulation):
                if self.state.global_step >= self.state.max_steps or self._stop.requested:
                    return
                step_start = time.perf_counter()
                update_metrics = self._optimizer_step(batch, rows[start : start + accumulation])
                self._finish_step({**batch.metrics, **update_metrics}, step_start, batch)

    def _rows_per_pass(self, rollout: Rollout, cap: int) -> int:
        length = rollout.prompt_ids.shape[1] + rollout.completion_ids.shape[1]
        vocab = self.unwrapped_model.get_output_embeddings().weight.shape[0]
        return rows_per_pass(length, vocab, self.args.max_logits_memory_mb, cap)

    def _optimizer_step(self, batch: ScoredBatch, step_rows: list[torch.Tensor]) -> dict[str, float]:
        """One optimizer step over ``step_rows`` (its micro-batches).

        The loss is normalized by the totals of the whole step; rows with zero advantage
        are skipped when that is exact, and the rest is cut into passes that keep the
        logits within ``max_logits_memory_mb``, longest completions together.
        """
        args = self.args
        all_rows = torch.cat(step_rows)
        total_tokens = float(batch.loss_mask[all_rows].sum())
        total_sequences = float(all_rows.numel())
        exact_skip = args.skip_zero_advantage and args.entropy_coef == 0
        exact_skip = exact_skip and (self.spec.beta == 0 or self.spec.kl_placement == "reward")
        active = trainable_rows(all_rows, batch.advantages, exact_skip)
        max_rows = self._rows_per_pass(batch.rollout, cap=args.per_device_train_batch_size)
        self.model.train()
        results = []
        for rows in plan_passes(active, batch.rollout.completion_mask.sum(dim=1), max_rows):
            with self.accelerator.autocast():
                result = self._micro_batch_loss(micro_batch(batch, rows), total_tokens, total_sequences)
            self.accelerator.backward(result.loss)
            results.append(result)
        if not results:  # every row skipped: the gradient is exactly zero, and AdamW still steps
            for param in self.model.parameters():
                if param.requires_grad:
                    param.grad = torch.zeros_like(param)
        max_norm = args.max_grad_norm if args.max_grad_norm > 0 else float("inf")
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        metrics = update_metrics(results)
        metrics["train/skipped_rows_frac"] = 1.0 - active.numel() / max(1, all_rows.numel())
        metrics["grad_norm"] = float(grad_norm)
        metrics["learning_rate"] = self.scheduler.get_last_lr()[0]
        return metrics

    def _micro_batch_loss(self, mb: MicroBatch, total_tokens: float, total_sequences: float) -> MicroBatchResult:
        bonus = self.args.entropy_coef > 0
        current = completion_logprobs(
            self.model,
            mb.prompt_ids,
            mb.prompt_mask,
            mb.completion_ids,
            mb.completion_attention,
            self.args.temperature,
            with_entropy=True,
            entropy_requires_grad=bonus,
        )
        logprobs = current.logprobs.float()
        assert current.entropy is not None
        inputs = MicroBatchInputs(
            logprobs=logprobs,
            old_logprobs=mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach(),
            reference_logprobs=mb.reference_logprobs,
            advantages=mb.advantages,
            loss_mask=mb.loss_mask,
            entropy=current.entropy.float(),
        )
        out = micro_batch_objective(
            inputs,
            self.spec,
            entropy_coef=self.args.entropy_coef,
            total_tokens=total_tokens,
            total_sequences=total_sequences,
            max_completion_length=self.args.max_completion_length,
        )
        entropy_mask = mb.loss_mask if mb.loss_mask.sum() > 0 else mb.completion_attention
        entropy = float(masked_mean(current.entropy.detach().float(), entropy_mask))
        return MicroBatchResult(out.loss, float(out.loss.detach()), entropy, out.clip, out.kl)

    # ------------------------------------------------------------------ logging and checkpoints
    def _finish_step(self, metrics: dict[str, float], step_start: float, batch: ScoredBatch) -> None:
        args, state = self.args, self.state
        state.global_step += 1
        state.epoch = self.sampler.epochs_completed_float
        step_time = time.perf_counter() - step_start
        generation_time = metrics["timing/generate"] + metrics["timing/score"] + metrics["timing/reference"]
        metrics["timing/train"] = step_time
        metrics["timing/step"] = step_time + generation_time / args.optimizer_steps_per_generation
        metrics["tokens_per_second"] = batch.rollout.num_completion_tokens / max(
            generation_time + step_time * args.optimizer_steps_per_generation, 1e-9
        )
        metrics["num_tokens"] = float(state.num_input_tokens_seen)
        self._window.append(metrics)
        self.progress.update(state.global_step, metrics)
        run_callbacks(self.callbacks, "on_step_end", self)
        if state.global_step % args.logging_steps == 0 or state.global_step == state.max_steps:
            self._log(mean_metrics(self._window))
            self._window = []
        if args.eval_steps and self.eval_dataset is not None and state.global_step % args.eval_steps == 0:
            self._log(self.evaluate())
        if state.global_step % args.save_steps == 0:
            self._save_checkpoint()

    def _log(self, metrics: dict[str, float]) -> None:
        logs = {"step": float(self.state.global_step), "epoch": self.state.epoch, **metrics}
        self.state.log_history.append(logs)
        self.sink.write(logs)
        shown = ("reward", "reward_std", "kl", "loss", "entropy", "completions/mean_length", "eval_reward")
        self.console.print(
            f"step {self.state.global_step}/{self.state.max_steps} "
            + " ".join(f"{k}={logs[k]:.4g}" for k in shown if k in logs)
        )
        run_callbacks(self.callbacks, "on_log", self, logs)

    def _config_yaml(self) -> str:
        values = self.args.to_dict() if self.run_config is None else {**self.run_config, **self.args.to_dict()}
        return yaml.safe_dump(values, sort_keys=False)

    def warn(self, message: str) -> None:
        """Print a warning once and append it to ``output_dir/warnings.log`` (shown in the report)."""
        if message in self._warned:
            return
        self._warned.add(message)
        self.console.print(f"[yellow]warning:[/yellow] {message}", highlight=False)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with (self.output_dir / "warnings.log").open("a") as handle:
            handle.write(f"step {self.state.global_step}: {message}\n")

    def _save_checkpoint(self) -> Path:
        training_state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(self.generator),
            "sampler": self.sampler.state_dict(),
        }
        path = save_checkpoint(
            self.output_dir,
            self.state.global_step,
            model=self.unwrapped_model,
            tokenizer=self.processing_class,
            training_state=training_state,
            trainer_state=self.state.to_dict(),
            config_yaml=self._config_yaml(),
            save_total_limit=self.args.save_total_limit,
        )
        run_callbacks(self.callbacks, "on_save", self, path)
        return path

    def _load_checkpoint(self, path: Path) -> None:
        trainer_state, training_state = load_checkpoint_states(path)
        load_model_weights(self.unwrapped_model, path)
        self.optimizer.load_state_dict(training_state["optimizer"])
        self.scheduler.load_state_dict(training_state["scheduler"])
        restore_rng_state(training_state["rng"], self.generator)
        self.sampler.load_state_dict(training_state["sampler"])
        max_steps = self.state.max_steps
        self.state = TrainerState.from_dict(trainer_state)
        self.state.max_steps = max_steps
        self.console.print(f"resumed from {path} at step {self.state.global_step}")

    # ------------------------------------------------------------------ public helpers
    def evaluate(self) -> dict[str, float]:
        """Mean reward of K sampled completions per eval prompt, as ``eval_`` metrics.

        Uses its own random generator, so evaluating does not change the training run.
        """
        if self.eval_dataset is None:
            raise ValueError("evaluate() needs an eval_dataset")
        generator = torch.Generator(device=self.accelerator.device).manual_seed(self.args.seed + 1)
        size = self.args.prompts_per_generation
        rewards, scorable = [], []
        for start in range(0, len(self.eval_dataset), size):
            indices = list(range(start, min(start + size, len(self.eval_dataset))))
            sample = self._sample_and_score(self.eval_dataset, indices, generator)
            rewards.append(sample.raw_rewards)
            scorable.append(sample.scorable)
        all_rewards, valid = torch.cat(rewards), torch.cat(scorable)
        scored = all_rewards[valid]
        return {
            "eval_reward": float(scored.mean()) if scored.numel() else float("nan"),
            "eval_reward_std": float(scored.std()) if scored.numel() > 1 else 0.0,
            "eval_unscorable": float((~valid).sum()),
        }

    def save_model(self, output_dir: str | None = None) -> Path:
        """Save the policy (the adapter only, for PEFT) and the tokenizer as safetensors."""
        path = Path(output_dir or self.args.output_dir)
        save_pretrained_quietly(self.unwrapped_model, path)
        save_pretrained_quietly(self.processing_class, path)
        return path
