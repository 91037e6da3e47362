"""``rloo demo-tools``: the agentic demo's pieces (demonstrated episodes, their labels, the evaluation) and a
tiny run end to end; the real-size run is marked slow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rloo.cli.tool_demo import (
    Product,
    build_tool_demo_model,
    encode_episode,
    evaluate_tools,
    final_answer,
    make_products,
    multiply,
    teacher_episode,
)
from rloo.tools.parsing import tool_suffix_ids
from tests.helpers.cli import flat, invoke
from tests.helpers.sandbox import hide_bwrap


def test_the_teacher_rounds_in_its_head_and_the_tool_is_exact() -> None:
    assert Product(47, 8).head_answer == 400 and Product(40, 8).head_answer == 320
    assert teacher_episode(Product(47, 8), True)[-1] == {"role": "assistant", "content": "376"}
    train, held_out = make_products(0)
    assert len(train) + len(held_out) == 90 * 8 and not set(train) & set(held_out)


def test_a_demonstrated_episode_is_trained_on_the_models_turns_only() -> None:
    _, tokenizer = build_tool_demo_model(0, hidden_size=32)
    ids, labels = encode_episode(tokenizer, Product(47, 8), teacher_episode(Product(47, 8), True))
    taught = tokenizer.decode([token for token, label in zip(ids, labels, strict=True) if label != -100])
    assert taught == '<tool_call>{"name": "multiply", "arguments": {"a": 47, "b": 8}}</tool_call></s>376</s>'
    assert tokenizer.decode(ids).endswith("</s>\n<tool>376\n<assistant>376</s>")
    assert len(ids) <= 32  # the tool-call JSON's fixed parts are single tokens


def test_under_the_thinking_template_each_taught_turn_reasons_first() -> None:
    _, tokenizer = build_tool_demo_model(0, hidden_size=32, template="thinking")
    problem = Product(47, 8)
    ids, labels = encode_episode(tokenizer, problem, teacher_episode(problem, True, thinking=True))
    taught = tokenizer.decode([token for token, label in zip(ids, labels, strict=True) if label != -100])
    call = '<tool_call>{"name": "multiply", "arguments": {"a": 47, "b": 8}}</tool_call></s>'
    assert taught == f"<think>47*8</think>{call}<think></think>376</s>"
    ids, labels = encode_episode(tokenizer, problem, teacher_episode(problem, False, thinking=True))
    assert tokenizer.decode([t for t, label in zip(ids, labels, strict=True) if label != -100]) == (
        "<think>50*8</think>400</s>"
    )
    assert final_answer({"role": "assistant", "content": "<think>47*8</think> 376"}) == "376"


def test_the_thinking_template_is_not_prefix_preserving_and_the_tool_answer_is_still_what_it_renders() -> None:
    """Qwen3's rule: the last assistant turn shows an empty reasoning block, the same turn followed by tool
    messages does not; the tokens inserted after a sampled turn are still what the template renders after it."""
    _, tokenizer = build_tool_demo_model(0, hidden_size=32, template="thinking")
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}
    turn = [{"role": "user", "content": "3*4?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    answered = [*turn, {"role": "tool", "name": "multiply", "content": "12"}]

    def render(messages: list[dict[str, object]], prompt: bool) -> str:
        text = tokenizer.apply_chat_template(messages, tools=[multiply], tokenize=False, add_generation_prompt=prompt)
        return str(text)

    alone, followed = render(turn, False), render(answered, True)
    assert "<assistant><think></think><tool_call>" in alone and "<think>" not in followed
    suffix = tool_suffix_ids(tokenizer, answered[2:], {"tools": [multiply]})
    assert tokenizer.decode(suffix) == "\n<tool>12\n<assistant>" and followed.endswith("</s>\n<tool>12\n<assistant>")


def test_an_untrained_model_neither_answers_nor_calls() -> None:
    model, tokenizer = build_tool_demo_model(0, hidden_size=32)
    accuracy = evaluate_tools(model, tokenizer, make_products(0)[1][:8])
    assert accuracy.tool_use == 0.0 and accuracy.right_call == 0.0


def test_a_tiny_tool_demo_writes_its_table_and_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hide_bwrap(monkeypatch)  # its tool is a plain function, no model-written code: it needs no sandbox
    out = tmp_path / "demo"
    sizes = ("--steps", "2", "--prompts-per-step", "4", "--num-generations", "2", "--hidden-size", "32")
    result = invoke("demo-tools", *sizes, "--warm-start-steps", "50", "--output-dir", out)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "called the tool" in result.stdout and "+ RLOO" in result.stdout
    summary = json.loads((out / "demo_results.json").read_text())
    assert {"teacher (demonstrations)", "warm start", "control: + SFT, same steps", "+ RLOO"} == set(
        summary["accuracy"]
    )
    again = invoke("demo-tools", *sizes, "--output-dir", out)
    assert again.exit_code == 2 and "already exists and is not empty" in flat(again.stderr)
    bad = invoke("demo-tools", "--tool-share", "1.5", "--output-dir", tmp_path / "bad")
    assert bad.exit_code == 2 and "--tool-share=1.5 is invalid" in flat(bad.stderr)
    bad = invoke("demo-tools", "--chat-template", "qwen", "--output-dir", tmp_path / "bad")
    assert bad.exit_code == 2 and "--chat-template='qwen' is invalid: one of 'hermes', 'thinking'" in flat(bad.stderr)


@pytest.mark.slow
def test_the_default_tool_demo_learns_to_call_the_tool(tmp_path: Path) -> None:
    """The real-size demo in a fresh process (a few minutes on 2 CPU cores)."""
    command = [sys.executable, "-m", "rloo", "demo-tools", "--output-dir", str(tmp_path / "demo")]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    accuracy = json.loads((tmp_path / "demo" / "demo_results.json").read_text())["accuracy"]
    assert accuracy["+ RLOO"]["greedy"] - accuracy["warm start"]["greedy"] >= 0.3, accuracy
    assert accuracy["+ RLOO"]["tool_use"] >= 0.9 > accuracy[_control()]["tool_use"], accuracy


@pytest.mark.slow
def test_the_tool_demo_learns_under_a_thinking_template(tmp_path: Path) -> None:
    """The real-size demo with the thinking template (Qwen3's rules): episodes reason, call, and are answered."""
    out = tmp_path / "demo"
    command = [sys.executable, "-m", "rloo", "demo-tools", "--chat-template", "thinking", "--output-dir", str(out)]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    accuracy = json.loads((out / "demo_results.json").read_text())["accuracy"]
    assert accuracy["+ RLOO"]["greedy"] - accuracy["warm start"]["greedy"] >= 0.3, accuracy
    assert accuracy["+ RLOO"]["tool_use"] >= 0.9, accuracy


def _control() -> str:
    return "control: + SFT, same steps"
