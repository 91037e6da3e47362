"""The checks ``RLOOConfig`` runs once, when constructed.

Every bad value raises ``ValueError("RLOOConfig.<field>=<value> is invalid: <fix>")``: the
field, the value, and what to set instead (``tests/config/test_rloo_config.py`` has a case per check).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rloo.algo.advantages import ADVANTAGE_ESTIMATORS
from rloo.algo.kl import KL_ESTIMATORS, KL_PLACEMENTS
from rloo.algo.losses import AGGREGATION_MODES, POLICY_LOSSES
from rloo.config.field_types import CONTAINER_KINDS, shown_type
from rloo.config.optimizers import OPTIMIZERS, parse_optim_args
from rloo.config.schedule import scheduler_problem, steps_problem
from rloo.suggest import did_you_mean

if TYPE_CHECKING:
    from rloo.config.rloo_config import RLOOConfig

STRATEGIES: tuple[str, ...] = ("steps", "epoch", "no")  # transformers' IntervalStrategy values
# report_to: accelerate's trackers (rloo.training.monitoring.trackers), "all" installed ones, or "none"
REPORT_SINKS: tuple[str, ...] = (
    "none",
    "all",
    "tensorboard",
    "wandb",
    "trackio",
    "comet_ml",
    "mlflow",
    "aim",
    "clearml",
    "dvclive",
    "swanlab",
)


def fail(name: str, value: Any, fix: str) -> ValueError:
    """The one error format: ``RLOOConfig.<name>=<value> is invalid: <fix>``."""
    return ValueError(f"RLOOConfig.{name}={value!r} is invalid: {fix}")


def validate(config: RLOOConfig) -> None:
    """Run every check; the first failure raises."""
    from rloo.config.sampling_fields import check_sampling  # they import fail from here
    from rloo.config.vllm_fields import check_vllm

    checks = (
        _check_types,
        _check_finite,
        _check_generation,
        _check_algorithm,
        _check_rewards,
        _check_tools,
        _check_off_policy,
        _check_clip_range,
        _check_optimization,
        _check_compile,
        _check_trl_inputs,
        _check_reference_sync,
        _check_batches,
        _check_logging,
        check_vllm,
        check_sampling,
    )
    for check in checks:
        check(config)


_KINDS = {
    "int": lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "list": lambda v: isinstance(v, list | tuple),
    "mapping": lambda v: isinstance(v, Mapping),
}


# what each entry of a container field holds (``reward_weights=["a", 1.0]`` would fail at the first reward sum)
_ELEMENT_KINDS = {"FloatList": "float", "FloatPair": "float", "NameList": "str"}


def declared_annotation(cls: type, name: str) -> str:
    """Field ``name``'s annotation as written in its class body. Not ``Field.type``: transformers'
    HfArgumentParser (TRL's TrlParser) rewrites that in place, to the resolved type without ``| None``."""
    for klass in cls.__mro__:
        annotation = vars(klass).get("__annotations__", {}).get(name)
        if annotation is not None:
            return annotation if isinstance(annotation, str) else str(annotation)
    raise KeyError(name)


def _check_types(config: RLOOConfig) -> None:
    """Each field holds its declared type (``num_generations="4"`` is a string, not a count)."""
    for item in dataclasses.fields(config):
        if not item.init:
            continue
        value, annotation = getattr(config, item.name), declared_annotation(type(config), item.name)
        if value is None and "None" in annotation:
            continue
        alias = annotation.replace(" | None", "").split("[")[0].strip()
        kind = CONTAINER_KINDS.get(alias, alias)
        if kind in _KINDS and not _KINDS[kind](value):
            raise fail(item.name, value, f"expects {shown_type(annotation)}, got a {type(value).__name__}")
        element = _ELEMENT_KINDS.get(alias)
        if element is None:
            continue
        for position, entry in enumerate(value):
            if not _KINDS[element](entry):
                raise fail(
                    item.name,
                    value,
                    f"expects {shown_type(annotation)}, but entry {position} is {entry!r} (a {type(entry).__name__}): "
                    f"give {'a number' if element == 'float' else 'a name'} there",
                )


def _check_finite(config: RLOOConfig) -> None:
    """NaN and infinity are never a setting: every float (and float in a list) must be finite."""
    for item in dataclasses.fields(config):
        value = getattr(config, item.name) if item.init else None
        values = value if isinstance(value, list | tuple) else [value]
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise fail(item.name, value, "must be finite (NaN and infinity are not settings); see its documentation")


def _check_generation(config: RLOOConfig) -> None:
    if config.num_generations < 2:
        raise fail(
            "num_generations",
            config.num_generations,
            "the leave-one-out baseline needs at least 2 completions per prompt; use 2 or more (4-8 is typical)",
        )
    if config.max_completion_length < 1:
        raise fail("max_completion_length", config.max_completion_length, "must be >= 1")
    if config.max_prompt_length is not None and config.max_prompt_length < 1:
        raise fail("max_prompt_length", config.max_prompt_length, "must be >= 1, or None for no truncation")
    if not config.temperature > 0:
        raise fail("temperature", config.temperature, "must be > 0 (use a small value like 0.01 for near-greedy)")
    if not 0 < config.top_p <= 1:
        raise fail("top_p", config.top_p, "must be in (0, 1]; 1.0 disables it")
    if config.top_k < 0:
        raise fail("top_k", config.top_k, "must be >= 0; 0 disables it")
    if config.min_p is not None and not 0 <= config.min_p <= 1:
        raise fail("min_p", config.min_p, "must be in [0, 1], or None to disable it")
    if not config.repetition_penalty > 0:
        raise fail("repetition_penalty", config.repetition_penalty, "must be > 0; 1.0 disables it")


def _check_algorithm(config: RLOOConfig) -> None:
    spec = config.algorithm
    choices: list[tuple[str, str, tuple[str, ...]]] = [
        ("advantage_estimator", spec.advantage_estimator, tuple(sorted(ADVANTAGE_ESTIMATORS))),
        ("kl_estimator", spec.kl_estimator, tuple(sorted(KL_ESTIMATORS))),
        ("kl_placement", spec.kl_placement, tuple(KL_PLACEMENTS)),
        ("ratio_level", spec.ratio_level, tuple(sorted(POLICY_LOSSES))),
        ("loss_aggregation", spec.loss_aggregation, AGGREGATION_MODES),
    ]
    for name, value, valid in choices:
        if value not in valid:
            raise fail(name, value, f"choose one of {list(valid)}")
    if spec.beta < 0 or not math.isfinite(spec.beta):
        raise fail("beta", spec.beta, "the KL coefficient must be a finite number >= 0 (0 disables the KL)")
    if spec.kl_placement == "loss" and spec.kl_estimator == "k1" and spec.beta > 0:
        raise fail(
            "kl_estimator",
            "k1",
            "in the loss (kl_placement='loss') k1's expected gradient is 0 (E[grad log pi] = 0): the penalty would "
            "only add noise. Use kl_estimator='k2' (its gradient is that of KL(pi || pi_ref)) or 'k3' (GRPO's: "
            "KL(pi_ref || pi)), or kl_placement='reward'",
        )
    if config.num_iterations < 1:
        raise fail("num_iterations", config.num_iterations, "must be >= 1 (1 = each batch used once)")
    if not config.max_logits_memory_mb > 0:
        raise fail("max_logits_memory_mb", config.max_logits_memory_mb, "must be > 0 (MiB of logits per pass)")
    if not config.entropy_coef >= 0:
        raise fail("entropy_coef", config.entropy_coef, "must be >= 0 (0 disables the entropy bonus)")
    clip = config.reward_clip_range
    if clip is not None and (len(clip) != 2 or clip[0] > clip[1]):
        raise fail("reward_clip_range", config.reward_clip_range, "give (min, max) with min <= max")
    if config.reward_weights is not None and len(config.reward_weights) == 0:
        raise fail("reward_weights", config.reward_weights, "give one weight per reward function, or None")


def _check_off_policy(config: RLOOConfig) -> None:
    """Sampling with older weights (max_staleness), the off-policy sequence mask, and how several rewards combine."""
    from rloo.algo.advantages import MULTI_OBJECTIVE_AGGREGATIONS

    if config.multi_objective_aggregation not in MULTI_OBJECTIVE_AGGREGATIONS:
        raise fail(
            "multi_objective_aggregation",
            config.multi_objective_aggregation,
            f"choose one of {list(MULTI_OBJECTIVE_AGGREGATIONS)} (TRL's names)",
        )
    if config.max_staleness < 0:
        raise fail("max_staleness", config.max_staleness, "must be >= 0 optimizer steps (0: the synchronous loop)")
    if isinstance(config.weight_sync_steps, bool) or not isinstance(config.weight_sync_steps, int):
        raise fail("weight_sync_steps", config.weight_sync_steps, "an integer >= 1 (optimizer steps between syncs)")
    if config.weight_sync_steps < 1:
        raise fail("weight_sync_steps", config.weight_sync_steps, "must be >= 1 optimizer steps between weight syncs")
    if config.weight_sync_steps > 1 and config.max_staleness < 1:
        raise fail(
            "weight_sync_steps",
            config.weight_sync_steps,
            "syncs an asynchronous pipeline's weights: set max_staleness >= 1 too (0 samples with the current ones)",
        )
    if isinstance(config.rollout_workers, bool) or not isinstance(config.rollout_workers, int):
        raise fail("rollout_workers", config.rollout_workers, "an integer: 0 (sample in the trainer's process) or more")
    if config.rollout_workers < 0:
        raise fail("rollout_workers", config.rollout_workers, ">= 0 (0: sample in the trainer's process)")
    if config.rollout_workers and config.max_staleness < 1:
        raise fail(
            "rollout_workers", config.rollout_workers, "workers sample ahead of the trainer: set max_staleness >= 1 too"
        )
    if config.rollout_workers and config.optimizer_steps_per_generation > 1:
        raise fail(
            "rollout_workers",
            config.rollout_workers,
            "with several optimizer steps per generation batch (num_iterations, steps_per_generation) is not built "
            "yet; use rollout_workers=0",
        )
    if config.max_staleness > 0 and config.use_vllm:
        raise fail(
            "max_staleness",
            config.max_staleness,
            "with use_vllm is not built yet (the engine would need the older weights); use rloo's sampler or 0",
        )
    threshold = config.off_policy_mask_threshold
    if threshold is not None and not threshold > 0:
        raise fail("off_policy_mask_threshold", threshold, "give the largest mean KL kept, > 0 (e.g. 0.5), or None")


def _check_tools(config: RLOOConfig) -> None:
    rounds = config.max_tool_calling_iterations
    if rounds is not None and rounds < 0:
        raise fail("max_tool_calling_iterations", rounds, "must be >= 0 rounds of tool calls, or None for no limit")
    if config.tool_timeout is not None and not config.tool_timeout > 0:
        raise fail("tool_timeout", config.tool_timeout, "must be > 0 seconds, or None for no limit")


def _check_rewards(config: RLOOConfig) -> None:
    if config.reward_timeout is not None and not config.reward_timeout > 0:
        raise fail("reward_timeout", config.reward_timeout, "must be > 0 seconds, or None for no limit")
    if config.reward_error_policy not in ("raise", "skip"):
        raise fail("reward_error_policy", config.reward_error_policy, "choose one of ['raise', 'skip']")


def _check_clip_range(config: RLOOConfig) -> None:
    spec = config.algorithm
    if not spec.epsilon > 0:
        raise fail("epsilon", spec.epsilon, "the clip range must be > 0 (0.2 is typical)")
    if not spec.epsilon_high > 0:
        raise fail("epsilon_high", spec.epsilon_high, "must be > 0 (DAPO uses 0.28), or unset to equal epsilon")
    if spec.epsilon >= 1:
        raise fail("epsilon", spec.epsilon, "must be < 1 so that 1 - epsilon stays positive")
    if spec.clip_ratio and spec.epsilon_high < spec.epsilon:
        raise fail(
            "epsilon_high",
            spec.epsilon_high,
            f"must be >= epsilon ({spec.epsilon}): clip-higher widens the upper side (DAPO: 0.28 with 0.2)",
        )


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


def _check_optimization(config: RLOOConfig) -> None:
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
    if config.fp16 and config.bf16:
        raise fail("fp16", config.fp16, "fp16 and bf16 are both True; choose one (bf16 where the GPU supports it)")
    if config.max_steps == 0 or config.max_steps < -1:
        raise fail("max_steps", config.max_steps, "must be >= 1, or -1 to train for num_train_epochs")
    if config.max_nonfinite_steps < 1:
        raise fail("max_nonfinite_steps", config.max_nonfinite_steps, "must be >= 1 (steps skipped in a row)")
    if config.max_steps == -1 and not config.num_train_epochs > 0:
        raise fail("num_train_epochs", config.num_train_epochs, "must be > 0 when max_steps is -1")


COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _check_compile(config: RLOOConfig) -> None:
    """The backend is checked against torch's list when the trainer compiles (torch is not imported here)."""
    if config.torch_compile_mode is not None and config.torch_compile_mode not in COMPILE_MODES:
        raise fail("torch_compile_mode", config.torch_compile_mode, f"choose one of {list(COMPILE_MODES)} or None")


# accelerate's data-loader settings, each with the value that describes what rloo does (it uses no
# accelerate data loader and accumulates gradients itself)
ACCELERATOR_CONFIG: dict[str, Any] = {
    "split_batches": False,
    "dispatch_batches": None,
    "even_batches": True,
    "use_seedable_sampler": True,
    "non_blocking": False,
    "gradient_accumulation_kwargs": None,
    "use_configured_state": False,
}


def _check_trl_inputs(config: RLOOConfig) -> None:
    """TRL fields accepted only where they describe what rloo does."""
    if config.dataloader_num_workers != 0:
        raise fail(
            "dataloader_num_workers",
            config.dataloader_num_workers,
            "only 0: rloo reads prompts by index in the training process, with no DataLoader to give workers",
        )
    if config.cache_implementation not in (None, "dynamic"):
        raise fail(
            "cache_implementation",
            config.cache_implementation,
            "only None or 'dynamic': rloo's sampler keeps its own preallocated KV cache",
        )
    if config.sampler_compaction is not None and not 0 < config.sampler_compaction <= 1:
        raise fail("sampler_compaction", config.sampler_compaction, "must be in (0, 1] (e.g. 0.25), or None for off")
    if config.sampler_cuda_graphs and config.use_vllm:
        raise fail(
            "sampler_cuda_graphs",
            config.sampler_cuda_graphs,
            "applies to rloo's own sampler, and with use_vllm=True vLLM samples (with graphs of its own); drop one",
        )
    if config.pad_to_multiple_of is not None and config.pad_to_multiple_of < 1:
        raise fail("pad_to_multiple_of", config.pad_to_multiple_of, "must be >= 1, or None for no extra padding")
    if config.per_device_eval_batch_size is not None and config.per_device_eval_batch_size < 1:
        raise fail("per_device_eval_batch_size", config.per_device_eval_batch_size, "must be >= 1, or None")
    for key, value in (config.accelerator_config or {}).items():
        if key not in ACCELERATOR_CONFIG:
            raise fail(
                "accelerator_config",
                dict(config.accelerator_config or {}),
                f"unknown key {key!r}{did_you_mean(key, list(ACCELERATOR_CONFIG))}",
            )
        if value != ACCELERATOR_CONFIG[key] and not (key == "dispatch_batches" and value is False):
            raise fail(
                "accelerator_config",
                dict(config.accelerator_config or {}),
                f"{key}={value!r} has nothing to act on: rloo uses no accelerate data loader (every process draws "
                f"the same prompt order and keeps its share) and accumulates gradients itself; drop {key}",
            )


def _check_reference_sync(config: RLOOConfig) -> None:
    if config.router_aux_loss_coef < 0:
        raise fail("router_aux_loss_coef", config.router_aux_loss_coef, "must be >= 0 (0 turns it off)")
    if not 0 <= config.ref_model_mixup_alpha <= 1:
        raise fail("ref_model_mixup_alpha", config.ref_model_mixup_alpha, "must be in [0, 1]")
    if config.ref_model_sync_steps < 1:
        raise fail("ref_model_sync_steps", config.ref_model_sync_steps, "must be >= 1")
    if config.sync_ref_model and config.algorithm.beta == 0:
        raise fail("sync_ref_model", True, "there is no reference model with beta=0; set beta > 0 or drop it")


def _check_batches(config: RLOOConfig) -> None:
    if config.per_device_train_batch_size < 1:
        raise fail("per_device_train_batch_size", config.per_device_train_batch_size, "must be >= 1")
    if config.gradient_accumulation_steps < 1:
        raise fail("gradient_accumulation_steps", config.gradient_accumulation_steps, "must be >= 1")
    if config.generation_batch_size is not None and config.steps_per_generation is not None:
        raise fail(
            "generation_batch_size",
            config.generation_batch_size,
            "set either generation_batch_size or steps_per_generation, not both",
        )
    if config.generation_batch_size is not None and config.generation_batch_size % config.per_device_train_batch_size:
        raise fail(
            "generation_batch_size",
            config.generation_batch_size,
            f"must be a multiple of per_device_train_batch_size ({config.per_device_train_batch_size})",
        )
    if config.steps_per_generation is not None and config.steps_per_generation < 1:
        raise fail("steps_per_generation", config.steps_per_generation, "must be >= 1")
    # name the field the user set: generation_batch_size, else steps_per_generation
    batch_field = "generation_batch_size" if config.generation_batch_size is not None else "steps_per_generation"
    micro_batches, accumulation = config.micro_batches_per_generation, config.gradient_accumulation_steps
    if micro_batches % accumulation:
        value = config.generation_batch_size or micro_batches
        raise fail(
            batch_field,
            value,
            f"micro-batches per generation ({micro_batches}) must be a multiple of gradient_accumulation_steps "
            f"({accumulation}) so no optimizer step straddles two generation batches (TRL allows it; rloo "
            "normalizes a step's loss over its rows, all in one generation batch, and checkpoints between "
            f"generation batches, where a resume is exact): make it {-(-micro_batches // accumulation) * accumulation} "
            f"micro-batches, or set gradient_accumulation_steps to a divisor of {micro_batches}",
        )
    if config.completions_per_generation % config.num_generations:
        raise fail("generation_batch_size", config.completions_per_generation, _divisibility_fix(config))


def _divisibility_fix(config: RLOOConfig) -> str:
    """Why the completions of a generation batch must split into groups, and a value that works."""
    n, k = config.completions_per_generation, config.num_generations
    why = f"must be divisible by num_generations ({k}) so every prompt's {k} completions are scored together; "
    if config.generation_batch_size is not None:
        step = math.lcm(config.per_device_train_batch_size, k) * config.gradient_accumulation_steps
        return f"the generation batch ({n} completions) {why}e.g. generation_batch_size={math.ceil(n / step) * step}"
    return (
        f"the completions per generation batch (per_device_train_batch_size x steps_per_generation = {n}) "
        f"{why}e.g. per_device_train_batch_size={k * max(1, config.per_device_train_batch_size // k)}"
    )


def _check_schedules(config: RLOOConfig) -> None:
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


def _check_logging(config: RLOOConfig) -> None:
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
    _check_schedules(config)
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
    if config.num_completions_to_print < 0:
        raise fail("num_completions_to_print", config.num_completions_to_print, "must be >= 0")
