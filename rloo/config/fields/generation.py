"""Prompts and completions: K, the lengths, the sampling settings, tools, and how many completions a
generation batch holds. Rollouts themselves: :mod:`rloo.generation` and :mod:`rloo.pipeline`.

How a generation batch splits into micro-batches and optimizer steps ties these fields to the
optimization group's batch size: that check is :func:`rloo.config.validation.check_combinations`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rloo.config.errors import fail
from rloo.config.field_types import KeywordMapping
from rloo.config.fields.declare import option

if TYPE_CHECKING:
    from rloo.config.rloo_config import RLOOConfig


@dataclass
class GenerationFields:
    """Data and generation fields of ``RLOOConfig``, with their documentation."""

    num_generations: int = option(
        2, "Completions per prompt (K), >= 2: the leave-one-out baseline needs K - 1 others.", trl="num_generations"
    )
    max_prompt_length: int | None = option(
        512,
        "Prompt length limit in tokens, >= 1: longer prompts are truncated from the left (counted in "
        "prompts/truncated). None = no truncation. TRL 1.13 has no such field.",
        trl=None,
    )
    max_completion_length: int = option(
        512,  # TRL 1.16's RLOOConfig and GRPOConfig
        "Most tokens generated per completion, >= 1; a completion with no EOS by then is truncated.",
        trl="max_completion_length",
    )
    temperature: float = option(
        1.0,
        "Sampling temperature, > 0; as in TRL it also divides the logits when computing the log-probs for the loss.",
        trl="temperature",
    )
    top_p: float = option(
        1.0,
        "Nucleus sampling: keep the likeliest tokens within this probability mass, in (0, 1]; 1.0 = off.",
        trl="top_p",
    )
    top_k: int = option(0, "Sample among the k likeliest tokens only, >= 0; 0 disables it.", trl="top_k")
    min_p: float | None = option(
        None, "Drop tokens below min_p x the top token's probability, in [0, 1]; None disables it.", trl="min_p"
    )
    repetition_penalty: float = option(
        1.0,
        "Penalty on tokens already in the prompt or completion, > 0; > 1 discourages repeats, 1.0 disables it.",
        trl="repetition_penalty",
    )
    remove_unused_columns: bool = option(
        False,
        "True keeps only the prompt column (TRL's meaning): reward functions then get no other dataset column.",
        trl="remove_unused_columns",
    )
    pad_to_multiple_of: int | None = option(
        None,
        "Pad the prompt and completion token tensors to a multiple of this length, >= 1 (shapes tensor cores "
        "like); the padding is masked, so the math is unchanged. None = no extra padding.",
        trl="pad_to_multiple_of",
    )
    generation_kwargs: KeywordMapping | None = option(
        None,
        "Extra generation settings, as TRL's: stop_strings (or vLLM's stop): a completion ends once its text "
        "contains one, kept in it; eos_token_id: more ids that end a completion (the tokenizer's and the "
        "model's generation_config.eos_token_id always do). Keys with their own field are refused.",
        trl="generation_kwargs",
    )
    chat_template_kwargs: KeywordMapping | None = option(
        None,
        "Variables for the chat template of conversational prompts, e.g. {enable_thinking: false} (Qwen3).",
        trl="chat_template_kwargs",
    )
    max_tool_calling_iterations: int | None = option(
        None,
        "With tools: the most rounds of tool calls in an episode, >= 0; None = no limit but max_completion_length "
        "(the whole episode after the prompt).",
        trl="max_tool_calling_iterations",
    )
    tool_timeout: float | None = option(
        60.0,
        "With tools: seconds a tool call may run, > 0; a call past it is answered with an error message (and "
        "counted as failed). It bounds an environment's reset too (past it the run stops). None = no limit.",
        trl=None,
    )
    generation_batch_size: int | None = option(
        None,
        "Completions per generation batch on one process: a multiple of per_device_train_batch_size and of "
        "num_generations. None = per_device_train_batch_size x steps_per_generation; set one of the two, not both.",
        trl="generation_batch_size",
    )
    steps_per_generation: int | None = option(
        None,
        "Micro-batches (of per_device_train_batch_size completions) per generation batch, >= 1, a multiple of "
        "gradient_accumulation_steps. None = from generation_batch_size, else gradient_accumulation_steps.",
        trl="steps_per_generation",
    )
    shuffle_dataset: bool = option(
        True, "A new seeded random prompt order every epoch; False = dataset order.", trl="shuffle_dataset"
    )


def check_generation(config: RLOOConfig) -> None:
    """The sampling settings, tools, padding and the generation batch's own fields."""
    _check_sampling_settings(config)
    rounds = config.max_tool_calling_iterations
    if rounds is not None and rounds < 0:
        raise fail("max_tool_calling_iterations", rounds, "must be >= 0 rounds of tool calls, or None for no limit")
    if config.tool_timeout is not None and not config.tool_timeout > 0:
        raise fail("tool_timeout", config.tool_timeout, "must be > 0 seconds, or None for no limit")
    if config.pad_to_multiple_of is not None and config.pad_to_multiple_of < 1:
        raise fail("pad_to_multiple_of", config.pad_to_multiple_of, "must be >= 1, or None for no extra padding")
    if config.generation_batch_size is not None and config.steps_per_generation is not None:
        raise fail(
            "generation_batch_size",
            config.generation_batch_size,
            "set either generation_batch_size or steps_per_generation, not both",
        )
    if config.steps_per_generation is not None and config.steps_per_generation < 1:
        raise fail("steps_per_generation", config.steps_per_generation, "must be >= 1")


def _check_sampling_settings(config: RLOOConfig) -> None:
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
