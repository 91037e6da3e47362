"""``environment_factory`` (rloo.tools.environments): one stateful instance per episode, reset with its row,
its methods the episode's tools, ``get_reward`` a reward of weight 1; a dict of factories chosen per row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rloo import RLOOConfig, RLOOTrainer
from rloo.tools.agent import AgentSettings
from rloo.tools.environments import Environments, environment_tools, with_observation
from tests.helpers.tools import question, taught_model, tool_tokenizer

TOK = tool_tokenizer()


class Calculator:
    """Counts its calls; rewards an episode that multiplied the row's numbers."""

    built = 0

    def __init__(self) -> None:
        Calculator.built += 1
        self.expected: tuple[int, int] | None = None
        self.calls: list[tuple[int, int]] = []

    def reset(self, prompt: Any = None, a: int = 0, b: int = 0, **_: Any) -> None:
        self.expected, self.calls = (a, b), []

    def multiply(self, a: int, b: int) -> int:
        """Multiply two whole numbers.

        Args:
            a: The first number.
            b: The second number.
        """
        self.calls.append((a, b))
        return a * b

    def get_reward(self) -> float:
        return float(self.expected in self.calls)

    def _private(self) -> None:  # not a tool
        pass


class Greeter:
    def reset(self, **row: Any) -> str:
        return f" (row {row['n']})"

    def greet(self, name: str) -> str:
        """Greet someone.

        Args:
            name: Who.
        """
        return f"hi {name}"


def config(tmp_path: Path, **overrides: Any) -> RLOOConfig:
    values: dict[str, Any] = {
        "output_dir": str(tmp_path / "run"),
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 120,
        "max_steps": 2,
        "logging_steps": 1,
        "learning_rate": 1e-3,
        "report_to": [],
        "seed": 0,
    }
    return RLOOConfig(**{**values, **overrides})


def test_an_environments_public_methods_are_its_tools() -> None:
    assert [tool.__name__ for tool in environment_tools(Calculator())] == ["multiply"]


def test_each_episode_gets_its_own_instance_reset_with_its_row_and_its_observation() -> None:
    agent = AgentSettings.from_config(config(Path("/tmp")), None, Greeter)
    assert agent is not None
    inputs = agent.episode_inputs([[{"role": "user", "content": "hello"}]] * 2, {"n": [1, 2]}, k=2)
    assert inputs.environments is not None and len({id(e) for e in inputs.environments}) == 4
    assert inputs.prompts == [[{"role": "user", "content": f"hello (row {n})"}] for n in (1, 1, 2, 2)]
    assert [sorted(box.tools) for box in inputs.toolboxes] == [["greet"]] * 4
    again = agent.episode_inputs([[{"role": "user", "content": "x"}]], {"n": [3]}, k=2)
    assert again.environments is not None and set(map(id, again.environments)) <= set(map(id, inputs.environments))


def test_a_dict_of_environments_is_chosen_by_each_rows_environment_column() -> None:
    environments = Environments({"calc": Calculator, "greet": Greeter})
    rows = [{"prompt": [], "environment": "greet", "n": 1}, {"prompt": [], "environment": "calc", "a": 2, "b": 3}]
    instances = environments.draw(rows, 2)
    assert [type(e).__name__ for e in instances] == ["Greeter", "Greeter", "Calculator", "Calculator"]
    assert environments.reset(instances, rows, 2)[:2] == [" (row 1)", " (row 1)"]  # no `environment` keyword
    with pytest.raises(ValueError, match=r"row 0 has environment='nope'.*\['calc', 'greet'\]"):
        environments.draw([{"environment": "nope"}], 1)


def test_an_environment_without_reset_is_refused_naming_it() -> None:
    class NoReset:
        pass

    with pytest.raises(ValueError, match="built a NoReset without a reset method"):
        Environments(NoReset)


def test_an_observation_that_is_not_text_is_refused() -> None:
    with pytest.raises(ValueError, match="reset returned int; return None or text"):
        with_observation([{"role": "user", "content": "x"}], 3)


def test_a_run_with_an_environment_trains_with_its_tools_and_its_reward(tmp_path: Path) -> None:
    seen: list[Any] = []

    def sees_environments(completions: list[Any], environments: list[Any], **_: Any) -> list[float]:
        seen.append(environments)
        return [0.0] * len(completions)

    rows = [{"prompt": question(a, b), "a": a, "b": b} for a, b in [(3, 4), (2, 5)] * 4]
    trainer = RLOOTrainer(
        taught_model(),
        sees_environments,
        args=config(tmp_path, max_tool_calling_iterations=2),
        train_dataset=rows,
        processing_class=TOK,
        environment_factory=Calculator,
    )
    trainer.train()
    logged = [row for row in trainer.state.log_history if "tools/call_frequency" in row]
    assert len(logged) == 2 and logged[0]["tools/call_frequency"] > 0.5
    assert logged[0]["rewards/Calculator/mean"] > 0.5  # the episodes' own instances saw the right calls
    assert trainer.rewards.names == ["sees_environments", "Calculator"]
    assert len(seen[0]) == 8 and len({id(e) for e in seen[0]}) == 8  # one instance per episode
    assert all(isinstance(e, Calculator) for e in seen[0])


def test_an_environments_reward_alone_is_enough(tmp_path: Path) -> None:
    rows = [{"prompt": question(3, 4), "a": 3, "b": 4}] * 4
    trainer = RLOOTrainer(
        taught_model(),
        args=config(tmp_path, num_generations=2, per_device_train_batch_size=4, max_steps=1),
        train_dataset=rows,
        processing_class=TOK,
        environment_factory=Calculator,
    )
    assert trainer.rewards.names == ["Calculator"]
    trainer.train()


def test_without_any_reward_the_trainer_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="RLOOTrainer needs reward_funcs"):
        RLOOTrainer(
            taught_model(),
            args=config(tmp_path),
            train_dataset=[{"prompt": question(3, 4)}] * 2,
            processing_class=TOK,
            environment_factory=Greeter,
        )
