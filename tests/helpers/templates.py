"""The chat templates models ship, read at test time from the installed TRL's ``chat_templates/`` folder (the
originals, not TRL's patched training templates), and character tokenizers that render them exactly."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from rloo.tiny import build_char_tokenizer
from rloo.tools.parsing import _ids

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


def templates_folder() -> Path:
    import trl

    return Path(trl.__file__).parent / "chat_templates"


def family_tokenizer(name: str) -> tuple[Any, list[int]]:
    """A character tokenizer covering template ``name``'s text, its stop tokens single special tokens (the first
    its EOS), and the template; with the stop tokens' ids."""
    template = (templates_folder() / f"{name}.jinja").read_text()
    tokenizer = build_char_tokenizer(string.printable + "".join(sorted(set(template))))
    tokenizer.add_special_tokens({"additional_special_tokens": FAMILIES[name]})
    tokenizer.eos_token = FAMILIES[name][0]
    tokenizer.chat_template = template
    return tokenizer, tokenizer.convert_tokens_to_ids(FAMILIES[name])


def render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool, tools: Any = None) -> list[int]:
    """The template's token ids of ``messages``."""
    rendered = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=True, add_generation_prompt=generation_prompt
    )
    return _ids(rendered)


def turn_end(tokens: list[int], prompt: list[int], ends: list[int]) -> int:
    """Where the assistant turn that follows ``prompt`` in ``tokens`` ends: the first stop token after the
    prompt's own (the same count as :func:`rloo.tools.parsing.tool_suffix_ids`)."""
    return [i for i, token in enumerate(tokens) if token in ends][sum(token in ends for token in prompt)]
