"""A model turn's tool calls, parsed from the tokens it sampled, and the tokens that answer them.

Parsing: a tokenizer with a ``response_template`` (transformers' response parsing, which TRL sets for the
chat templates it knows) is parsed by ``tokenizer.parse_response``; any other by rloo's parser of the
Hermes format the Qwen2.5/Qwen3 templates (and many others) use::

    <tool_call>
    {"name": "multiply", "arguments": {"a": 3, "b": 4}}
    </tool_call>

A turn is returned as TRL's assistant message, ``{"role": "assistant", "content": str, "tool_calls":
[{"type": "function", "function": {"name": str, "arguments": dict}}]}`` (no ``tool_calls`` key without
calls). A block that is not such a JSON object is not a call: it is counted (``malformed``) and the text
stays in the content (TRL parses it as plain text too).

Answers: the tool messages are rendered by the chat template and inserted as tokens after the model's turn
(its sampled tokens are never re-tokenized). Their tokens are the template's rendering of
``[user, assistant with the calls, *tool messages]`` with a generation prompt, after its rendering of
``[user, assistant with the calls]`` cut after the last EOS (TRL's ``_get_tool_suffix_ids``): the tool
messages and the next assistant header, which the model must not be trained on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass
class ParsedTurn:
    """One model turn: its assistant message (TRL's shape) and the ``<tool_call>`` blocks that did not parse."""

    message: dict[str, Any]
    malformed: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)


def parse_turn(tokenizer: Any, ids: list[int], prefix: list[int], tools: list[Any] | None = None) -> ParsedTurn:
    """The assistant message of the turn ``ids`` (the tokens sampled after ``prefix``, the episode so far)."""
    if getattr(tokenizer, "response_template", None) is not None:
        return _parse_with_template(tokenizer, ids, prefix, tools)
    return parse_hermes(tokenizer.decode(ids, skip_special_tokens=True))


def parse_hermes(text: str) -> ParsedTurn:
    """The Hermes-format tool calls of ``text`` (see the module docstring); the content is the text before
    the first call block (the whole text when no block parses)."""
    calls, malformed = [], 0
    for block in _HERMES_CALL.findall(text):
        call = _as_call(block)
        if call is None:
            malformed += 1
        else:
            calls.append(call)
    content = text[: text.index("<tool_call>")].strip() if calls else text
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return ParsedTurn(message, malformed, calls)


def _as_call(block: str) -> dict[str, Any] | None:
    """``{"type": "function", "function": {"name", "arguments"}}`` from one block's JSON, or None."""
    try:
        value = json.loads(block)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    return {"type": "function", "function": {"name": value["name"], "arguments": arguments}}


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
        call = _as_call(json.dumps(function)) if isinstance(function, dict) else None
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
    tokenizer: Any, tool_messages: list[dict[str, Any]], chat_template_kwargs: dict[str, Any] | None = None
) -> list[int]:
    """The tokens that follow a model turn ending in EOS: ``tool_messages`` and the next assistant header,
    as the chat template renders them (see the module docstring). Raises ``ValueError`` naming the template
    when its rendering of the shorter conversation is not a prefix of the longer one."""
    kwargs = dict(chat_template_kwargs or {})
    calls = [{"type": "function", "function": {"name": m.get("name", "tool"), "arguments": {}}} for m in tool_messages]
    head = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    before = _ids(tokenizer.apply_chat_template(head, tokenize=True, add_generation_prompt=False, **kwargs))
    after = _ids(
        tokenizer.apply_chat_template(head + tool_messages, tokenize=True, add_generation_prompt=True, **kwargs)
    )
    eos = tokenizer.eos_token_id
    ends = [i for i, token in enumerate(before) if token == eos]
    if ends:
        before = before[: ends[-1] + 1]
    if after[: len(before)] != before:
        raise ValueError(
            "the chat template renders a conversation with tool messages differently from the same conversation "
            "without them, up to the assistant's EOS, so tool results cannot be appended as tokens; use a chat "
            "template that appends each message (Qwen2.5/Qwen3-style), or a rollout_func"
        )
    return after[len(before) :]


def _ids(rendered: Any) -> list[int]:
    """``apply_chat_template(..., tokenize=True)``'s ids, whichever form this transformers returns."""
    if isinstance(rendered, dict) or hasattr(rendered, "keys"):
        rendered = rendered["input_ids"]
    ids = list(rendered)
    return list(ids[0]) if ids and isinstance(ids[0], list) else ids
