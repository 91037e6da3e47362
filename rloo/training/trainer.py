"""``RLOOTrainer``: the training loop, top to bottom.

One *generation batch* is P prompts x K completions. ``_train_on_next_batch`` runs its phases,
each one call in a named timer (``timing/<phase>``, :mod:`rloo.training.timing`):

1-2. rollout    K completions per prompt, sampled and scored (:class:`rloo.training.rollouts.maker.RolloutMaker`),
                from the rollout source (:mod:`rloo.training.rollouts`: refilled with groups that
                have a signal with ``dynamic_sampling``), stamped with the policy version that
                sampled them;
3.   logprobs   reference log-probs when beta > 0; "old" log-probs when the batch feeds more than one
                optimizer step or the KL is a reward penalty, left to the update's one pass where it is one;
4.   advantages KL penalty (where its placement puts it) and the baseline of the estimator
                (phases 3-4: :class:`rloo.training.experience.ExperienceMaker`); then, when due, the
                completion log and the gradient-variance probe (``diagnostics``);
5.   update     per optimizer step (``num_iterations`` passes of micro-batches with gradient
                accumulation): clipping, the optimizer and the LR schedule (:mod:`rloo.training.update`);
6.   log        per optimizer step: logs, evaluation, checkpoints.

Departures from TRL are listed in :mod:`rloo.config.rloo_config` and :mod:`rloo.algo.advantages`.
"""

# size: RLOOTrainer wires the run's ~20 collaborators (__init__) and keeps TRL's public methods (train, evaluate,
# save_model, push_to_hub, end); the step itself, _train_on_next_batch, is ~20 lines and calls one object per phase
from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from accelerate.utils import set_seed
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin
from transformers.trainer_utils import TrainOutput

from rloo.config import RLOOConfig, as_config
from rloo.config.fields.rollouts import staleness_caution
from rloo.config.trl.legacy import check_trainer_arguments
from rloo.data.loading import load_eval_sets, load_train_and_eval
from rloo.data.prompt_order import row_source
from rloo.generation.attention_backend import sdpa_priority
from rloo.pipeline import RolloutSettings, ScoredRollout
from rloo.report import metric_names as names
from rloo.rewards.resolve import check_code_rewards, processing_classes, run_rewards
from rloo.tools.agent import AgentSettings
from rloo.tools.environments import environment_rows
from rloo.tools.rollout_func import bind_rollout_func
from rloo.training.cadence import checkpoint_due, completions_step, evaluation_due, evaluation_setting, logging_due
from rloo.training.callbacks import CallbackMethods, Callbacks
from rloo.training.checkpointing import checkpoints
from rloo.training.checkpointing.best_model import BestModel
from rloo.training.checkpointing.checkpoints import rng_state
from rloo.training.checkpointing.hub import hub_repo_id, push_run
from rloo.training.checkpointing.run_folder import (
    config_yaml,
    open_run,
    with_run_folder,
    write_report,
    write_run_files,
)
from rloo.training.checkpointing.run_record import run_record
from rloo.training.experience import ExperienceMaker, StoredLogprobs
from rloo.training.metrics import headline_eval_reward
from rloo.training.monitoring.compute_metrics import resolve_compute_metrics
from rloo.training.monitoring.evaluation import Evaluation
from rloo.training.monitoring.grad_variance import GradVarianceProbe
from rloo.training.monitoring.health import Alert, HealthMonitor
from rloo.training.monitoring.logs import (
    MetricsSink,
    RunWarnings,
    announce,
    log_console,
    log_line,
    mean_metrics,
    train_summary,
)
from rloo.training.monitoring.nonfinite import SKIPPED_STEP
from rloo.training.monitoring.progress import TrainingProgress
from rloo.training.monitoring.signals import StopRequest, TrainingInterrupted, interrupted_message, note_resume
from rloo.training.monitoring.trackers import accelerator_with_trackers
from rloo.training.parallel.distributed import Ranks, check_engine
from rloo.training.passes import PendingBatch, TrainBatch, micro_batch_rows
from rloo.training.reference_sync import ReferenceSync
from rloo.training.rollouts.build import rollout_source
from rloo.training.rollouts.maker import RolloutMaker
from rloo.training.rollouts.source import ROLLOUTS_KEY, RolloutSource
from rloo.training.rollouts.versions import check_policy_version
from rloo.training.setup.models import load_processing_class, prepare_policy, resolve_mixed_precision
from rloo.training.setup.optimization import prepare_training, total_steps
from rloo.training.setup.quantized import with_quantization
from rloo.training.state import TrainerState
from rloo.training.timing import PhaseTimer
from rloo.training.update import Updater


class RLOOTrainer(CallbackMethods):
    """Online RLOO fine-tuning of a causal LM. The interface follows TRL's ``RLOOTrainer``."""

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs: Any = None,
        args: RLOOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: PreTrainedTokenizerBase | ProcessorMixin | None = None,
        reward_processing_classes: Any = None,
        callbacks: list[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        *,
        tools: Any = None,
        rollout_func: Any = None,
        environment_factory: Any = None,
        reward_model: Any = None,  # TRL's older name for reward_funcs
        compute_metrics: Any = None,
    ) -> None:
        """TRL's ``RLOOTrainer`` arguments, in TRL's order; ``tools``, ``rollout_func``,
        ``environment_factory``: GRPO's (:func:`rloo.config.trl.legacy.check_trainer_arguments` says what is refused);
        ``compute_metrics``: task metrics of each evaluation (:mod:`rloo.training.monitoring.compute_metrics`)."""
        check_trainer_arguments(optimizers, tools, rollout_func, environment_factory)
        check_code_rewards(reward_funcs)  # no sandbox for code_execution: refused before the policy loads
        self.compute_metrics = resolve_compute_metrics(compute_metrics)  # transformers' attribute: may be set later
        # the config is frozen: what is read here is what config.yaml records
        self.args = args = with_quantization(as_config(args), quantization_config, model)  # QLoRA: recorded
        self.spec = args.algorithm
        set_seed(args.seed)
        precision = resolve_mixed_precision(args.bf16, args.fp16)
        self.accelerator, self.trackers = accelerator_with_trackers(precision, args.report_to)
        sharding = check_engine(self.accelerator.distributed_type)  # None: data parallel; else FSDP2
        self.ranks = Ranks.from_accelerator(self.accelerator, lockstep=sharding is not None)
        self.console = log_console(stderr=True, quiet=not self.ranks.is_main)  # one process prints
        # no output_dir: a fresh runs/rloo-N, chosen by the main process for all (config.yaml records it)
        args, self.output_dir = with_run_folder(args, self.ranks.on_main)
        self.args = args  # read-only, as the config it replaces
        train_dataset = environment_rows(train_dataset, environment_factory, args)  # None: reset() gives prompts
        self.train_dataset, self.eval_dataset = load_train_and_eval(
            train_dataset, eval_dataset, evaluation_setting(args), args.remove_unused_columns
        )

        agent = AgentSettings.from_config(args, tools, environment_factory, lockstep=self.ranks.lockstep)
        policy, self.ref_model = prepare_policy(
            model,
            init_kwargs=args.from_pretrained_kwargs,
            peft_config=peft_config,
            no_dropout=args.disable_dropout,
            gradient_checkpointing=args.gradient_checkpointing,
            beta=self.spec.beta,
            checkpointing_kwargs=args.gradient_checkpointing_kwargs,
        )
        datasets = (self.train_dataset, self.eval_dataset)  # a processor when they hold images
        self.processing_class = load_processing_class(model, processing_class, policy, datasets, args)
        # tools / environments (checked above, before the model loads): an environment's get_reward is a reward
        rewards = (reward_funcs, reward_model, reward_processing_classes)  # rollout_func: columns of its own
        extras = agent.reward_extras() if agent is not None else ([], [])
        self.rewards = run_rewards(args, *rewards, None if rollout_func else self.train_dataset, self.warn, *extras)
        self.reward_funcs = self.rewards.funcs  # TRL's attributes
        self.reward_processing_classes = processing_classes(self.rewards.funcs)

        self.sampler = row_source(self.train_dataset, args.seed, args.shuffle_dataset)
        num_prompts = getattr(self.train_dataset, "num_rows", None)  # None: streaming
        self.state = TrainerState(max_steps=total_steps(args, num_prompts, self.ranks.world_size))
        prepared = prepare_training(self.accelerator, policy, self.ref_model, args, self.state.max_steps, sharding)
        self.model, self.optimizer, self.scheduler = prepared
        self.rewards.to(self.accelerator.device)
        self.reference_sync = ReferenceSync(policy=self.unwrapped_model, reference=self.ref_model, args=args)
        self.rollout_settings = RolloutSettings.from_config(
            args, agent=agent, custom=bind_rollout_func(rollout_func, self)
        )
        self.make_rollouts = RolloutMaker(  # phases 1-2, for the rollout source and the evaluation
            policy=lambda: self.unwrapped_model,
            processing_class=self.processing_class,
            rewards=self.rewards,
            settings=self.rollout_settings,
            trainer_state=lambda: self.state,
            autocast=self.accelerator.autocast,
            all_done=self.ranks.all_done,
        )
        self.rollouts: RolloutSource = rollout_source(  # max_staleness >= 1: older weights; dynamic_sampling
            args,
            self.ranks,
            lambda: self.unwrapped_model,
            (self.processing_class, self.rollout_settings),  # a rollout worker's
            prompts=self.sampler,
            generate=functools.partial(self.make_rollouts, sampling_seed=args.seed),
            reward_weights=self.rewards.weights,  # dynamic_sampling: which groups have a signal
        )
        # what a checkpoint keeps besides weights, optimizer, schedule, RNG and prompt order: saved, restored alike
        self.parts: dict[str, checkpoints.CheckpointPart] = {
            ReferenceSync.KEY: self.reference_sync,
            ROLLOUTS_KEY: self.rollouts,
        }
        # config.yaml's run-file keys: what these arguments name (run_record.py); `rloo train` sets its run file
        named = (model, rewards, (train_dataset, eval_dataset), peft_config, compute_metrics)
        self.run_config: dict[str, Any] = run_record(*named, agent=(tools, rollout_func, environment_factory))
        self._window: list[dict[str, float]] = []
        self._warnings = RunWarnings(self.output_dir, self.console, write=self.ranks.is_main)
        if (caution := staleness_caution(args.max_staleness, args.algorithm.clip_ratio)) is not None:
            self.warn(caution)
        self._stop = StopRequest()
        self.experience = ExperienceMaker(
            args=args,
            ranks=self.ranks,
            model=lambda: self.unwrapped_model,
            reference=self.ref_model,
            reward_names=self.rewards.names,
            reward_weights=self.rewards.weights,
            autocast=self.accelerator.autocast,
            warn=self.warn,
            output_dir=self.output_dir,
        )
        self.evaluation = Evaluation(
            args,
            self.ranks,
            self.rewards.names,
            self.rollout_settings,
            self.make_rollouts,
            self.experience.eval_loss,
        )
        self.grad_variance = GradVarianceProbe.for_run(args, self.ranks)  # None: log_grad_variance off
        self.updater = Updater(
            model=self.unwrapped_model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            accelerator=self.accelerator,
            ranks=self.ranks,
            args=args,
        )
        self.router_aux_loss_coef, self.aux_loss_enabled = self.updater.aux_loss_coef, self.updater.aux_loss_coef > 0
        self.timer = PhaseTimer()
        assert args.health_thresholds is not None  # resolved (all keys) by RLOOConfig
        self.health = HealthMonitor(args.health_thresholds)
        self._checkpoint_due = False
        self._row_texts = checkpoints.RowTexts()  # each logged row encoded once for trainer_state.json
        self.best = BestModel(args=args, output_dir=self.output_dir)
        self.callback_handler = Callbacks(list(callbacks or []), self)
        self.callback_handler.fire("on_init_end")

    @property
    def unwrapped_model(self) -> Any:
        return self.accelerator.unwrap_model(self.model)

    # ------------------------------------------------------------------ the loop
    def train(self, resume_from_checkpoint: bool | str | None = None) -> TrainOutput:
        """Train until ``max_steps``; ``resume_from_checkpoint``: True (latest) or a folder. Returns
        transformers' ``TrainOutput`` (``global_step``, ``training_loss``, ``metrics``); the metrics
        are also the last ``log_history`` entry, as transformers' Trainer writes them."""
        args, ranks = self.args, self.ranks  # files are read and written by the main process only
        resume_path = ranks.on_main(
            lambda: open_run(self.output_dir, resume_from_checkpoint, args.to_dict(), ranks.world_size, self.console)
        )
        self.sink = MetricsSink(self.output_dir, enabled=ranks.is_main)
        if resume_path is not None:
            self._load_checkpoint(resume_path)
        self.rollouts.groups_drawn = self.state.num_groups_seen
        self.rollouts.policy_updated(self.state.global_step)
        config_text = config_yaml(args.to_dict(), self.run_config)
        ranks.on_main(lambda: write_run_files(self.output_dir, config_text, self.sink, self.state, resume_path))
        config, name = {**(self.run_config or {}), **args.to_dict()}, args.run_name or self.output_dir.name
        self.trackers.start(config, name, self.output_dir)
        announce(self.console, args, self.accelerator, self.model, self.state.max_steps, ranks)
        self.callback_handler.fire("on_train_begin")
        self.progress = TrainingProgress(self.console, self.state.max_steps, self.state.global_step)
        start, first_step = time.perf_counter(), self.state.global_step
        cli = not getattr(self.run_config, "notes", None)  # config.yaml re-runs it: all was recorded
        try:
            # on a GPU, SDPA tries flash and efficient attention before cuDNN (rloo.generation.attention_backend)
            with self._stop, self.progress, sdpa_priority(self.accelerator.device):
                while self.state.global_step < self.state.max_steps and not self._stopping(self._stop.requested):
                    self._train_on_next_batch()
            signum = next((s for s in ranks.gather_objects(self._stop.signum) if s is not None), None)
            if signum is None:
                steps = self.state.global_step - first_step
                per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * ranks.world_size
                self._log(train_summary(self.state, time.perf_counter() - start, steps, per_step))
        except Exception as error:  # the newest checkpoint and the resume command, on the error itself
            note_resume(error, checkpoints.latest_checkpoint(self.output_dir), self.output_dir, cli)
            raise
        finally:
            self.trackers.finish()
            self.rollouts.close()  # a rollout worker's process
        if signum is not None:
            path = self._save_checkpoint()
            self.console.print(interrupted_message(self.state.global_step, path, self.output_dir, cli))
            raise TrainingInterrupted(signum, path)
        if self.best.restore(self.unwrapped_model, self.state):
            self.console.print(f"loaded the best model: {self.best.metric}={self.state.best_metric:.4g}")
        self.save_model(str(self.output_dir / "final"))
        ranks.on_main(lambda: write_report(self.output_dir, self.warn))  # as `rloo train`: every run has one
        if args.push_to_hub:
            self.push_to_hub()
        self.callback_handler.fire("on_train_end")
        summary = self.state.log_history[-1]
        return TrainOutput(self.state.global_step, summary["train_loss"], summary)

    def _stopping(self, signalled: bool = False) -> bool:
        """A signal (``signalled``) or a callback's ``control.should_training_stop`` on any process."""
        return self.ranks.any(signalled or self.callback_handler.control.should_training_stop)

    # ------------------------------------------------------------------ the step
    def _train_on_next_batch(self) -> None:
        """One generation batch: each phase is one call in a named timer (:mod:`rloo.training.timing`)."""
        timer = self.timer
        with timer("rollout"):  # 1-2. generate and score: the rollout source's next batch
            scored = self._next_rollouts()
        one_pass = self.updater.one_pass(scored.rollout)  # its forward can give the batch its old log-probs
        with timer("logprobs"):  # 3. reference and old log-probs (one pass: the old ones are left to it)
            logprobs = self.experience.logprobs(scored.rollout, from_update=one_pass)
        with timer("advantages"):  # 4. KL penalty, baseline, the batch's metrics (pending: in its one pass)
            batch = self._train_batch(scored, logprobs)
        with timer("diagnostics"):  # the completion log and the gradient-variance probe, when due
            self._diagnose(scored, batch)  # a pending batch's: once its pass completes it, before its backward
        for n, step_rows in enumerate(self._optimizer_steps(batch)):
            with timer("update"):  # 5. forward/backward passes and the optimizer step (the first on-policy)
                diagnose = functools.partial(self._diagnose, scored)
                outcome = self.updater.step(batch, step_rows, self.state.global_step, n == 0, diagnose)
                batch = outcome.batch  # the first step's fresh old log-probs, for the later steps
            with timer("log"):  # 6. log, evaluate, save
                self._finish_step({**batch.metrics, **outcome.metrics}, outcome.skipped)
        if self._checkpoint_due:  # at a generation-batch boundary: it resumes exactly
            with timer("log"):
                self._save_checkpoint()

    def _next_rollouts(self) -> ScoredRollout:
        scored = self.rollouts.next_batch()
        self.state.num_groups_seen = self.rollouts.groups_drawn
        args = self.args
        step = self.state.global_step
        check_policy_version(scored, step, args.max_staleness, args.weight_sync_steps, args.free_running)
        self.timer.record("generate", scored.generate_seconds)
        self.timer.record("score", scored.score_seconds)
        return scored

    def _train_batch(self, scored: ScoredRollout, logprobs: StoredLogprobs) -> TrainBatch | PendingBatch:
        step = self.state.global_step
        batch = self.experience.train_batch(scored, logprobs)
        assert scored.policy_version is not None  # stamped by the rollout source, checked by _next_rollouts
        batch.metrics[names.POLICY_VERSION] = float(scored.policy_version)
        batch.metrics[names.STALENESS] = float(step - scored.policy_version)
        batch.metrics.update(self.rollouts.metrics())
        self.state.num_input_tokens_seen += self.experience.tokens_seen(scored)
        return batch

    def _diagnose(self, scored: ScoredRollout, batch: TrainBatch | PendingBatch) -> None:
        args, step = self.args, self.state.global_step
        if isinstance(batch, PendingBatch):  # no advantages yet: diagnosed once its pass completes it
            return
        if args.log_completions and (logged := completions_step(args, step, self.state.max_steps)) is not None:
            self.experience.log_completions(logged, scored, batch.advantages)  # the step of its metrics row
        if self.grad_variance is not None and self.grad_variance.due(step):
            rewards, scorable = batch.rewards, scored.rewards.scorable
            assert rewards is not None  # every batch of ExperienceMaker.train_batch has them
            model, autocast = self.unwrapped_model, self.accelerator.autocast
            batch.metrics.update(self.grad_variance.measure(model, batch, rewards, scorable, autocast))

    def _optimizer_steps(self, batch: TrainBatch | PendingBatch) -> Iterator[list[Tensor]]:
        """This process's micro-batches of each optimizer step ``batch`` feeds (``num_iterations``
        passes over it), until ``max_steps`` or a stop request (honoured between generation batches,
        in ``train()``, so the checkpoint it writes resumes exactly)."""
        args = self.args
        rows = micro_batch_rows(batch.num_rows, args.per_device_train_batch_size, batch.loss_mask.device)
        accumulation = args.gradient_accumulation_steps
        for _ in range(args.num_iterations):
            for start in range(0, len(rows), accumulation):
                if self.state.global_step >= self.state.max_steps or self._stopping():
                    return
                self.callback_handler.fire("on_step_begin")
                yield rows[start : start + accumulation]

    # ------------------------------------------------------------------ logging and checkpoints
    def _finish_step(self, metrics: dict[str, float], skipped: bool = False) -> None:
        args, state = self.args, self.state
        if skipped:
            self.warn(SKIPPED_STEP)
        state.global_step += 1
        self.rollouts.policy_updated(state.global_step)
        state.total_loss += metrics["loss"]
        self.reference_sync.after_step(state.global_step)
        epoch_ended = int(self.sampler.epochs_completed_float) > int(state.epoch)
        state.epoch = self.sampler.epochs_completed_float
        metrics.update(
            self.timer.step_metrics(args.optimizer_steps_per_generation, metrics["completions/total_tokens"])
        )
        metrics["num_tokens"] = float(state.num_input_tokens_seen)
        self._raise_alerts(self.health.observe_step(state.health, state.global_step, metrics), metrics)
        self._window.append(metrics)
        self.progress.update(state.global_step, metrics)
        callbacks = self.callback_handler
        callbacks.fire("on_step_end")  # a TrainerCallback's control flags add to the schedule
        if callbacks.requested("should_log") or logging_due(args, state.global_step, state.max_steps):
            self._log(mean_metrics(self._window))
            self._window = []
        evaluate_due = evaluation_due(args, state.global_step, state.max_steps, epoch_ended)
        if self.eval_dataset is not None and (callbacks.requested("should_evaluate") or evaluate_due):
            logs = self.evaluate()
            reward = headline_eval_reward(logs)
            self._raise_alerts(self.health.observe_eval(state.health, state.global_step, reward), logs)
            self.best.track(state, logs, self.unwrapped_model, self._write_model, self.ranks.on_main)
            self._log(logs)
            callbacks.fire("on_evaluate", metrics=logs)
        if checkpoint_due(args, state.global_step, state.max_steps, epoch_ended) or callbacks.requested("should_save"):
            self._checkpoint_due = True  # written once this generation batch is used up

    def _raise_alerts(self, alerts: list[Alert], metrics: dict[str, float]) -> None:
        for alert in alerts:  # health monitors: flagged in the metrics, warned on the console
            metrics[alert.metric] = 1.0
            self.warn(alert.message)

    def _log(self, metrics: dict[str, float]) -> None:
        logs = {"step": float(self.state.global_step), "epoch": self.state.epoch, **metrics}
        self.state.log_history.append(logs)
        self.sink.write(logs)
        self.trackers.log(logs, self.state.global_step)
        self.console.print(log_line(self.state.global_step, self.state.max_steps, logs))
        self.callback_handler.fire("on_log", logs=logs)

    def warn(self, message: str) -> None:
        """Print a warning once and append it to ``output_dir/warnings.log`` (shown in the report)."""
        self._warnings.warn(message, self.state.global_step)

    def _save_checkpoint(self) -> Path:
        self._checkpoint_due = False
        weights = checkpoints.checked_weights(self.unwrapped_model, f"checkpoint-{self.state.global_step}")
        rng = self.ranks.gather_objects(rng_state())
        objects = (self.optimizer, self.scheduler, self.sampler)
        state = checkpoints.training_state(*objects, rng, self.unwrapped_model, self.accelerator.scaler, self.parts)
        path = self.ranks.on_main(
            lambda: checkpoints.save_checkpoint(
                self.output_dir,
                self.state.global_step,
                model=self.unwrapped_model,
                model_state=weights,
                tokenizer=self.processing_class,
                training_state=state,
                trainer_state={**self.state.to_dict(), "world_size": self.ranks.world_size},
                config_yaml=config_yaml(self.args.to_dict(), self.run_config),
                save_total_limit=self.args.save_total_limit,
                row_texts=self._row_texts,
            )
        )
        self.callback_handler.fire("on_save", path=path)
        return path

    def _load_checkpoint(self, path: Path) -> None:
        objects = (self.optimizer, self.scheduler, self.sampler)
        trainer_state = checkpoints.restore_checkpoint(
            path, self.unwrapped_model, *objects, rank=self.ranks.rank, scaler=self.accelerator.scaler, parts=self.parts
        )
        trainer_state.pop("world_size", None)
        self.state = TrainerState.from_dict({**trainer_state, "max_steps": self.state.max_steps})
        self.console.print(f"resumed from {path} at step {self.state.global_step}")

    # ------------------------------------------------------------------ public helpers
    def evaluate(self, eval_dataset: Any = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Mean reward of K sampled completions per eval prompt, pass@k, ``eval_loss`` (TRL's: the objective
        per eval batch) and ``compute_metrics``' task metrics, as ``eval_`` metrics (``eval_<name>_`` for each
        of a dict of named sets; a streaming set is read to its end); ``eval_dataset``: another set (or dict)
        than the trainer's. It leaves the trainer state and so the run alone (:class:`Evaluation`)."""
        data = self.eval_dataset if eval_dataset is None else load_eval_sets(eval_dataset)
        return self.evaluation.run(data, metric_key_prefix, self.compute_metrics)

    def push_to_hub(self, commit_message: str = "End of training", dataset_name: str | None = None, **_: Any) -> str:
        """Save the model to ``output_dir/final`` with a model card and upload it to ``hub_model_id``
        (the main process); returns the commit URL ("" on the other processes)."""
        folder = self.save_model(str(self.output_dir / "final"))
        push = functools.partial(push_run, folder, self.unwrapped_model, self.args, self.state.log_history)
        return self.ranks.on_main(lambda: push(dataset_name, commit_message)) or ""

    @property
    def hub_model_id(self) -> str:
        """The hub repo ``push_to_hub`` uploads to (TRL's scripts print it)."""
        return hub_repo_id(self.args)

    def end(self) -> None:
        """Finish the trackers and leave the process group, as transformers' ``Trainer.end()``: once, at
        the very end of a script (``train``, ``evaluate``, ``save_model`` and ``push_to_hub`` need the group)."""
        self.trackers.finish()
        self.accelerator.end_training()

    def save_model(self, output_dir: str | None = None) -> Path:
        """Save the policy (the adapter only, for PEFT) and the tokenizer as safetensors."""
        path = Path(output_dir) if output_dir else self.output_dir
        weights = checkpoints.checked_weights(self.unwrapped_model, str(path))  # sharded (FSDP): gathered
        self.ranks.on_main(lambda: self._write_model(path, weights))
        return path

    def _write_model(self, path: Path, weights: dict[str, Any] | None = None) -> None:
        checkpoints.save_pretrained_quietly(self.unwrapped_model, path, weights)
        checkpoints.save_pretrained_quietly(self.processing_class, path)
