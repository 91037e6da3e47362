"""A tiny model that calls a tool: the tool-template tokenizer, a ``multiply`` tool, and a model taught
(a few hundred steps of cross-entropy) to answer "a*b?" by calling ``multiply`` and then writing its result;
head dimension 32, as vLLM's CPU attention needs."""

from __future__ import annotations

import functools
from typing import Any

import torch

from rloo.tiny import TOOL_CHARS, TOOL_CHAT_TEMPLATE, build_char_tokenizer, build_tiny_llama
from tests.helpers.templates import family_tokenizer, render, turn_end


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b


def tool_tokenizer() -> Any:
    tokenizer = build_char_tokenizer(TOOL_CHARS)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


def question(a: int, b: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{a}*{b}?"}]


def product_rows() -> list[dict[str, Any]]:
    """Eight rows asking for 3 x 4 and 2 x 5, with their factors as columns (for :func:`product_reward`)."""
    return [{"prompt": question(a, b), "a": a, "b": b} for a, b in [(3, 4), (2, 5)] * 4]


def product_reward(seen: list[Any]) -> Any:
    """A reward of 1 where the episode's last message is the product, each completion appended to ``seen``."""

    def reward(completions: list[Any], a: list[int], b: list[int], **_: Any) -> list[float]:
        seen.extend(completions)
        return [float(c[-1]["content"].strip() == str(x * y)) for c, x, y in zip(completions, a, b, strict=True)]

    return reward


def call_text(a: int, b: int) -> str:
    return f'<tool_call>{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


def episode_ids(tokenizer: Any, a: int, b: int) -> tuple[list[int], list[int], list[int]]:
    """``(prompt, episode, model_mask)`` of the demonstration: call multiply, then write the product."""
    prompt = tokenizer.apply_chat_template(question(a, b), tools=[multiply], tokenize=False, add_generation_prompt=True)
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}
    conversation = [
        *question(a, b),
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "multiply", "content": str(a * b)},
    ]
    rendered = tokenizer.apply_chat_template(conversation, tools=[multiply], tokenize=False, add_generation_prompt=True)
    encode = functools.partial(tokenizer, add_special_tokens=False)
    prompt_ids = encode(prompt)["input_ids"]
    turn = encode(call_text(a, b))["input_ids"] + [tokenizer.eos_token_id]
    head = encode(rendered)["input_ids"]
    suffix = head[len(prompt_ids) + len(turn) :]
    answer = encode(str(a * b))["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids, turn + suffix + answer, [1] * len(turn) + [0] * len(suffix) + [1] * len(answer)


def template_episode_ids(tokenizer: Any, ends: list[int], a: int, b: int) -> tuple[list[int], list[int], list[int]]:
    """:func:`episode_ids` under a family's own template (:mod:`tests.helpers.templates`): the call turn as the
    template renders it, then what it renders after that turn, then the product and the EOS."""
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}
    assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
    answer_message = {"role": "tool", "name": "multiply", "content": str(a * b)}
    prompt = render(tokenizer, question(a, b), True, [multiply])
    whole = render(tokenizer, [*question(a, b), assistant, answer_message], True, [multiply])
    end = turn_end(whole, prompt, ends)
    turn, suffix = whole[len(prompt) : end + 1], whole[end + 1 :]
    answer = tokenizer(str(a * b), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt, turn + suffix + answer, [1] * len(turn) + [0] * len(suffix) + [1] * len(answer)


def family_tool_tokenizer(template: str | None) -> Any:
    """The tool-template tokenizer (None) or a character tokenizer of a family's own template."""
    return tool_tokenizer() if template is None else family_tokenizer(template)[0]


def _tool_llama(tokenizer: Any, seed: int, template: str | None) -> Any:
    positions = 512 if template is None else 2048
    return build_tiny_llama(
        len(tokenizer), hidden_size=64, num_heads=2, max_positions=positions, tokenizer=tokenizer, seed=seed
    )


@functools.cache
def _taught_state(
    pairs: tuple[tuple[int, int], ...], steps: int, seed: int, template: str | None
) -> dict[str, torch.Tensor]:
    tokenizer = family_tool_tokenizer(template)
    model = _tool_llama(tokenizer, seed, template)
    if template is None:
        rows = [episode_ids(tokenizer, a, b) for a, b in pairs]
    else:
        ends = family_tokenizer(template)[1]
        rows = [template_episode_ids(tokenizer, ends, a, b) for a, b in pairs]
    width = max(len(p) + len(e) for p, e, _ in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (prompt, episode, mask) in enumerate(rows):
        ids[i, : len(prompt) + len(episode)] = torch.tensor(prompt + episode)
        target = [t if m else -100 for t, m in zip(episode, mask, strict=True)]
        labels[i, len(prompt) : len(prompt) + len(episode)] = torch.tensor(target)
    # a family's template renders a long tools preamble (~770 tokens for Qwen3's): a larger rate to fit it
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3 if template is None else 1e-2)
    torch.manual_seed(seed)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def taught_model(
    pairs: tuple[tuple[int, int], ...] = ((3, 4), (2, 5)), steps: int = 300, seed: int = 0, template: str | None = None
) -> Any:
    """A fresh tiny Llama with the taught weights (cached per arguments); ``template``: taught in that family's
    own chat template (:func:`family_tool_tokenizer`) instead of the tool template."""
    tokenizer = family_tool_tokenizer(template)
    model = _tool_llama(tokenizer, seed, template)
    model.load_state_dict(_taught_state(pairs, steps, seed, template))
    return model
