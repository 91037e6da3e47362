"""Tool results appended as tokens under the chat templates models ship, read at test time from the
installed TRL's ``chat_templates/`` folder (the originals, not TRL's patched training templates): the
tokens inserted after a model turn are what the template renders after that turn in a real conversation,
and prompt + turn + inserted tokens is the template's rendering of the whole conversation."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import pytest

from rloo.tiny import build_char_tokenizer
from rloo.tools.parsing import _ids, tool_suffix_ids
from tests.helpers.tools import multiply

trl = pytest.importorskip("trl")
TEMPLATES = Path(trl.__file__).parent / "chat_templates"

# template -> the tokens a model stops its turn with (generation_config.eos_token_id of those models)
FAMILIES: dict[str, list[str]] = {
    "qwen2_5": ["<|im_end|>"],
    "qwen3": ["<|im_end|>"],  # re-renders the last assistant turn without its empty <think> block
    "qwen3_instruct_2507": ["<|im_end|>"],
    "qwen3_5_think": ["<|im_end|>"],
    "qwen3_5_nothink": ["<|im_end|>"],
    "qwen3_8": ["<|im_end|>"],
    "nemotron_3_nano": ["<|im_end|>"],
    "lfm2": ["<|im_end|>"],
    "llama3_1": ["<|eot_id|>", "<|eom_id|>"],
    "llama3_2": ["<|eot_id|>", "<|eom_id|>"],
    "gemma4": ["<turn|>", "<|tool_response>"],  # a call ends the turn at <|tool_response>; the answer follows it
    "gptoss": ["<|end|>", "<|call|>", "<|return|>"],  # harmony: a call ends at <|call|>
    "glm4moe": ["<|user|>", "<|observation|>"],  # the model stops at <|observation|>, the tool's turn marker
}
# generation prompts that open a reasoning block the template renders closed in the finished turn: a model
# samples after "<think>\n", so only the tokens after its turn are compared for these
REASONING_PREFILLED = {"nemotron_3_nano"}


def family_tokenizer(name: str) -> tuple[Any, list[int]]:
    """A character tokenizer covering the template's text, its stop tokens single special tokens."""
    template = (TEMPLATES / f"{name}.jinja").read_text()
    chars = string.printable + "".join(sorted(set(template)))
    tokenizer = build_char_tokenizer(chars)
    tokenizer.add_special_tokens({"additional_special_tokens": FAMILIES[name]})
    tokenizer.chat_template = template
    return tokenizer, tokenizer.convert_tokens_to_ids(FAMILIES[name])


def render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
    return _ids(
        tokenizer.apply_chat_template(
            messages, tools=[multiply], tokenize=True, add_generation_prompt=generation_prompt
        )
    )


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
    prompt, whole = render(tokenizer, question, True), render(tokenizer, conversation, True)
    # the model's turn ends at the first stop token after the prompt's: what follows it is the suffix
    turn_end = [i for i, token in enumerate(whole) if token in ends][sum(token in ends for token in prompt)]
    assert whole[turn_end + 1 :] == suffix
    if name not in REASONING_PREFILLED:  # prompt + the turn as the template renders it + suffix: the whole
        assert prompt + whole[len(prompt) : turn_end + 1] + suffix == whole
    assert "12" in tokenizer.decode(suffix)  # the tool's answer is among the inserted tokens
    assert tokenizer.decode(whole) == tokenizer.apply_chat_template(
        conversation, tools=[multiply], tokenize=False, add_generation_prompt=True
    )  # the test tokenizer round-trips the template's text
