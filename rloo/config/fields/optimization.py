"""The optimizer step: micro-batch size and accumulation, the run's length, the learning-rate schedule, the
optimizer, precision, and the guards around a step (non-finite steps, health monitors). Built by
:mod:`rloo.training.setup.optimization`; the schedule's rules are :mod:`rloo.config.schedule`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rloo.config.errors import fail
from rloo.config.field_types import KeywordMapping
from rloo.config.fields.declare import option
from rloo.config.optimizers import OPTIMIZERS, parse_optim_args
from rloo.config.schedule import scheduler_problem, steps_problem
from rloo.suggest import did_you_mean

if TYPE_CHECKING:
    from rloo.config.rloo_config import RLOOConfig


@dataclass
class OptimizationFields:
    """Optimization fields of ``RLOOConfig``, with their documentation (``health_thresholds`` is resolved and
    checked by :mod:`rloo.config.health` when the config is built)."""

    learning_rate: float = option(1e-6, "Peak learning rate, > 0 (1e-6 is typical for RL).", trl="learning_rate")
    per_device_train_batch_size: int = option(
        8,
        "Completions (not prompts) per micro-batch on one process, >= 1: 8 with num_generations=4 is 2 prompts.",
        trl="per_device_train_batch_size",
    )
    gradient_accumulation_steps: int = option(
        1,
        "Micro-batches per optimizer step, >= 1; also the default of steps_per_generation.",
        trl="gradient_accumulation_steps",
    )
    max_steps: int = option(-1, "Optimizer steps to train, >= 1; -1 = from num_train_epochs.", trl="max_steps")
    num_train_epochs: float = option(
        1.0, "Passes over the training prompts when max_steps is -1, > 0 (fractions allowed).", trl="num_train_epochs"
    )
    warmup_ratio: float = option(
        0.0,
        "Fraction of the optimizer steps spent in linear learning-rate warm-up, in [0, 1); used if warmup_steps is 0 "
        "(transformers 5 writes warmup_steps=0.1 instead).",
        trl="warmup_ratio",
    )
    warmup_steps: float = option(
        0,
        "Optimizer steps of linear LR warm-up, >= 0, or a fraction of the run in (0, 1) (0.1: the first 10%, as "
        "transformers 5); when > 0 it overrides warmup_ratio.",
        trl="warmup_steps",
    )
    lr_scheduler_type: str = option(
        "linear",
        "Learning-rate schedule, one of transformers' get_scheduler: linear, cosine, cosine_with_restarts, "
        "polynomial, constant, constant_with_warmup, inverse_sqrt, cosine_with_min_lr, cosine_warmup_with_min_lr, "
        "warmup_stable_decay.",
        trl="lr_scheduler_type",
    )
    lr_scheduler_kwargs: KeywordMapping | None = option(
        None,
        "Keyword arguments of the schedule, e.g. {min_lr_rate: 0.1} for cosine_with_min_lr, {num_cycles: 2} "
        "for cosine_with_restarts; checked when the config is built.",
        trl="lr_scheduler_kwargs",
    )
    max_grad_norm: float = option(
        1.0, "Clip the global gradient norm to this, >= 0; 0 disables clipping.", trl="max_grad_norm"
    )
    health_thresholds: KeywordMapping | None = option(
        None,
        "Live health monitors (length/KL/reward/entropy collapse, train up eval down, loss spikes): thresholds "
        "by name over the defaults (docs/reliability.md: Health monitors); 0 turns one off. A firing monitor warns.",
        trl=None,
    )
    max_nonfinite_steps: int = option(
        3,
        "An optimizer step whose loss or gradient is NaN/inf is skipped (no update), counted in "
        "train/nonfinite_steps and warned; after this many in a row training stops, keeping its checkpoints.",
        trl=None,
    )
    optim: str = option(
        "adamw_torch",
        f"Optimizer, built by transformers' factory: one of {', '.join(OPTIMIZERS)} (the 8-bit ones need "
        "bitsandbytes; on a CPU >= 0.50, where paged is plain). The adam_* fields apply to the AdamW ones.",
        trl="optim",
    )
    optim_args: str | None = option(
        None,
        "Extra optimizer arguments as transformers reads them, 'key=value,key=value': sgd takes momentum, "
        "dampening, weight_decay, nesterov; adagrad lr_decay, weight_decay, eps; rmsprop momentum, alpha, eps, "
        "weight_decay, centered. Refused for the other optimizers (transformers ignores it there).",
        trl="optim_args",
    )
    weight_decay: float = option(0.0, "Weight decay of all trainable weights, >= 0.", trl="weight_decay")
    adam_beta1: float = option(0.9, "AdamW beta1 (decay of the gradient mean), in [0, 1).", trl="adam_beta1")
    adam_beta2: float = option(0.999, "AdamW beta2 (decay of the squared gradient), in [0, 1).", trl="adam_beta2")
    adam_epsilon: float = option(1e-8, "AdamW epsilon added to the denominator, >= 0.", trl="adam_epsilon")
    bf16: bool | None = option(
        None,
        "bf16 mixed precision: True, False (fp32), or None = bf16 on GPUs that support it, fp32 elsewhere (TRL: True).",
        trl="bf16",
    )
    fp16: bool = option(
        False, "fp16 autocast + gradient scaler on a CUDA GPU (else fp32, warned); not with bf16=True.", trl="fp16"
    )
    gradient_checkpointing: bool = option(
        False, "Recompute activations in the backward: less memory, slower (TRL: True).", trl="gradient_checkpointing"
    )
    gradient_checkpointing_kwargs: KeywordMapping | None = option(
        None,
        "Keyword arguments of the model's gradient_checkpointing_enable, over rloo's {use_reentrant: false}.",
        trl="gradient_checkpointing_kwargs",
    )
    disable_dropout: bool = option(
        True, "Dropout off in the policy: sampling and training see one policy (TRL: False).", trl="disable_dropout"
    )


def check_optimization(config: RLOOConfig) -> None:
    """Batch sizes, schedule, optimizer, precision and the run's length."""
    if config.per_device_train_batch_size < 1:
        raise fail("per_device_train_batch_size", config.per_device_train_batch_size, "must be >= 1")
    if config.gradient_accumulation_steps < 1:
        raise fail("gradient_accumulation_steps", config.gradient_accumulation_steps, "must be >= 1")
    if not config.learning_rate > 0:
        raise fail("learning_rate", config.learning_rate, "must be > 0 (1e-6 is typical for RL on LLMs)")
    schedule = scheduler_problem(config.lr_scheduler_type, config.lr_scheduler_kwargs)
    if schedule is not None:
        name, fix = schedule
        raise fail(name, getattr(config, name), fix)
    if not 0 <= config.warmup_ratio < 1:
        raise fail("warmup_ratio", config.warmup_ratio, "must be in [0, 1)")
    problem = steps_problem(config.warmup_steps, zero_allowed=True)
    if problem is not None:
        raise fail("warmup_steps", config.warmup_steps, problem)
    if not config.max_grad_norm >= 0:
        raise fail("max_grad_norm", config.max_grad_norm, "must be >= 0 (0 disables gradient clipping)")
    if not config.weight_decay >= 0:
        raise fail("weight_decay", config.weight_decay, "must be >= 0")
    _check_optimizer(config)
    _check_precision_and_length(config)


def _check_precision_and_length(config: RLOOConfig) -> None:
    if config.fp16 and config.bf16:
        raise fail("fp16", config.fp16, "fp16 and bf16 are both True; choose one (bf16 where the GPU supports it)")
    if config.max_steps == 0 or config.max_steps < -1:
        raise fail("max_steps", config.max_steps, "must be >= 1, or -1 to train for num_train_epochs")
    if config.max_nonfinite_steps < 1:
        raise fail("max_nonfinite_steps", config.max_nonfinite_steps, "must be >= 1 (steps skipped in a row)")
    if config.max_steps == -1 and not config.num_train_epochs > 0:
        raise fail("num_train_epochs", config.num_train_epochs, "must be > 0 when max_steps is -1")


def _check_optimizer(config: RLOOConfig) -> None:
    # torch's AdamW refuses these only when the optimizer is built, naming no field
    if not 0 <= config.adam_beta1 < 1:
        raise fail("adam_beta1", config.adam_beta1, "must be in [0, 1) (AdamW's gradient-mean decay; 0.9 is typical)")
    if not 0 <= config.adam_beta2 < 1:
        raise fail(
            "adam_beta2", config.adam_beta2, "must be in [0, 1) (AdamW's squared-gradient decay; 0.999 is typical)"
        )
    if not config.adam_epsilon >= 0:
        raise fail("adam_epsilon", config.adam_epsilon, "must be >= 0 (added to AdamW's denominator; 1e-8 is typical)")
    if config.optim not in OPTIMIZERS:
        raise fail("optim", config.optim, f"choose one of {list(OPTIMIZERS)}{did_you_mean(config.optim, OPTIMIZERS)}")
    if config.optim_args is not None:
        try:
            parse_optim_args(config.optim, config.optim_args)
        except ValueError as error:
            raise fail("optim_args", config.optim_args, str(error)) from None
