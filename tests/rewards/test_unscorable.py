"""A completion every reward function returned None for: named once, with what to do (TRL warns too)."""

from __future__ import annotations

from typing import Any

from rloo.rewards.calling import CallPolicy, RewardFunctions


def test_the_first_unscorable_completion_is_named_by_its_prompt_once() -> None:
    def odd_rows_only(completions: list[Any], **kwargs: Any) -> list[float | None]:
        return [1.0 if i % 2 else None for i in range(len(completions))]

    def second_prompt_only(completions: list[Any], prompts: list[Any], **kwargs: Any) -> list[float | None]:
        return [0.5 if p == "b?" else None for p in prompts]

    warned: list[str] = []
    rewards = RewardFunctions([odd_rows_only, second_prompt_only], policy=CallPolicy(warn=warned.append))
    prompts, k = ["a?", "b?", "c?"], 2  # rows 0-1: "a?", 2-3: "b?", 4-5: "c?"
    per_row = [p for p in prompts for _ in range(k)]

    def score() -> Any:
        return rewards.score(prompts=per_row, completions=["x"] * 6, completion_ids=[[1]] * 6, columns={})

    scored = score()
    assert scored.scorable.tolist() == [False, True, True, True, False, True]
    rewards.warn_unscorable(scored.scorable, prompts, k)
    (message,) = warned
    assert message.startswith("every reward function returned None for completion 0 of prompt 0 of the batch ('a?')")
    assert "(and 1 more in this batch)" in message and "advantage 0" in message
    assert "make at least one reward function return a number for every completion" in message
    rewards.warn_unscorable(score().scorable, prompts, k)
    assert len(warned) == 1  # once a run: rewards/unscorable counts them in every batch


def test_nothing_is_said_when_every_completion_has_a_reward() -> None:
    warned: list[str] = []
    rewards = RewardFunctions(
        [lambda completions, **kw: [0.0] * len(completions)], policy=CallPolicy(warn=warned.append)
    )
    scored = rewards.score(prompts=["a", "a"], completions=["x", "y"], completion_ids=[[1], [2]], columns={})
    rewards.warn_unscorable(scored.scorable, ["a"], 2)
    assert warned == [] and not rewards.warned_unscorable
