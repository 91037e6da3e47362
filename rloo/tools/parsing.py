"""A model turn's tool calls, parsed from the tokens it sampled, and the tokens that answer them.

Parsing: a tokenizer with a ``response_template`` (transformers' response parsing, which TRL sets for the
chat templates it knows) is parsed by ``tokenizer.parse_response``; any other by rloo's parser of the format
its chat template renders calls in (:mod:`rloo.tools.formats`: Hermes, the Qwen3.5/Nemotron XML, GLM,
Llama 3 JSON, Gemma 4, GPT-OSS harmony), Hermes where the template shows none of them::

    <tool_call>
    {"name": "multiply", "arguments": {"a": 3, "b": 4}}
    </tool_call>

A turn is returned as TRL's assistant message, ``{"role": "assistant", "content": str, "tool_calls":
[{"type": "function", "function": {"name": str, "arguments": dict}}]}`` (no ``tool_calls`` key without
calls). A block that is not such a JSON object is not a call: it is counted (``malformed``) and the text
stays in the content (TRL parses it as plain text too).

Answers: the tool messages are rendered by the chat template and inserted as tokens after the model's turn
(its sampled tokens are never re-tokenized). Their tokens are what the template renders after the assistant
turn in ``[user, assistant with the calls, *tool messages]`` with a generation prompt: the tool messages and
the next assistant header, which the model must not be trained on. The assistant turn's end is found by
counting the run's stop tokens (the turn ends at the first after those of ``[user]``'s rendering), not by
comparing with a rendering without the tool messages (TRL's ``_get_tool_suffix_ids``): thinking models'
templates (Qwen3, Qwen3.5, Nemotron 3) render the last assistant turn differently once tool messages follow
it, so that comparison fails for them, and TRL swaps in a patched template instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rloo.tools.formats import HERMES, as_call, format_of


@dataclass
class ParsedTurn:
    """One model turn: its assistant message (TRL's shape) and the call blocks that did not parse."""

    message: dict[str, Any]
    malformed: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)


def parse_turn(tokenizer: Any, ids: list[int], prefix: list[int], tools: list[Any] | None = None) -> ParsedTurn:
    """The assistant message of the turn ``ids`` (the tokens sampled after ``prefix``, the episode so far), its
    calls read in the format of the tokenizer's chat template (:func:`rloo.tools.formats.format_of`)."""
    if getattr(tokenizer, "response_template", None) is not None:
        return _parse_with_template(tokenizer, ids, prefix, tools)
    call_format = format_of(getattr(tokenizer, "chat_template", None))
    text = tokenizer.decode(ids, skip_special_tokens=not call_format.special_tokens)
    if call_format.special_tokens and tokenizer.eos_token:
        text = text.removesuffix(tokenizer.eos_token)
    return _turn(*call_format.parse(text))


def parse_hermes(text: str) -> ParsedTurn:
    """The Hermes-format tool calls of ``text`` (see the module docstring); the content is the text before
    the first call block (the whole text when no block parses)."""
    return _turn(*HERMES.parse(text))


def _turn(calls: list[dict[str, Any]], malformed: int, content: str) -> ParsedTurn:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return ParsedTurn(message, malformed, calls)


def _parse_with_template(tokenizer: Any, ids: list[int], prefix: list[int], tools: list[Any] | None) -> ParsedTurn:
    """transformers' ``parse_response``; a turn it cannot parse is plain text (as TRL falls back)."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    try:
        parsed = tokenizer.parse_response(ids, prefix=prefix, tools=tools)
    except Exception:  # a malformed call: the template's parser raises its own errors
        return ParsedTurn({"role": "assistant", "content": text}, malformed=1)
    if not isinstance(parsed, dict):
        return ParsedTurn({"role": "assistant", "content": text}, malformed=1)
    calls, malformed = [], 0
    for raw in parsed.get("tool_calls") or []:
        function = raw.get("function", raw) if isinstance(raw, dict) else None
        call = as_call(function.get("name"), function.get("arguments", {})) if isinstance(function, dict) else None
        if call is None:
            malformed += 1
        else:
            calls.append(call)
    content = parsed.get("content")
    content = content.removesuffix(tokenizer.eos_token or "") if isinstance(content, str) else ""
    if not calls and malformed:  # as parse_hermes: a turn whose calls all failed is its text
        content = text
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return ParsedTurn(message, malformed, calls)


def tool_suffix_ids(
    tokenizer: Any,
    tool_messages: list[dict[str, Any]],
    chat_template_kwargs: dict[str, Any] | None = None,
    turn_ends: Iterable[int] | None = None,
) -> list[int]:
    """The tokens that follow a model turn ending in one of ``turn_ends`` (the run's stop token ids; None:
    the tokenizer's EOS): ``tool_messages`` and the next assistant header, as the chat template renders them
    after a minimal conversation (see the module docstring). Raises ``ValueError`` when the rendering holds no
    turn end after the assistant's header (the stop tokens are not the ones the template closes a turn with)."""
    kwargs = dict(chat_template_kwargs or {})
    ends = set(turn_ends) if turn_ends is not None else {tokenizer.eos_token_id}
    calls = [{"type": "function", "function": {"name": m.get("name", "tool"), "arguments": {}}} for m in tool_messages]
    user = [{"role": "user", "content": "x"}]
    head = [*user, {"role": "assistant", "content": "", "tool_calls": calls}]
    prompt = _ids(tokenizer.apply_chat_template(user, tokenize=True, add_generation_prompt=True, **kwargs))
    after = _ids(
        tokenizer.apply_chat_template(head + tool_messages, tokenize=True, add_generation_prompt=True, **kwargs)
    )
    # the assistant's turn ends at the first turn end after those of the prompt: count, do not compare, so a
    # template that renders the last assistant turn differently once tool messages follow it (Qwen3 and other
    # thinking models drop or add a reasoning block) still gives the tool turn's own tokens
    before_turn = sum(token in ends for token in prompt)
    found = [i for i, token in enumerate(after) if token in ends]
    if len(found) <= before_turn:
        names = sorted(tokenizer.convert_ids_to_tokens(sorted(ends)))
        raise ValueError(
            f"the chat template closes no assistant turn with the run's stop tokens {names} before the tool "
            "messages, so tool results cannot be appended as tokens; stop generation at the token the template "
            "ends a turn with (generation_config.eos_token_id), or use a rollout_func"
        )
    return after[found[before_turn] + 1 :]


def _ids(rendered: Any) -> list[int]:
    """``apply_chat_template(..., tokenize=True)``'s ids, whichever form this transformers returns."""
    if isinstance(rendered, dict) or hasattr(rendered, "keys"):
        rendered = rendered["input_ids"]
    ids = list(rendered)
    return list(ids[0]) if ids and isinstance(ids[0], list) else ids
