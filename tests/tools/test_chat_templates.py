"""Tool results appended as tokens under the chat templates models ship, read at test time from the
installed TRL's ``chat_templates/`` folder (the originals, not TRL's patched training templates): the
tokens inserted after a model turn are what the template renders after that turn in a real conversation,
and prompt + turn + inserted tokens is the template's rendering of the whole conversation."""

from __future__ import annotations

import pytest

from rloo.tools.parsing import tool_suffix_ids
from tests.helpers.templates import FAMILIES, family_tokenizer, render, turn_end
from tests.helpers.tools import multiply

pytest.importorskip("trl")
# generation prompts that open a reasoning block the template renders closed in the finished turn: a model
# samples after "<think>\n", so only the tokens after its turn are compared for these
REASONING_PREFILLED = {"nemotron_3_nano"}


@pytest.mark.parametrize("name", FAMILIES)
def test_the_inserted_tokens_are_what_the_template_renders_after_the_turn(name: str) -> None:
    tokenizer, ends = family_tokenizer(name)
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}
    question = [{"role": "user", "content": "What is 3*4? Use the tool."}]
    conversation = [
        *question,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "multiply", "content": "12"},
    ]
    suffix = tool_suffix_ids(tokenizer, conversation[2:], {"tools": [multiply]}, ends)
    prompt, whole = render(tokenizer, question, True, [multiply]), render(tokenizer, conversation, True, [multiply])
    # the model's turn ends at the first stop token after the prompt's: what follows it is the suffix
    end = turn_end(whole, prompt, ends)
    assert whole[end + 1 :] == suffix
    if name not in REASONING_PREFILLED:  # prompt + the turn as the template renders it + suffix: the whole
        assert prompt + whole[len(prompt) : end + 1] + suffix == whole
    assert "12" in tokenizer.decode(suffix)  # the tool's answer is among the inserted tokens
    assert tokenizer.decode(whole) == tokenizer.apply_chat_template(
        conversation, tools=[multiply], tokenize=False, add_generation_prompt=True
    )  # the test tokenizer round-trips the template's text
