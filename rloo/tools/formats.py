"""Tool calls in each model family's own format, recognised from the chat template that renders them.

A model writes its calls the way its chat template renders an assistant turn's ``tool_calls``, and that
differs by family (each example calls ``multiply(a=3, b="x y")``):

- ``hermes`` (Qwen2.5, Qwen3, Qwen3-2507, many fine-tunes): ``<tool_call>{"name": "multiply", "arguments":
  {"a": 3, "b": "x y"}}</tool_call>``;
- ``xml`` (Qwen3.5, Qwen3-Coder, Nemotron 3): ``<tool_call><function=multiply><parameter=a>3</parameter>
  <parameter=b>x y</parameter></function></tool_call>``;
- ``glm`` (GLM-4.5/4.6): ``<tool_call>multiply<arg_key>a</arg_key><arg_value>3</arg_value>...</tool_call>``;
- ``llama3`` (Llama 3.1/3.2 JSON tool calling): the turn is ``{"name": "multiply", "parameters": {...}}``;
- ``gemma4``: ``<|tool_call>call:multiply{a:3,b:<|"|>x y<|"|>}<tool_call|>`` (keys bare, strings between
  ``<|"|>``);
- ``harmony`` (GPT-OSS): ``<|start|>assistant to=functions.multiply<|channel|>commentary json<|message|>{"a": 3,
  "b": "x y"}<|call|>``.

The format is read off the template's text by the markers it renders (:func:`format_of`); Hermes where none
matches. Gemma 4 and GPT-OSS write their calls with special tokens, so their turns are decoded with them
(:attr:`CallFormat.special_tokens`). A parameter value of the ``xml`` and ``glm`` formats is JSON where it
parses as JSON (``3`` is the number 3) and the text otherwise, as those models' own parsers read an untyped
value. A call block that does not parse is counted as malformed, as :func:`rloo.tools.parsing.parse_hermes`
does; a turn's content is its text before its first call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Call = dict[str, Any]
Parsed = tuple[list[Call], int, str]  # (calls, malformed blocks, content)


def as_call(name: Any, arguments: Any) -> Call | None:
    """TRL's ``{"type": "function", "function": {"name", "arguments"}}``, or None: a name that is not a string,
    arguments that are not an object (a JSON string of one is read)."""
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    if arguments is None:
        arguments = {}
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _json_or_text(value: str) -> Any:
    value = value.strip("\n")
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return value


def _blocks(text: str, pattern: re.Pattern[str], parse: Callable[[re.Match[str]], Call | None]) -> Parsed:
    calls, malformed = [], 0
    matches = list(pattern.finditer(text))
    for match in matches:
        call = parse(match)
        if call is None:
            malformed += 1
        else:
            calls.append(call)
    content = text[: matches[0].start()].strip() if calls else text
    return calls, malformed, content


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _hermes(match: re.Match[str]) -> Call | None:
    try:
        value = json.loads(match.group(1))
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return None
    if not isinstance(value, dict):
        return None
    return as_call(value.get("name"), value.get("arguments", value.get("parameters", {})))


_XML = re.compile(r"<tool_call>\s*<function=([^>\s]+)>(.*?)</function>\s*</tool_call>", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)


def _xml(match: re.Match[str]) -> Call | None:
    arguments = {key: _json_or_text(value) for key, value in _XML_PARAMETER.findall(match.group(2))}
    return as_call(match.group(1), arguments)


_GLM = re.compile(r"<tool_call>\s*([^<\n]+?)\s*((?:<arg_key>.*?)?)</tool_call>", re.DOTALL)
_GLM_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _glm(match: re.Match[str]) -> Call | None:
    arguments = {key.strip(): _json_or_text(value) for key, value in _GLM_ARGUMENT.findall(match.group(2))}
    return as_call(match.group(1), arguments)


_GEMMA4 = re.compile(r"<\|tool_call>call:([\w.\-]+)(\{.*?\})<tool_call\|>", re.DOTALL)
_GEMMA4_STRING = re.compile(r'<\|"\|>(.*?)<\|"\|>', re.DOTALL)
_BARE_KEY = re.compile(r"([{,]\s*)([A-Za-z_][\w\-]*)\s*:")


def _gemma4(match: re.Match[str]) -> Call | None:
    strings: list[str] = []

    def hold(string: re.Match[str]) -> str:  # strings out of the way while the bare keys are quoted
        strings.append(string.group(1))
        return f"\x00{len(strings) - 1}\x00"

    held = _BARE_KEY.sub(r'\1"\2":', _GEMMA4_STRING.sub(hold, match.group(2)))
    source = re.sub("\x00(\\d+)\x00", lambda m: json.dumps(strings[int(m.group(1))]), held)
    try:
        arguments = json.loads(source)
    except (ValueError, RecursionError):
        return None
    return as_call(match.group(1), arguments)


_HARMONY = re.compile(
    r"to=functions\.([\w.\-]+)[^<]*(?:<\|channel\|>[^<]*?)?(?:<\|constrain\|>[^<]*)?<\|message\|>(.*?)(?:<\|call\|>|$)",
    re.DOTALL,
)
_HARMONY_FINAL = re.compile(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|end\|>|<\|return\|>|$)", re.DOTALL)


def _harmony(match: re.Match[str]) -> Call | None:
    return as_call(match.group(1), match.group(2).strip())


def _llama3(text: str) -> Parsed:
    body = text.replace("<|python_tag|>", "").strip()
    for end in ("<|eot_id|>", "<|eom_id|>"):
        body = body.removesuffix(end).strip()
    if not body.startswith("{"):
        return [], 0, text
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return [], 1, text
    if not isinstance(value, dict):
        return [], 1, text
    call = as_call(value.get("name"), value.get("parameters", value.get("arguments")))
    return ([call], 0, "") if call is not None else ([], 1, text)


def _harmony_turn(text: str) -> Parsed:
    calls, malformed, _ = _blocks(text, _HARMONY, _harmony)
    final = _HARMONY_FINAL.search(text)
    return calls, malformed, final.group(1).strip() if final else ("" if calls else text)


@dataclass(frozen=True)
class CallFormat:
    """A family's call format: its ``name``, the markers its template renders (all must appear), the parser of
    a turn's text, and whether that text keeps the tokenizer's special tokens."""

    name: str
    markers: tuple[str, ...]
    parse: Callable[[str], Parsed]
    special_tokens: bool = False


def _block_format(pattern: re.Pattern[str], parse: Callable[[re.Match[str]], Call | None]) -> Callable[[str], Parsed]:
    return lambda text: _blocks(text, pattern, parse)


# most specific first: the first whose markers all appear in the template is its format
FORMATS = (
    CallFormat("xml", ("<function=", "<parameter="), _block_format(_XML, _xml)),
    CallFormat("glm", ("<arg_key>", "<arg_value>"), _block_format(_GLM, _glm)),
    CallFormat("gemma4", ("<|tool_call>", "call:"), _block_format(_GEMMA4, _gemma4), special_tokens=True),
    CallFormat("harmony", ("<|call|>", "<|channel|>"), _harmony_turn, special_tokens=True),
    CallFormat("llama3", ('"parameters"', "ipython"), _llama3),
)
HERMES = CallFormat("hermes", ("<tool_call>",), _block_format(_HERMES, _hermes))


def format_of(chat_template: Any) -> CallFormat:
    """The call format a chat template renders (a dict of named templates: its ``default`` or ``tool_use``
    one); Hermes where no other family's markers all appear."""
    if isinstance(chat_template, dict):
        chat_template = chat_template.get("tool_use") or chat_template.get("default") or ""
    text = chat_template if isinstance(chat_template, str) else ""
    return next((f for f in FORMATS if all(marker in text for marker in f.markers)), HERMES)
