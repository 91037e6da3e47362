"""TRL's GRPO agent-training examples (docs/source/grpo_trainer.md, "Tools" and "Environments"), run with
``from rloo import GRPOConfig, GRPOTrainer`` in place of TRL's import and a tiny local model in place of the
hub id: the rest of each example is TRL's."""

from __future__ import annotations

import json
import random
from pathlib import Path

from rloo import GRPOConfig, GRPOTrainer
from tests.helpers.tools import family_tool_tokenizer, question, taught_model, tool_tokenizer
from tests.helpers.tools import multiply as taught_multiply


class IncrementEnv:
    # Reserved methods
    def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
        self.counter = 0
        self.target = random.randint(1, 6)  # self-sample the task
        return f"Increment the counter by {self.target}."  # returned string becomes the prompt

    def get_reward(self) -> float:  # optional: the environment scores itself from its own state
        return float(self.counter == self.target)

    # Public methods (exposed as tools)
    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_add(a: int, b: int) -> int:
    """
    Asynchronously adds two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum of the two integers.
    """
    return a + b


def small(tmp_path: Path, **overrides: object) -> dict[str, object]:
    return {
        "output_dir": str(tmp_path / "run"),
        "num_generations": 2,
        "per_device_train_batch_size": 4,
        "max_completion_length": 120,
        "logging_steps": 1,
        "log_completions": True,
        "report_to": [],
        **overrides,
    }


def test_the_environment_that_owns_its_data(tmp_path: Path) -> None:
    """No train_dataset: reset() returns each prompt; get_reward scores the episode; max_steps sets the length."""
    trainer = GRPOTrainer(
        model=taught_model(),
        args=GRPOConfig(max_steps=2, chat_template_kwargs={"enable_thinking": False}, **small(tmp_path)),
        environment_factory=IncrementEnv,
        processing_class=tool_tokenizer(),
    )
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.rewards.names == ["IncrementEnv"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert all(row["prompt"] == [{"role": "user", "content": ""}] for row in rows)  # the dataset's placeholder
    logged = [row for row in trainer.state.log_history if "rewards/IncrementEnv/mean" in row]
    assert len(logged) == 2 and "tools/call_frequency" in logged[0]


def test_the_tools_example(tmp_path: Path) -> None:
    def correct(completions: list[list[dict[str, str]]], answer: list[int], **kwargs: object) -> list[float]:
        return [float(c[-1]["content"].strip() == str(a)) for c, a in zip(completions, answer, strict=True)]

    rows = [{"prompt": question(a, b), "answer": a * b} for a, b in [(3, 4), (2, 5)] * 2]
    trainer = GRPOTrainer(
        model=taught_model(),
        reward_funcs=correct,
        args=GRPOConfig(max_steps=2, **small(tmp_path)),
        train_dataset=rows,
        processing_class=tool_tokenizer(),
        tools=[multiply, async_add],
    )
    trainer.train()
    logged = [row for row in trainer.state.log_history if "tools/call_frequency" in row]
    assert len(logged) == 2


def test_the_tools_example_with_qwen3s_own_chat_template(tmp_path: Path) -> None:
    """Qwen3's template as Qwen3 ships it (not prefix-preserving: it re-renders the last assistant turn once
    tool messages follow): TRL 1.16 runs this example, rloo stopped at the first tool call before."""

    def correct(completions: list[list[dict[str, str]]], answer: list[int], **kwargs: object) -> list[float]:
        return [float(c[-1]["content"].strip() == str(a)) for c, a in zip(completions, answer, strict=True)]

    rows = [{"prompt": question(a, b), "answer": a * b} for a, b in [(3, 4), (2, 5)] * 2]
    trainer = GRPOTrainer(
        model=taught_model(template="qwen3"),
        reward_funcs=correct,
        args=GRPOConfig(
            max_steps=1,
            max_tool_calling_iterations=2,
            max_prompt_length=1024,
            **small(tmp_path, per_device_train_batch_size=8, max_completion_length=200),
        ),
        train_dataset=rows,
        processing_class=family_tool_tokenizer("qwen3"),
        tools=[taught_multiply],  # the tool it was taught with: its schema is in the system prompt
    )
    trainer.train()
    logged = next(row for row in trainer.state.log_history if "tools/call_frequency" in row)
    assert logged["tools/call_frequency"] == 1.0 and logged["tools/failure_frequency"] == 0.0
    episodes = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert len(episodes) == 8
    for episode in episodes:  # every completion called multiply and read its answer
        a, b = episode["prompt"][0]["content"].rstrip("?").split("*")
        tool = [m for m in episode["completion"] if m["role"] == "tool"]
        assert [m["content"] for m in tool] == [str(int(a) * int(b))], episode["completion"]
