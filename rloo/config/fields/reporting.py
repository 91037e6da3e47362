"""What the run writes and when: metrics logs, evaluations, checkpoints and the best model, experiment
trackers, completion logs and the gradient-variance probe (:mod:`rloo.training.monitoring`,
:mod:`rloo.training.checkpointing`).

:data:`TRACKERS` is the one list of built-in trackers: ``report_to`` accepts its names (and its help text
lists them), and :mod:`rloo.training.monitoring.trackers` names the package a missing one needs. To add a
tracker accelerate ships, add one entry; a tracker of one's own needs none
(``accelerate.tracking.register_tracker_class``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rloo.config.errors import fail
from rloo.config.field_types import NameList
from rloo.config.fields.declare import option
from rloo.config.schedule import steps_problem

if TYPE_CHECKING:
    from rloo.config.rloo_config import RLOOConfig

# report_to's built-in trackers, accelerate's LoggerType values -> the package each one imports
TRACKERS: Mapping[str, str] = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "trackio": "trackio",
    "comet_ml": "comet_ml",
    "mlflow": "mlflow",
    "aim": "aim",
    "clearml": "clearml",
    "dvclive": "dvclive",
    "swanlab": "swanlab",
}
# report_to: a tracker above, "all" installed ones, or "none" (or a class registered with accelerate)
REPORT_SINKS: tuple[str, ...] = ("none", "all", *TRACKERS)
STRATEGIES: tuple[str, ...] = ("steps", "epoch", "no")  # transformers' IntervalStrategy values


@dataclass
class ReportingFields:
    """Logging, evaluation and checkpoint fields of ``RLOOConfig``, with their documentation."""

    logging_steps: float = option(
        10,
        "Log the metrics, averaged since the last log, every this many optimizer steps, >= 1, or a fraction of the "
        "run in (0, 1) (0.1: every 10% of max_steps).",
        trl="logging_steps",
    )
    logging_first_step: bool = option(False, "Also log after the first optimizer step.", trl="logging_first_step")
    save_steps: float = option(
        500,
        "Save output_dir/checkpoint-STEP every this many optimizer steps, >= 1, or a fraction of the run in (0, 1): "
        "at the first generation-batch boundary at or after each multiple, so every checkpoint resumes exactly.",
        trl="save_steps",
    )
    save_strategy: str = option(
        "steps",
        "When to checkpoint: steps (every save_steps), epoch (after each pass over the prompts) or no (only "
        "the final model).",
        trl="save_strategy",
    )
    save_total_limit: int | None = option(
        None, "Keep at most this many checkpoints, deleting the oldest, >= 1; None = keep all.", trl="save_total_limit"
    )
    eval_steps: float | None = option(
        None,
        "Evaluate on the eval_dataset every this many optimizer steps, >= 1, or a fraction of the run in (0, 1); "
        "None = never.",
        trl="eval_steps",
    )
    eval_strategy: str | None = option(
        None,
        "When to evaluate: steps (every eval_steps), epoch (after each pass over the prompts) or no. None = steps "
        "when eval_steps is set, else no (TRL: no).",
        trl="eval_strategy",
    )
    load_best_model_at_end: bool = option(
        False,
        "Keep the weights of the best evaluation in output_dir/best and load them at the end (needs evaluation).",
        trl="load_best_model_at_end",
    )
    metric_for_best_model: str | None = option(
        None,
        "The eval metric that picks the best model (eval_ prefix optional); None = eval_reward.",
        trl="metric_for_best_model",
    )
    greater_is_better: bool | None = option(
        None,
        "Whether a larger metric_for_best_model is better; None = True unless its name has 'loss'.",
        trl="greater_is_better",
    )
    num_generations_eval: int | None = option(
        None, "Completions per prompt in evaluation, >= 1; None = num_generations.", trl="num_generations_eval"
    )
    per_device_eval_batch_size: int | None = option(
        None,
        "Completions per evaluation batch on each process, >= 1 (rounded down to whole prompts, at least one); "
        "None = as many as a training generation batch.",
        trl="per_device_eval_batch_size",
    )
    report_to: NameList = option(
        ("none",),
        "Experiment trackers besides metrics.jsonl, through accelerate: none, all (every installed one), "
        f"{', '.join(TRACKERS)}, or a tracker registered with accelerate. Logged under TRL's names "
        "(train/reward, eval/reward) with the run's config.",
        trl="report_to",
    )
    log_completions: bool = option(
        False,
        "Append prompts, completions, rewards and advantages to output_dir/completions.jsonl every logging step.",
        trl="log_completions",
    )
    log_multimodal: bool = option(
        True,
        "With log_completions, save each prompt's images as PNG files in output_dir/completion_images, named in "
        "its completions' rows (images); False: text only, for smaller logs.",
        trl="log_multimodal",
    )
    log_grad_variance: int = option(
        0,
        "Every this many optimizer steps, measure the variance of the policy-gradient estimate across the batch's "
        "prompts for the advantages used and, on the same samples, for no baseline, group mean, leave-one-out and "
        "GRPO (grad_var/* metrics; docs/metrics.md: Live diagnostics), >= 0; 0 = off. Costs about one extra "
        "optimizer step's forward and backward, row by row, per measured batch.",
        trl=None,
    )
    num_completions_to_print: int | None = option(
        None,
        "Accepted for TRL configs (TRL: completions printed to the console, None = all), >= 0 or None, but unused: "
        "completions are written by log_completions instead.",
        trl="num_completions_to_print",
    )


def check_reporting(config: RLOOConfig) -> None:
    """The logging, saving and evaluation cadences and what depends on them, the trackers, the probes."""
    for name in ("logging_steps", "save_steps", "eval_steps"):
        problem = None if getattr(config, name) is None else steps_problem(getattr(config, name))
        if problem is not None:
            raise fail(
                name, getattr(config, name), problem + (", or None to skip evaluation" if name == "eval_steps" else "")
            )
    if config.save_total_limit is not None and config.save_total_limit < 1:
        raise fail("save_total_limit", config.save_total_limit, "must be >= 1, or None to keep every checkpoint")
    if config.num_generations_eval is not None and config.num_generations_eval < 1:
        raise fail("num_generations_eval", config.num_generations_eval, "must be >= 1, or None for num_generations")
    if config.per_device_eval_batch_size is not None and config.per_device_eval_batch_size < 1:
        raise fail("per_device_eval_batch_size", config.per_device_eval_batch_size, "must be >= 1, or None")
    _check_strategies(config)
    for sink in config.report_to:
        if sink not in REPORT_SINKS and not _registered_tracker(sink):
            raise fail(
                "report_to",
                config.report_to,
                f"each entry must be one of {list(REPORT_SINKS)} or a tracker registered with "
                "accelerate.tracking.register_tracker_class",
            )
    if config.log_grad_variance < 0:
        raise fail("log_grad_variance", config.log_grad_variance, "must be >= 0 (steps between measurements; 0 = off)")
    if config.num_completions_to_print is not None and config.num_completions_to_print < 0:
        raise fail("num_completions_to_print", config.num_completions_to_print, "must be >= 0, or None")


def _check_strategies(config: RLOOConfig) -> None:
    """eval_strategy / save_strategy and what depends on them."""
    for name in ("eval_strategy", "save_strategy"):
        if getattr(config, name) not in STRATEGIES + ((None,) if name == "eval_strategy" else ()):
            raise fail(name, getattr(config, name), f"choose one of {list(STRATEGIES)}")
    if config.load_best_model_at_end and config.evaluation_strategy == "no":
        raise fail("load_best_model_at_end", True, "it needs evaluations: set eval_steps or eval_strategy='epoch'")
    if config.eval_strategy == "steps" and config.eval_steps is None:
        raise fail("eval_strategy", "steps", "set eval_steps (evaluate every this many steps), or use epoch")


def _registered_tracker(name: str) -> bool:
    """A custom tracker class registered with accelerate under ``name`` (imported only then)."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    return name in LOGGER_TYPE_TO_CLASS
