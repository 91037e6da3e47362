"""Parsing a model turn's tool calls (Hermes text, token ids, a tokenizer's response parser) and the tokens
that answer them (:mod:`rloo.tools.parsing`), on the tiny character tokenizer and hand-written turns."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from rloo.tiny import TOOL_CHARS, TOOL_CHAT_TEMPLATE, build_char_tokenizer
from rloo.tools.parsing import ParsedTurn, parse_hermes, parse_turn, tool_suffix_ids


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: The text.
    """
    return text.upper()


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """A call in TRL's shape."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


MULTIPLY_BLOCK = '<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>'
MULTIPLY_CALL = call("multiply", a=3, b=4)


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    tokenizer = build_char_tokenizer(TOOL_CHARS)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


def encode(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


# ---------------------------------------------------------------------------- parse_hermes


def test_one_call_is_parsed_into_trl_s_assistant_message() -> None:
    parsed = parse_hermes(MULTIPLY_BLOCK)
    assert parsed == ParsedTurn(
        {"role": "assistant", "content": "", "tool_calls": [MULTIPLY_CALL]}, malformed=0, calls=[MULTIPLY_CALL]
    )


def test_a_block_with_newlines_around_the_json_is_parsed() -> None:
    parsed = parse_hermes('<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>')
    assert parsed.calls == [MULTIPLY_CALL]
    assert parsed.malformed == 0


def test_two_calls_in_one_turn_are_both_returned_in_order() -> None:
    text = MULTIPLY_BLOCK + '\n<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>'
    parsed = parse_hermes(text)
    expected = [MULTIPLY_CALL, call("shout", text="hi")]
    assert parsed.calls == expected
    assert parsed.message == {"role": "assistant", "content": "", "tool_calls": expected}
    assert parsed.malformed == 0


def test_the_text_before_the_first_call_is_the_message_content_stripped() -> None:
    parsed = parse_hermes("  Let me compute 3*4.\n" + MULTIPLY_BLOCK)
    assert parsed.message == {"role": "assistant", "content": "Let me compute 3*4.", "tool_calls": [MULTIPLY_CALL]}


def test_arguments_given_as_a_json_string_are_decoded() -> None:
    block = json.dumps({"name": "multiply", "arguments": json.dumps({"a": 3, "b": 4})})
    parsed = parse_hermes(f"<tool_call>{block}</tool_call>")
    assert parsed.calls == [MULTIPLY_CALL]
    assert parsed.malformed == 0


def test_parameters_are_read_when_there_are_no_arguments() -> None:
    parsed = parse_hermes('<tool_call>{"name": "multiply", "parameters": {"a": 3, "b": 4}}</tool_call>')
    assert parsed.calls == [MULTIPLY_CALL]


def test_a_call_without_arguments_or_with_null_arguments_has_empty_arguments() -> None:
    parsed = parse_hermes(
        '<tool_call>{"name": "now"}</tool_call><tool_call>{"name": "now", "arguments": null}</tool_call>'
    )
    assert parsed.calls == [call("now"), call("now")]
    assert parsed.malformed == 0


@pytest.mark.parametrize(
    "block",
    [
        "not json at all",
        '{"name": "multiply", "arguments": {"a": 3}',  # cut short
        '["multiply", {"a": 3, "b": 4}]',  # JSON, not an object
        '{"arguments": {"a": 3, "b": 4}}',  # no name
        '{"name": 7, "arguments": {"a": 3, "b": 4}}',  # a name that is not a string
        '{"name": "multiply", "arguments": [3, 4]}',  # arguments not a dict
        '{"name": "multiply", "arguments": "a=3, b=4"}',  # a string that is not JSON
        '{"name": "multiply", "arguments": "[3, 4]"}',  # a JSON string that is not an object
    ],
)
def test_a_malformed_block_is_counted_and_kept_as_text(block: str) -> None:
    text = f"Sure. <tool_call>{block}</tool_call>"
    parsed = parse_hermes(text)
    assert parsed == ParsedTurn({"role": "assistant", "content": text}, malformed=1, calls=[])


def test_a_malformed_block_beside_a_good_one_is_counted_and_only_the_good_one_is_a_call() -> None:
    text = "Two: " + MULTIPLY_BLOCK + "<tool_call>{oops}</tool_call>"
    parsed = parse_hermes(text)
    assert parsed == ParsedTurn(
        {"role": "assistant", "content": "Two:", "tool_calls": [MULTIPLY_CALL]}, malformed=1, calls=[MULTIPLY_CALL]
    )


def test_a_turn_without_calls_has_no_tool_calls_key_and_keeps_its_text_unstripped() -> None:
    parsed = parse_hermes(" The answer is 12.\n")
    assert parsed == ParsedTurn({"role": "assistant", "content": " The answer is 12.\n"}, malformed=0, calls=[])
    assert "tool_calls" not in parsed.message


def test_an_unclosed_call_block_is_plain_text_and_not_counted() -> None:
    text = '<tool_call>{"name": "multiply", "arguments": {"a": 3'
    assert parse_hermes(text) == ParsedTurn({"role": "assistant", "content": text}, malformed=0, calls=[])


def test_a_deeply_nested_block_is_counted_as_malformed_instead_of_raising() -> None:
    text = "<tool_call>" + "[" * 5000 + "</tool_call>"
    assert parse_hermes(text) == ParsedTurn({"role": "assistant", "content": text}, malformed=1, calls=[])


NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True)
INT_ARGUMENTS = st.dictionaries(NAMES, st.integers(), max_size=6)


@given(name=NAMES, arguments=INT_ARGUMENTS)
def test_any_dict_of_int_arguments_round_trips_through_a_hermes_block(name: str, arguments: dict[str, int]) -> None:
    block = json.dumps({"name": name, "arguments": arguments})
    parsed = parse_hermes(f"<tool_call>\n{block}\n</tool_call>")
    assert parsed.calls == [{"type": "function", "function": {"name": name, "arguments": arguments}}]
    assert parsed.message["tool_calls"] == parsed.calls
    assert parsed.malformed == 0


@given(prefix=st.text(max_size=40).filter(lambda s: "<tool_call>" not in s), arguments=INT_ARGUMENTS)
def test_any_text_before_a_call_is_the_stripped_content(prefix: str, arguments: dict[str, int]) -> None:
    text = prefix + "<tool_call>" + json.dumps({"name": "f", "arguments": arguments}) + "</tool_call>"
    assert parse_hermes(text).message["content"] == prefix.strip()


@given(text=st.text(max_size=80).filter(lambda s: "<tool_call>" not in s))
def test_any_text_without_a_call_block_is_the_whole_content(text: str) -> None:
    assert parse_hermes(text) == ParsedTurn({"role": "assistant", "content": text}, malformed=0, calls=[])


# ---------------------------------------------------------------------------- parse_turn


def test_parse_turn_on_token_ids_with_eos_equals_parse_hermes_of_the_decoded_text(
    tok: PreTrainedTokenizerFast,
) -> None:
    text = "I will multiply." + MULTIPLY_BLOCK
    ids = [*encode(tok, text), tok.eos_token_id]
    prefix = encode(tok, "<user>3*4?\n<assistant>")
    parsed = parse_turn(tok, ids, prefix, [multiply])
    assert parsed == parse_hermes(text)
    assert parsed.message == {"role": "assistant", "content": "I will multiply.", "tool_calls": [MULTIPLY_CALL]}


def test_parse_turn_of_a_plain_answer_drops_the_eos(tok: PreTrainedTokenizerFast) -> None:
    ids = [*encode(tok, "12"), tok.eos_token_id]
    assert parse_turn(tok, ids, []) == ParsedTurn({"role": "assistant", "content": "12"}, malformed=0, calls=[])


class FakeParsingTokenizer:
    """A tokenizer with a response parser: ids are character codes; ``parse_response`` answers ``reply``
    (or raises it when it is an exception) and records how it was called."""

    response_template: ClassVar[dict[str, Any]] = {"fields": {}}  # any value but None selects the parser
    eos_token = "</s>"

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.seen: list[tuple[list[int], Any, Any]] = []

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)

    def parse_response(self, ids: list[int], prefix: Any = None, tools: Any = None) -> Any:
        self.seen.append((list(ids), prefix, tools))
        if isinstance(self.reply, BaseException):
            raise self.reply
        return self.reply


def codes(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_parse_turn_uses_the_tokenizer_s_response_parser_with_the_prefix_and_tools() -> None:
    tokenizer = FakeParsingTokenizer({"role": "assistant", "content": "Sure.", "tool_calls": [MULTIPLY_CALL]})
    ids, prefix = codes("whatever the model said"), codes("<assistant>")
    parsed = parse_turn(tokenizer, ids, prefix, [multiply])
    assert parsed == ParsedTurn(
        {"role": "assistant", "content": "Sure.", "tool_calls": [MULTIPLY_CALL]}, malformed=0, calls=[MULTIPLY_CALL]
    )
    assert tokenizer.seen == [(ids, prefix, [multiply])]


def test_a_parser_s_flat_call_and_string_arguments_are_normalised() -> None:
    reply = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"name": "multiply", "arguments": {"a": 3, "b": 4}},
            {"type": "function", "function": {"name": "shout", "arguments": '{"text": "hi"}'}},
        ],
    }
    parsed = parse_turn(FakeParsingTokenizer(reply), codes("x"), [])
    assert parsed.calls == [MULTIPLY_CALL, call("shout", text="hi")]
    assert parsed.malformed == 0


def test_a_parser_s_turn_without_calls_or_content_has_empty_content_and_no_tool_calls_key() -> None:
    parsed = parse_turn(FakeParsingTokenizer({"role": "assistant", "content": None}), codes("x"), [])
    assert parsed == ParsedTurn({"role": "assistant", "content": ""}, malformed=0, calls=[])


def test_a_parser_s_bad_call_beside_a_good_one_is_counted() -> None:
    reply = {"content": "Two.", "tool_calls": [MULTIPLY_CALL, {"type": "function", "function": {"arguments": {}}}, 7]}
    parsed = parse_turn(FakeParsingTokenizer(reply), codes("x"), [])
    assert parsed == ParsedTurn(
        {"role": "assistant", "content": "Two.", "tool_calls": [MULTIPLY_CALL]}, malformed=2, calls=[MULTIPLY_CALL]
    )


@pytest.mark.parametrize("reply", [ValueError("json parser could not parse region"), KeyError("x"), None, ["a"]])
def test_a_parser_that_raises_or_returns_no_dict_gives_the_plain_text_and_one_malformed(reply: Any) -> None:
    text = '<tool_call>{"name": "multiply"</tool_call>'
    parsed = parse_turn(FakeParsingTokenizer(reply), codes(text), [])
    assert parsed == ParsedTurn({"role": "assistant", "content": text}, malformed=1, calls=[])


def test_a_parser_s_turn_whose_only_call_is_malformed_keeps_the_text_as_content() -> None:
    text = '<tool_call>{"name": "multiply", "arguments": "x"}</tool_call>'
    reply = {
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": "x"}}],
    }
    parsed = parse_turn(FakeParsingTokenizer(reply), codes(text), [])
    assert parsed == ParsedTurn({"role": "assistant", "content": text}, malformed=1, calls=[])


def test_a_parser_s_content_ending_in_the_eos_token_loses_it_as_in_trl() -> None:
    parsed = parse_turn(FakeParsingTokenizer({"role": "assistant", "content": "hello</s>"}), codes("hello"), [])
    assert parsed.message == {"role": "assistant", "content": "hello"}


# A response template (transformers' parser) for the tiny template: Qwen3's, with "<assistant>" and EOS "</s>".
TINY_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<assistant>",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"</s>\s*", "content": "text"},
    },
}


def test_transformers_response_parser_on_the_tiny_tokenizer_gives_the_same_turn_as_hermes() -> None:
    tokenizer = build_char_tokenizer(TOOL_CHARS)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = TINY_RESPONSE_TEMPLATE
    text = "I will." + MULTIPLY_BLOCK
    ids = [*encode(tokenizer, text), tokenizer.eos_token_id]
    parsed = parse_turn(tokenizer, ids, encode(tokenizer, "<user>3*4?\n<assistant>"), [multiply])
    assert parsed == ParsedTurn(
        {"role": "assistant", "content": "I will.", "tool_calls": [MULTIPLY_CALL]}, malformed=0, calls=[MULTIPLY_CALL]
    )
    assert parsed == parse_hermes(text)


# ---------------------------------------------------------------------------- tool_suffix_ids


def tool_message(name: str, content: str) -> dict[str, str]:
    return {"role": "tool", "name": name, "content": content}


def test_the_suffix_of_one_tool_message_is_the_message_and_the_next_assistant_header(
    tok: PreTrainedTokenizerFast,
) -> None:
    suffix = tool_suffix_ids(tok, [tool_message("multiply", "12")], {"tools": [multiply]})
    assert tok.decode(suffix) == "\n<tool>12\n<assistant>"
    assert suffix == encode(tok, "\n<tool>12\n<assistant>")


def test_the_suffix_of_two_tool_messages_has_both_in_order(tok: PreTrainedTokenizerFast) -> None:
    messages = [tool_message("multiply", "12"), tool_message("shout", "x")]
    suffix = tool_suffix_ids(tok, messages, {"tools": [multiply, shout]})
    assert tok.decode(suffix) == "\n<tool>12\n<tool>x\n<assistant>"


def test_the_suffix_does_not_depend_on_the_tools_in_the_template_keywords(tok: PreTrainedTokenizerFast) -> None:
    messages = [tool_message("multiply", "12")]
    assert tool_suffix_ids(tok, messages) == tool_suffix_ids(tok, messages, {"tools": [multiply]})


SHOUT_BLOCK = '<tool_call>{"name": "shout", "arguments": {"text": "x"}}</tool_call>'


@pytest.mark.parametrize(
    ("turn", "assistant", "answers"),
    [
        (
            "I will." + MULTIPLY_BLOCK,
            {"role": "assistant", "content": "I will.", "tool_calls": [MULTIPLY_CALL]},
            [tool_message("multiply", "12")],
        ),
        (
            MULTIPLY_BLOCK + SHOUT_BLOCK,
            {"role": "assistant", "content": "", "tool_calls": [MULTIPLY_CALL, call("shout", text="x")]},
            [tool_message("multiply", "12"), tool_message("shout", "X")],
        ),
    ],
)
def test_prompt_turn_and_suffix_ids_are_the_template_s_rendering_of_the_whole_conversation(
    tok: PreTrainedTokenizerFast, turn: str, assistant: dict[str, Any], answers: list[dict[str, str]]
) -> None:
    tools = [multiply, shout]
    user = [{"role": "user", "content": "3*4?"}]
    prompt = encode(tok, tok.apply_chat_template(user, tools=tools, add_generation_prompt=True, tokenize=False))
    turn_ids = [*encode(tok, turn), tok.eos_token_id]  # as sampled: the turn closed by EOS
    suffix = tool_suffix_ids(tok, answers, {"tools": tools})

    conversation = [*user, assistant, *answers]
    whole = tok.apply_chat_template(conversation, tools=tools, add_generation_prompt=True, tokenize=False)
    assert prompt + turn_ids + suffix == encode(tok, whole)
    assert parse_hermes(turn).message == assistant


def test_a_template_that_is_not_prefix_preserving_gives_the_tool_turns_own_tokens(
    tok: PreTrainedTokenizerFast,
) -> None:
    # rendering the message count first changes the conversation's start once tool messages are added: the
    # suffix was refused (the shorter rendering compared as a prefix), it is found by counting turn ends now
    counting = build_char_tokenizer(TOOL_CHARS)
    counting.chat_template = "{{ messages | length }}" + TOOL_CHAT_TEMPLATE
    messages = [tool_message("multiply", "12")]
    assert (
        tool_suffix_ids(counting, messages) == tool_suffix_ids(tok, messages) == encode(tok, "\n<tool>12\n<assistant>")
    )


def test_stop_tokens_the_template_never_ends_a_turn_with_are_refused_naming_them(tok: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match=r"stop tokens \['<unk>'\].*generation_config.eos_token_id"):
        tool_suffix_ids(tok, [tool_message("multiply", "12")], turn_ends=[tok.unk_token_id])
