"""The checks ``RLOOConfig`` runs once, when constructed: every field's type, finite numbers, each field
group's own checks (:data:`rloo.config.fields.GROUP_CHECKS`), and the rules that tie fields of several groups.

Every bad value raises ``ValueError("RLOOConfig.<field>=<value> is invalid: <fix>")`` (:func:`rloo.config.errors.fail`):
the field, the value, and what to set instead (``tests/config/test_rloo_config.py`` has a case per check).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rloo.algo.advantages import group_baseline
from rloo.config.errors import fail
from rloo.config.field_types import CONTAINER_KINDS, declared_annotation, shown_type
from rloo.config.fields import GROUP_CHECKS

if TYPE_CHECKING:
    from rloo.config.rloo_config import RLOOConfig


def validate(config: RLOOConfig) -> None:
    """Run every check; the first failure raises."""
    for check in (_check_types, _check_finite, *GROUP_CHECKS, check_combinations):
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


def check_combinations(config: RLOOConfig) -> None:
    """Rules that tie fields of several groups: what asynchronous sampling, vLLM and dynamic sampling cannot
    be combined with yet, and how a generation batch splits into micro-batches, optimizer steps and groups."""
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
    if config.sampler_cuda_graphs and config.use_vllm:
        raise fail(
            "sampler_cuda_graphs",
            config.sampler_cuda_graphs,
            "applies to rloo's own sampler, and with use_vllm=True vLLM samples (with graphs of its own); drop one",
        )
    _check_continuous_batching(config)
    _check_batches(config)
    estimator = config.algorithm.advantage_estimator
    if config.dynamic_sampling and not group_baseline(estimator):
        raise fail(
            "dynamic_sampling",
            True,
            f"advantage_estimator={estimator!r} gives a group whose rewards are all equal a non-zero advantage "
            "(it has no group baseline), so those groups teach and must not be dropped; use a group baseline "
            "(rloo, grpo, group_mean, reinforce_pp_baseline) or dynamic_sampling=False",
        )


def _check_continuous_batching(config: RLOOConfig) -> None:
    """What transformers' continuous batching (:mod:`rloo.generation.continuous_batching`) cannot be combined with."""
    if not config.use_transformers_continuous_batching:
        return
    field = "use_transformers_continuous_batching"
    if config.use_vllm:
        raise fail(field, True, "with use_vllm=True: both choose the sampling engine; keep one")
    if config.sampler_cuda_graphs:
        raise fail(
            field,
            True,
            "with sampler_cuda_graphs, a setting of rloo's own sampler; drop one",
        )
    if config.repetition_penalty != 1.0:
        raise fail(
            "repetition_penalty",
            config.repetition_penalty,
            "transformers' continuous batching does not apply it (its engine drops the processor): set 1.0, or "
            "use rloo's sampler (use_transformers_continuous_batching=False)",
        )
    if config.min_p:
        raise fail(
            "min_p",
            config.min_p,
            "transformers' continuous batching does not check it (its engine may drop the processor): set None, "
            "or use rloo's sampler (use_transformers_continuous_batching=False)",
        )


def _check_batches(config: RLOOConfig) -> None:
    """A generation batch is whole micro-batches, whole optimizer steps and whole groups of K."""
    if config.generation_batch_size is not None and config.generation_batch_size % config.per_device_train_batch_size:
        raise fail(
            "generation_batch_size",
            config.generation_batch_size,
            f"must be a multiple of per_device_train_batch_size ({config.per_device_train_batch_size})",
        )
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
