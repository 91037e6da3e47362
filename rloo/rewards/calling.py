"""Rewards out: reward functions and reward models -> one ``(N, F)`` score tensor.

Reward functions follow TRL's convention: they are called with keyword arguments
``prompts``, ``completions``, ``completion_ids``, every extra dataset column by name and
``trainer_state``, and return one float (or ``None``: "does not apply") per completion.
A reward model is just another reward function (:mod:`rloo.rewards.reward_model`);
:class:`RewardFunctions` holds a run's functions with their weights and is the one place
where their scores are combined.

Where we depart from TRL:

- ``async def`` reward functions run concurrently in one event loop; if the caller is
  already inside a running loop (a notebook), they run in a fresh thread with its own loop.
- Results are validated (type, length, element type) with messages that name the function,
  and a failure inside a function is re-raised naming it and the batch size.
- Non-finite values (nan/inf) are treated like ``None`` ("does not apply") and counted per
  function, instead of flowing into the advantages.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from rloo.algo.advantages import combine_rewards
from rloo.rewards.reward_log import RewardLog
from rloo.rewards.signatures import arguments_for, check_reward_arguments
from rloo.rewards.threads import run_async, watched, with_timeout
from rloo.waiting import waiting_for

RewardOutput = Sequence[float | None] | Tensor | np.ndarray
RewardFunc = Callable[..., RewardOutput | Awaitable[RewardOutput]]
# Keyword arguments every reward function receives; a dataset column may not reuse them.
RESERVED_KWARGS = ("prompts", "completions", "completion_ids", "trainer_state")


def reward_func_names(funcs: Sequence[RewardFunc]) -> list[str]:
    """Each function's ``__name__`` (through ``functools.partial``), repeats suffixed ``_2``, ``_3``."""
    names: list[str] = []
    for func in funcs:
        base = callable_name(func)
        name, count = base, 1
        while name in names:
            count += 1
            name = f"{base}_{count}"
        names.append(name)
    return names


def callable_name(func: Any) -> str:
    """A function's ``__name__`` (through ``functools.partial``), else its class's: the name errors use."""
    while isinstance(func, functools.partial):
        func = func.func
    name = getattr(func, "__name__", None)
    return name if isinstance(name, str) else type(func).__name__


def is_async_reward_func(func: Any) -> bool:
    """True for an ``async def`` function (or partial of one) or an object with an async ``__call__``."""
    if inspect.iscoroutinefunction(func):
        return True
    return callable(func) and inspect.iscoroutinefunction(type(func).__call__)


# ---------------------------------------------------------------------------- scoring


class RewardFunctionError(RuntimeError):
    """A reward function raised, returned something unusable, or did not return in time."""


ERROR_POLICIES = ("raise", "skip")


WATCH_AFTER = 60.0  # seconds a reward call runs before the watchdog says so (then again at 2x, 4x, ...)


@dataclass(frozen=True)
class CallPolicy:
    """How reward functions are called: ``timeout`` seconds per call (None: no limit), and what a
    failure does: ``raise`` (stop with :class:`RewardFunctionError`) or ``skip`` (that function's
    scores of the batch become "does not apply", counted in ``failed_counts``).

    The watchdog: without a ``timeout``, a call still running after ``watch_after`` seconds (then 2x, 4x,
    ...) is reported through ``warn`` (the console and ``warnings.log``), naming the function and
    ``reward_timeout``: a hung function never blocks a run silently, and a slow one is not cut off."""

    timeout: float | None = None
    on_error: str = "raise"
    watch_after: float | None = WATCH_AFTER
    warn: Callable[[str], None] | None = None

    def watching(self) -> bool:
        return self.timeout is None and self.watch_after is not None and self.warn is not None

    def report(self, name: str, n: int, seconds: float) -> None:
        """The watchdog's warning about ``name``, running for ``seconds`` on ``n`` completions."""
        assert self.warn is not None
        self.warn(
            f"reward function `{name}` has run for {seconds:.3g} s on a batch of {n} completions and not returned; "
            "the run waits for it. If it hangs, set reward_timeout (seconds per call) to stop such a call, and "
            "reward_error_policy='skip' to go on without its scores"
        )


@dataclass(frozen=True)
class RewardScores:
    """``values: (N, F)`` float32, NaN where function f does not apply to completion n
    (it returned ``None`` or a non-finite value, or failed under the ``skip`` policy);
    ``nonfinite_counts[f]``: how many of function f's values were nan/inf (and so turned into
    "does not apply"); ``failed_counts[f]``: completions f failed on (0 or N)."""

    values: Tensor
    nonfinite_counts: list[int]
    failed_counts: list[int]


def compute_rewards(
    funcs: Sequence[RewardFunc],
    *,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    columns: dict[str, list[Any]],
    trainer_state: Any = None,
    names: Sequence[str] | None = None,
    policy: CallPolicy = CallPolicy(),
    reward_log: RewardLog | None = None,
) -> RewardScores:
    """Call every reward function on the N completions and stack the results into ``(N, F)``.

    Sync functions run one after another, in order; then all async ones run concurrently.
    A failure (an exception, an unusable result, no result within ``policy.timeout``) raises
    :class:`RewardFunctionError` or, with ``policy.on_error == "skip"``, blanks that column.
    Functions may take TRL's ``log_extra`` and ``log_metric`` (they write to ``reward_log``).
    """
    n = len(completions)
    reward_log = reward_log if reward_log is not None else RewardLog()
    names = list(names) if names is not None else reward_func_names(funcs)
    _check_inputs(funcs, names, n, prompts, completion_ids, columns)
    kwargs = {
        "prompts": prompts,
        "completions": completions,
        "completion_ids": completion_ids,
        **columns,
        "trainer_state": trainer_state,
        "log_extra": reward_log.log_extra,
        "log_metric": reward_log.log_metric,
    }
    results: dict[int, Any] = {}
    async_positions = [i for i, f in enumerate(funcs) if is_async_reward_func(f)]
    for i, func in enumerate(funcs):
        if i not in async_positions:
            with waiting_for(f"reward function `{names[i]}` ({n} completions)"):
                results[i] = _call_sync(func, names[i], n, arguments_for(func, kwargs), policy)
    async_funcs = [funcs[i] for i in async_positions]
    watch = None
    if policy.watching():
        watch = functools.partial(policy.report, n=n)
    what = ", ".join(f"`{names[i]}`" for i in async_positions)
    with waiting_for(f"async reward functions {what} ({n} completions)"):
        gathered = run_async(
            async_funcs,
            [arguments_for(f, kwargs) for f in async_funcs],
            policy.timeout,
            watch=watch,
            names=[names[i] for i in async_positions],
            watch_after=policy.watch_after,
        )
    for i, result in zip(async_positions, gathered, strict=True):
        results[i] = _failure(names[i], n, result, policy.timeout) if isinstance(result, BaseException) else result
    columns_out, failed = [], []
    for i in range(len(funcs)):
        try:
            if isinstance(results[i], RewardFunctionError):
                raise results[i]
            columns_out.append(_to_column(results[i], names[i], n))
            failed.append(0)
        except (RewardFunctionError, ValueError):
            if policy.on_error != "skip":
                raise
            columns_out.append((torch.full((n,), math.nan), 0))
            failed.append(n)
    values = torch.stack([c for c, _ in columns_out], dim=1) if columns_out else torch.empty(n, 0)
    return RewardScores(values=values, nonfinite_counts=[count for _, count in columns_out], failed_counts=failed)


def _check_inputs(
    funcs: Sequence[RewardFunc],
    names: list[str],
    n: int,
    prompts: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    columns: dict[str, list[Any]],
) -> None:
    if len(names) != len(funcs):
        raise ValueError(f"got {len(names)} names for {len(funcs)} reward functions")
    for label, values in [("prompts", prompts), ("completion_ids", completion_ids), *columns.items()]:
        if len(values) != n:
            raise ValueError(f"`{label}` has {len(values)} values for {n} completions")
    clashes = sorted(set(columns) & set(RESERVED_KWARGS))
    if clashes:
        raise ValueError(
            f"dataset column(s) {', '.join(clashes)} clash with reward function arguments "
            f"({', '.join(RESERVED_KWARGS)}); rename them"
        )


def _failure(name: str, n: int, error: BaseException, timeout: float | None) -> RewardFunctionError:
    if isinstance(error, TimeoutError | asyncio.TimeoutError):
        return RewardFunctionError(
            f"reward function `{name}` did not return within reward_timeout={timeout} s on a batch of {n} "
            "completions; raise reward_timeout, or set reward_error_policy='skip' to score them as 'does not apply'"
        )
    hint = ""
    if isinstance(error, TypeError) and "unexpected keyword argument" in str(error):
        hint = " (check the function's parameters: it gets those it names, every one with **kwargs)"
    failure = RewardFunctionError(
        f"reward function `{name}` failed on a batch of {n} completions: {type(error).__name__}: {error}{hint}; "
        "fix the function, or set reward_error_policy='skip' to score such batches 'does not apply'"
    )
    failure.__cause__ = error  # the traceback shows where inside the function it failed
    return failure


def _call_sync(func: RewardFunc, name: str, n: int, kwargs: dict[str, Any], policy: CallPolicy) -> Any:
    """``func(**kwargs)``, or the :class:`RewardFunctionError` it failed with (returned, not raised)."""
    timeout = policy.timeout

    def call() -> Any:
        result = func(**kwargs)
        # A plain function may still hand back an awaitable (e.g. a lambda around a coroutine).
        if inspect.isawaitable(result):
            awaitable = result
            (result,) = run_async([lambda: awaitable], [{}], None)
            if isinstance(result, BaseException):
                raise result
        return result

    try:
        if timeout is not None:
            return with_timeout(call, timeout)
        if policy.watching():
            assert policy.watch_after is not None
            return watched(call, policy.watch_after, lambda seconds: policy.report(name, n, seconds))
        return call()
    except Exception as error:
        return _failure(name, n, error, timeout)


def _to_column(result: Any, name: str, n: int) -> tuple[Tensor, int]:
    """One function's result as an ``(N,)`` float32 column (NaN = does not apply) and its nan/inf count."""
    values = _as_list_of_values(result, name)
    if len(values) != n:
        raise ValueError(f"reward function `{name}` returned {len(values)} values for {n} completions")
    floats = [_as_float(v, name, row) for row, v in enumerate(values)]
    column = torch.tensor(floats, dtype=torch.float32)
    given = torch.tensor([v is not None for v in values], dtype=torch.bool)
    nonfinite = given & ~torch.isfinite(column)  # float32 overflow counts as inf too
    column[nonfinite] = math.nan
    return column, int(nonfinite.sum())


def _as_list_of_values(result: Any, name: str) -> list[Any]:
    if isinstance(result, Tensor | np.ndarray):
        if result.ndim != 1:
            raise ValueError(
                f"reward function `{name}` returned an array of shape {tuple(result.shape)}; "
                "return one value per completion (a list or a 1-D tensor)"
            )
        return list(result.tolist())
    if isinstance(result, list | tuple):
        return list(result)
    raise ValueError(
        f"reward function `{name}` returned a {type(result).__name__}; return a list with one "
        "float (or None) per completion"
    )


def _as_float(value: Any, name: str, row: int) -> float:
    if value is None:
        return math.nan
    if isinstance(value, Tensor | np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, numbers.Real):
        return float(value)
    raise ValueError(
        f"reward function `{name}` returned {value!r} ({type(value).__name__}) at row {row}; "
        "expected a real number, or None where it does not apply"
    )


@dataclass(frozen=True)
class CombinedRewards:
    """The scores of N completions, combined with the reward weights.

    ``scores``: every function's values ``(N, F)``; ``rewards``: ``(N,)`` the weighted sum over
    the functions that apply (:func:`rloo.algo.advantages.combine_rewards`), 0.0 where none
    does; ``scorable``: ``(N,)`` bool, some function applies.
    """

    scores: RewardScores
    rewards: Tensor
    scorable: Tensor
    log: RewardLog = field(default_factory=RewardLog)  # what the functions logged

    def rewards_or_nan(self) -> Tensor:
        """``(N,)`` combined rewards with NaN where no function applies."""
        return torch.where(self.scorable, self.rewards, torch.nan)


class RewardFunctions:
    """A run's reward functions, their metric names and weights: the one place scores are combined.

    Training, ``RLOOTrainer.evaluate``, ``rloo eval`` and the demo all score through
    :meth:`score`, so the same functions and weights give the same rewards everywhere.
    """

    def __init__(
        self, funcs: Sequence[RewardFunc], weights: Sequence[float] | None = None, policy: CallPolicy = CallPolicy()
    ) -> None:
        if not funcs:
            raise ValueError("give at least one reward function")
        weights = list(weights) if weights is not None else [1.0] * len(funcs)
        if len(weights) != len(funcs):
            raise ValueError(
                f"RLOOConfig.reward_weights has {len(weights)} entries but there are {len(funcs)} reward "
                "functions; give one weight per function"
            )
        self.funcs = list(funcs)
        self.names = reward_func_names(self.funcs)
        self.weights = torch.tensor(weights, dtype=torch.float32)
        self.policy = policy
        self.warned_unscorable = False  # the first completion no function applies to is named once a run

    def check_arguments(self, columns: Sequence[str]) -> None:
        """Refuse a function that requires an argument neither a column nor a standard one."""
        check_reward_arguments(self.funcs, self.names, columns)

    def to(self, device: torch.device | str) -> RewardFunctions:
        """Move the reward models among the functions to ``device``."""
        for func in self.funcs:
            if hasattr(func, "to"):
                func.to(device)
        return self

    def score(
        self,
        *,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]],
        columns: dict[str, list[Any]],
        trainer_state: Any = None,
    ) -> CombinedRewards:
        """Call every function on the N completions and combine their scores with the weights."""
        reward_log = RewardLog()
        scores = compute_rewards(
            self.funcs,
            prompts=prompts,
            completions=completions,
            completion_ids=completion_ids,
            columns=columns,
            trainer_state=trainer_state,
            names=self.names,
            policy=self.policy,
            reward_log=reward_log,
        )
        rewards, scorable = combine_rewards(scores.values, self.weights)
        return CombinedRewards(scores, rewards, scorable, reward_log)

    def warn_unscorable(self, scorable: Tensor, prompts: Sequence[Any], k: int) -> None:
        """Through the policy's ``warn``, once: the first completion every function returned None for
        (TRL warns too), by its prompt's place in the batch (``prompts``: P, each with ``k`` consecutive rows)."""
        # once warned, nothing more is read; before, one read a batch of this CPU tensor (no device sync)
        if self.warned_unscorable or self.policy.warn is None or bool(scorable.all()):
            return
        missing = (~scorable).nonzero().flatten().tolist()
        self.warned_unscorable = True
        self.policy.warn(unscorable_message(missing, prompts, k))


def unscorable_message(missing: Sequence[int], prompts: Sequence[Any], k: int) -> str:
    """What an unscorable completion means and what to do, naming the first of ``missing`` (row indices)."""
    row = missing[0]
    prompt = str(prompts[row // k])
    shown = prompt if len(prompt) <= 80 else prompt[:77] + "..."
    more = f" (and {len(missing) - 1} more in this batch)" if len(missing) > 1 else ""
    return (
        f"every reward function returned None for completion {row % k} of prompt {row // k} of the batch "
        f"({shown!r}){more}: such a completion has no reward, is left out of its group's baseline and gets "
        "advantage 0, so it teaches nothing. None means 'does not apply': make at least one reward function "
        "return a number for every completion (e.g. 0.0 for a wrong format rather than None). Said once; "
        "rewards/unscorable counts them in every batch"
    )


def as_completions(texts: list[str], conversational: bool) -> list[Any]:
    """What reward functions receive: the texts, or for conversational prompts one assistant
    message per completion (``[{"role": "assistant", "content": text}]``), as in TRL."""
    return [[{"role": "assistant", "content": t}] for t in texts] if conversational else list(texts)
