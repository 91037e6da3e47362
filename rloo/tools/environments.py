"""``environment_factory`` (TRL GRPO's contract): stateful environments whose methods are the model's tools.

An environment is what ``factory()`` returns: an object with a ``reset(**row)`` method, called with the
dataset row (``prompt`` and the other columns) before its episode; when it returns a string, that text is
appended to the prompt's last user message. Its other public methods (not ``reset``, ``get_reward``, nor
starting with ``_``) are tools of that episode, with the same contract as ``tools=`` (typed arguments, a
Google-style docstring). An optional ``get_reward()`` (sync or async) scores the finished episode from the
environment's state: a reward function of weight 1 named after the environment's class.

Each episode (K per prompt) has its own instance, so their states stay apart; instances are pooled and
reset for each batch ("construct once, reset often"), more built only when a batch needs more. A dict
``{name: factory}`` lets one run mix environments: each row names its own in an ``environment`` column
(which ``reset`` does not receive), and only that environment's tools are shown in its prompt.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rloo.data.prompts import preview
from rloo.rewards.threads import with_timeout
from rloo.waiting import waiting_for

RESERVED = ("reset", "get_reward")


def environment_tools(instance: Any) -> list[Callable[..., Any]]:
    """The public methods of ``instance`` that are tools (all but ``reset``, ``get_reward`` and ``_*``)."""
    return [
        member
        for name, member in inspect.getmembers(instance, predicate=inspect.ismethod)
        if name not in RESERVED and not name.startswith("_")
    ]


class Environments:
    """A run's environment factories (one, or a dict chosen by each row's ``environment`` column)."""

    def __init__(self, factory: Callable[[], Any] | Mapping[str, Callable[[], Any]]) -> None:
        self.multi = isinstance(factory, Mapping)
        factories: dict[str | None, Callable[[], Any]] = {}
        if isinstance(factory, Mapping):
            factories.update(factory.items())
        else:
            factories[None] = factory
        if not factories:
            raise ValueError("environment_factory={} names no environment; give a factory or a dict of them")
        self.factories = factories
        self.pool: dict[str | None, list[Any]] = {}
        self.reward_classes: list[type] = []
        for name, make in factories.items():
            if not callable(make):
                raise ValueError(f"environment_factory[{name!r}] is {make!r}: give a callable that builds one")
            instance = make()  # a probe, kept as the pool's first instance
            if not callable(getattr(instance, "reset", None)):
                raise ValueError(
                    f"environment_factory{'' if name is None else f'[{name!r}]'} built a {type(instance).__name__} "
                    "without a reset method; an environment needs reset(**row), returning None or text for the prompt"
                )
            self.pool[name] = [instance]
            if callable(getattr(instance, "get_reward", None)) and type(instance) not in self.reward_classes:
                self.reward_classes.append(type(instance))

    def name_of(self, row: Mapping[str, Any], index: int) -> str | None:
        """The environment row ``index`` selects (the ``environment`` column with a dict of factories)."""
        if not self.multi:
            return None
        name = row.get("environment")
        if name not in self.factories:
            raise ValueError(
                f"row {index} has environment={name!r}, which is not among environment_factory's "
                f"{sorted(str(k) for k in self.factories)}; give each row an `environment` column naming one"
            )
        return name

    def draw(self, rows: Sequence[Mapping[str, Any]], k: int) -> list[Any]:
        """One instance per episode (``k`` per row, a row's consecutive), from the pool, built when it runs out."""
        handed: dict[str | None, int] = {}
        instances = []
        for index, row in enumerate(rows):
            name = self.name_of(row, index)
            for _ in range(k):
                pool = self.pool[name]
                at = handed.get(name, 0)
                if at == len(pool):
                    pool.append(self.factories[name]())
                handed[name] = at + 1
                instances.append(pool[at])
        return instances

    def reset(
        self, instances: Sequence[Any], rows: Sequence[Mapping[str, Any]], k: int, timeout: float | None = None
    ) -> list[Any]:
        """``reset(**row)`` of each episode's instance (without ``environment`` with a dict of factories): the
        observations, None or text, one per episode. Each within ``timeout`` seconds (``tool_timeout``; None: no
        limit, the progress line names a long one); one that raises or runs past it stops the run, naming the
        class, the batch's row and the error (a broken environment would train on nothing it meant)."""
        observations = []
        for i, instance in enumerate(instances):
            row = dict(rows[i // k])
            if self.multi:
                row.pop("environment", None)
            name, where = type(instance).__name__, f"row {i // k} of the batch (prompt {preview(row.get('prompt'))})"
            try:
                with waiting_for(f"environment {name}.reset ({where})"):
                    observations.append(_call(functools.partial(instance.reset, **row), timeout))
            except TimeoutError:
                raise RuntimeError(
                    f"environment {name}.reset did not return within tool_timeout={timeout} s for {where}: fix it, "
                    "or raise tool_timeout (it bounds each tool call and each reset)"
                ) from None
            except Exception as error:
                raise RuntimeError(
                    f"environment {name}.reset failed for {where}: {type(error).__name__}: {error}; fix the "
                    "environment (reset(**row) gets the row's columns and returns None or text for the prompt)"
                ) from error
        return observations

    def rewards(self) -> list[Callable[..., list[float | None]]]:
        """A reward function per environment class with ``get_reward``: that method for its episodes, None
        (does not apply) for others'; named after the class."""
        return [_environment_reward(cls) for cls in self.reward_classes]


def _call(call: Callable[[], Any], timeout: float | None) -> Any:
    """``call()``, in a daemon thread within ``timeout`` seconds when there is one (a hung one keeps its thread)."""
    return call() if timeout is None else with_timeout(call, timeout)


def _environment_reward(cls: type) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(cls.get_reward):  # type: ignore[attr-defined]

        async def reward(environments: list[Any], **_: Any) -> list[float | None]:
            return [await e.get_reward() if type(e) is cls else None for e in environments]  # type: ignore[attr-defined]

    else:

        def reward(environments: list[Any], **_: Any) -> list[float | None]:  # type: ignore[misc]
            return [e.get_reward() if type(e) is cls else None for e in environments]  # type: ignore[attr-defined]

    reward.__name__ = cls.__name__
    return reward


def with_observation(prompt: list[dict[str, Any]], observation: Any) -> list[dict[str, Any]]:
    """``prompt`` with ``observation`` (text) appended to its last message's content (a new list: the dataset's
    row is left alone); the prompt itself when the observation is None."""
    if observation is None:
        return prompt
    if not isinstance(observation, str):
        raise ValueError(
            f"an environment's reset returned {type(observation).__name__}; return None or text to append to the prompt"
        )
    last = prompt[-1]
    return [*prompt[:-1], {**last, "content": str(last.get("content", "")) + observation}]


def environment_rows(train_dataset: Any, environment_factory: Any, args: Any) -> Any:
    """``train_dataset``, or, when an environment owns the data (``environment_factory`` and no dataset: its
    ``reset`` returns the prompt), a generation batch's worth of empty prompts, drawn again every batch, with
    ``max_steps`` setting the length (TRL's rule)."""
    if train_dataset is not None or environment_factory is None:
        return train_dataset
    if isinstance(environment_factory, Mapping):
        raise ValueError(
            "environment_factory={name: factory} needs a train_dataset with an `environment` column routing each "
            "row to its environment; give one, or a single factory whose reset() returns the prompt"
        )
    if args.max_steps <= 0:
        raise ValueError(
            "without a train_dataset (the environment's reset() returns each prompt) RLOOConfig.max_steps sets the "
            "run's length: set max_steps > 0"
        )
    return [{"prompt": [{"role": "user", "content": ""}]} for _ in range(args.prompts_per_generation)]
