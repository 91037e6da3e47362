"""Tool calls in each family's own format: read back from what the family's original chat template renders
(the installed TRL's ``chat_templates/``), by hand for each format, and malformed blocks counted."""

from __future__ import annotations

from typing import Any

import pytest

from rloo.tools.formats import format_of
from rloo.tools.parsing import parse_turn
from tests.helpers.templates import FAMILIES, family_tokenizer, render, turn_end
from tests.helpers.tools import multiply

CALL = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": "x y"}}}
OTHER = {"type": "function", "function": {"name": "multiply", "arguments": {"a": [1, 2], "b": {"c": True}}}}
FORMAT = {
    "qwen2_5": "hermes",
    "qwen3": "hermes",
    "qwen3_instruct_2507": "hermes",
    "qwen3_5_think": "xml",
    "qwen3_5_nothink": "xml",
    "qwen3_8": "xml",
    "nemotron_3_nano": "xml",
    "llama3_1": "llama3",
    "llama3_2": "llama3",
    "gemma4": "gemma4",
    "gptoss": "harmony",
    "glm4moe": "glm",
}
ONE_CALL_A_TURN = {"llama3_1", "llama3_2", "gptoss"}  # their templates render one call per message


@pytest.mark.parametrize("name", FORMAT)
def test_the_calls_a_template_renders_parse_back(name: str) -> None:
    tokenizer, ends = family_tokenizer(name)
    assert format_of(tokenizer.chat_template).name == FORMAT[name]
    calls = [CALL] if name in ONE_CALL_A_TURN else [CALL, OTHER]
    question = [{"role": "user", "content": "What is 3*4?"}]
    answers = [{"role": "tool", "name": "multiply", "content": "12"} for _ in calls]
    assistant = {"role": "assistant", "content": "", "tool_calls": calls}
    whole = render(tokenizer, [*question, assistant, *answers], True, [multiply])
    prompt = render(tokenizer, question, True, [multiply])
    parsed = parse_turn(tokenizer, whole[len(prompt) : turn_end(whole, prompt, ends) + 1], prompt, [multiply])
    assert parsed.calls == calls and parsed.malformed == 0
    assert parsed.message["tool_calls"] == calls


def test_lfm2s_template_renders_no_calls_so_hermes_is_assumed() -> None:
    tokenizer, _ = family_tokenizer("lfm2")
    assert "lfm2" in FAMILIES and format_of(tokenizer.chat_template).name == "hermes"


@pytest.mark.parametrize(
    ("template", "text", "calls", "malformed", "content"),
    [
        (
            "<function=x><parameter=y>",
            "Let me.\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=s>\nhi there\n"
            "</parameter>\n</function>\n</tool_call>",
            [("add", {"a": 1, "s": "hi there"})],
            0,
            "Let me.",
        ),
        ("<arg_key><arg_value>", "<tool_call>ping</tool_call>", [("ping", {})], 0, ""),
        (
            "<arg_key><arg_value>",
            "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>[1, 2]</arg_value>\n</tool_call>",
            [("add", {"a": [1, 2]})],
            0,
            "",
        ),
        (
            '<|tool_call> call: <|"|>',
            '<|tool_call>call:add{a:1,s:<|"|>a, b: {c}<|"|>,n:{x:true}}<tool_call|>',
            [("add", {"a": 1, "s": "a, b: {c}", "n": {"x": True}})],
            0,
            "",
        ),
        ("<|tool_call> call:", "<|tool_call>call:add{a:}<tool_call|>", [], 1, "<|tool_call>call:add{a:}<tool_call|>"),
        (
            "<|call|> <|channel|>",
            "<|channel|>analysis<|message|>think<|end|><|start|>assistant to=functions.add<|channel|>commentary "
            'json<|message|>{"a": 1}<|call|>',
            [("add", {"a": 1})],
            0,
            "",
        ),
        (
            "<|call|> <|channel|>",
            "<|channel|>final<|message|>It is 12.<|return|>",
            [],
            0,
            "It is 12.",
        ),
        ('"parameters" ipython', '<|python_tag|>{"name": "add", "parameters": {"a": 1}}', [("add", {"a": 1})], 0, ""),
        ('"parameters" ipython', '{"name": "add", "parameters": [1]}', [], 1, '{"name": "add", "parameters": [1]}'),
        ('"parameters" ipython', "The answer is 12.", [], 0, "The answer is 12."),
        ("<tool_call>", "<tool_call>{not json}</tool_call>", [], 1, "<tool_call>{not json}</tool_call>"),
    ],
    ids=[
        *("xml", "glm-no-arguments", "glm-json-value", "gemma4", "gemma4-bad", "harmony-call", "harmony-final"),
        *("llama3", "llama3-bad", "llama3-text", "hermes-bad"),
    ],
)
def test_each_format_by_hand(
    template: str, text: str, calls: list[tuple[str, dict[str, Any]]], malformed: int, content: str
) -> None:
    got, bad, got_content = format_of(template).parse(text)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in got] == calls
    assert (bad, got_content) == (malformed, content)
