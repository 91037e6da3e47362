"""A tiny model that calls a tool: the tool-template tokenizer, a ``multiply`` tool, and a model taught
(a few hundred steps of cross-entropy) to answer "a*b?" by calling ``multiply`` and then writing its result;
head dimension 32, as vLLM's CPU attention needs."""

from __future__ import annotations

import functools
from typing import Any

import torch

from rloo.tiny import TOOL_CHARS, TOOL_CHAT_TEMPLATE, build_char_tokenizer, build_tiny_llama


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


@functools.cache
def _taught_state(pairs: tuple[tuple[int, int], ...], steps: int, seed: int) -> dict[str, torch.Tensor]:
    tokenizer = tool_tokenizer()
    model = build_tiny_llama(len(tokenizer), hidden_size=64, num_heads=2, tokenizer=tokenizer, seed=seed)
    rows = [episode_ids(tokenizer, a, b) for a, b in pairs]
    width = max(len(p) + len(e) for p, e, _ in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (prompt, episode, mask) in enumerate(rows):
        ids[i, : len(prompt) + len(episode)] = torch.tensor(prompt + episode)
        target = [t if m else -100 for t, m in zip(episode, mask, strict=True)]
        labels[i, len(prompt) : len(prompt) + len(episode)] = torch.tensor(target)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(seed)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def taught_model(pairs: tuple[tuple[int, int], ...] = ((3, 4), (2, 5)), steps: int = 300, seed: int = 0) -> Any:
    """A fresh tiny Llama with the taught weights (cached per arguments)."""
    tokenizer = tool_tokenizer()
    model = build_tiny_llama(len(tokenizer), hidden_size=64, num_heads=2, tokenizer=tokenizer, seed=seed)
    model.load_state_dict(_taught_state(pairs, steps, seed))
    return model
