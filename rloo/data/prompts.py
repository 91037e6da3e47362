"""Prompts to token ids: conversation detection, chat-template rendering, tokenization with
left truncation, and the extra columns that reach reward functions.

Where we depart from TRL: ``max_prompt_length`` exists (TRL has none): long prompts are
truncated from the left, keeping their end (the question and the generation prompt), and
the count is reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rloo.data.prompt_checks import PROMPT_COLUMN, prompt_problem

if TYPE_CHECKING:
    import datasets
    from transformers import PreTrainedTokenizerBase


def is_conversational(prompt: Any) -> bool:
    """True for a non-empty list of messages that each have a ``role`` and a ``content``."""
    return (
        isinstance(prompt, list)
        and len(prompt) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
    )


def render_prompt(
    prompt: str | list[dict[str, Any]],
    tokenizer: PreTrainedTokenizerBase,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Plain text as is; a conversation through the chat template, ending in the generation prompt.

    ``template_kwargs`` reach the template as variables (``chat_template_kwargs``, e.g.
    ``enable_thinking=False`` for Qwen3-style templates)."""
    if isinstance(prompt, str):
        return prompt
    if not is_conversational(prompt):
        raise ValueError(f"cannot render prompt {preview(prompt)}: {prompt_problem(prompt)}")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "conversational prompts need a chat template, but the tokenizer has none; "
            "set `tokenizer.chat_template` or use plain-text prompts"
        )
    rendered = tokenizer.apply_chat_template(
        prompt, tokenize=False, add_generation_prompt=True, **dict(template_kwargs or {})
    )
    if not isinstance(rendered, str):
        raise ValueError(f"the chat template returned {type(rendered).__name__}, expected str")
    return rendered


@dataclass(frozen=True)
class TokenizedPrompts:
    """Prompt token ids, one list per prompt, after left truncation.

    ``num_truncated`` counts the prompts (not tokens) that were cut to ``max_prompt_length``.
    """

    ids: list[list[int]]
    num_truncated: int


def encode_prompts(
    prompts: list[Any],
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int | None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> TokenizedPrompts:
    """Render (chat template for conversations) and tokenize a batch of raw dataset prompts.

    Plain text gets the tokenizer's special tokens, as in TRL; a rendered chat template
    already carries its own, so none are added.
    """
    conversational = is_conversational(prompts[0])
    texts = [render_prompt(p, tokenizer, template_kwargs) for p in prompts]
    return tokenize_prompts(texts, tokenizer, max_prompt_length, add_special_tokens=not conversational)


def tokenize_prompts(
    texts: list[str],
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int | None,
    add_special_tokens: bool = True,
) -> TokenizedPrompts:
    """Tokenize rendered prompts and keep the last ``max_prompt_length`` tokens of each.

    Use ``add_special_tokens=True`` for plain-text prompts (as TRL does) and ``False`` for
    prompts rendered by a chat template, which already carries its special tokens.
    Truncation is from the left, so a truncated prompt loses its start (and its BOS).

    Raises:
        ValueError: a prompt tokenizes to no tokens, or ``max_prompt_length < 1``.
    """
    if max_prompt_length is not None and max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1 or None, got {max_prompt_length}")
    encoded = tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
    ids: list[list[int]] = []
    num_truncated = 0
    for index, (text, prompt_ids) in enumerate(zip(texts, encoded, strict=True)):
        if len(prompt_ids) == 0:
            raise ValueError(f"prompt {index} ({preview(text)}) tokenized to no tokens")
        if max_prompt_length is not None and len(prompt_ids) > max_prompt_length:
            prompt_ids = prompt_ids[-max_prompt_length:]
            num_truncated += 1
        ids.append(list(prompt_ids))
    return TokenizedPrompts(ids=ids, num_truncated=num_truncated)


def preview(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (a row or prompt named in a message)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def gather_columns(dataset: datasets.Dataset, indices: Sequence[int]) -> dict[str, list[Any]]:
    """Every column but ``prompt`` for rows ``indices``: ``{name: [value per prompt]}``.

    These are passed to reward functions by name, repeated for each completion by
    :func:`repeat_per_completion`.
    """
    names = [name for name in dataset.column_names if name != PROMPT_COLUMN]
    if not names:
        return {}
    rows = dataset.select_columns(names)[list(indices)]
    return {name: list(rows[name]) for name in names}


def columns_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """:func:`gather_columns` for rows already read: ``{name: [value per row]}``, ``prompt`` left out."""
    names = [name for name in rows[0] if name != PROMPT_COLUMN] if rows else []
    return {name: [row[name] for row in rows] for name in names}


def repeat_per_completion(values: Sequence[Any], num_generations: int) -> list[Any]:
    """Each of P values repeated ``num_generations`` (K) times: the K completions of a prompt
    are consecutive, so prompt i's value is at positions ``i*K .. i*K + K - 1``."""
    if num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {num_generations}")
    return [value for value in values for _ in range(num_generations)]
