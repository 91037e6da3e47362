"""Rewards out: reward functions and reward models -> one ``(N, F)`` score tensor.

Reward functions follow TRL's convention: they are called with keyword arguments
``prompts``, ``completions``, ``completion_ids``, every extra dataset column by name and
``trainer_state``, and return one float (or ``None``: "does not apply") per completion.
A reward model (``AutoModelForSequenceClassification`` with one label) is wrapped in
:class:`RewardModelScorer` so it is just another reward function.

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
import concurrent.futures
import functools
import inspect
import math
import numbers
import os
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

RewardOutput = Sequence[float | None] | Tensor | np.ndarray
RewardFunc = Callable[..., RewardOutput | Awaitable[RewardOutput]]
# Keyword arguments every reward function receives; a dataset column may not reuse them.
RESERVED_KWARGS = ("prompts", "completions", "completion_ids", "trainer_state")


# ---------------------------------------------------------------------------- reward models


class RewardModelScorer:
    """A sequence-classification reward model as a TRL-style reward function.

    Scores ``prompt + completion`` and returns ``logits[:, 0]``. Conversational samples are
    rendered with the tokenizer's chat template (prompt messages + completion messages), or
    their contents joined by newlines when it has none. As in TRL, texts are tokenized with
    ``add_special_tokens=False`` by default and right padding.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        batch_size: int | None = None,
        add_special_tokens: bool = False,
    ) -> None:
        if isinstance(model, str | os.PathLike):
            model, tokenizer = _load_reward_model(os.fspath(model), tokenizer)
        if tokenizer is None:
            raise ValueError("a reward model instance needs its tokenizer: pass `tokenizer=`")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {batch_size}")
        self.model = model
        self.model.requires_grad_(False)
        torch.nn.Module.eval(self.model)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.add_special_tokens = add_special_tokens
        _ensure_pad_token(self.model, self.tokenizer)
        name = str(getattr(self.model.config, "_name_or_path", "") or "").rstrip("/\\")
        self.__name__ = os.path.basename(name) or type(self.model).__name__

    def to(self, device: str | torch.device) -> RewardModelScorer:
        torch.nn.Module.to(self.model, device)
        return self

    def texts(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[str]:
        """The strings the reward model scores, one per completion."""
        return [self._text(p, c) for p, c in zip(prompts, completions, strict=True)]

    def _text(self, prompt: Any, completion: Any) -> str:
        if isinstance(prompt, str):
            return prompt + str(completion)
        messages = [*prompt, *completion]
        if getattr(self.tokenizer, "chat_template", None) is None:
            return "\n".join(m["content"] for m in messages)
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False))

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        texts = self.texts(prompts, completions)
        step = self.batch_size or max(len(texts), 1)
        scores: list[float] = []
        for start in range(0, len(texts), step):
            scores.extend(self._score(texts[start : start + step]))
        return scores

    def _score(self, texts: list[str]) -> list[float]:
        inputs = self.tokenizer(
            texts,
            return_tensors="pt",
            padding=True,
            padding_side="right",
            add_special_tokens=self.add_special_tokens,
        ).to(self.model.device)
        with torch.inference_mode():
            logits = self.model(**inputs).logits
        return [float(x) for x in logits[:, 0].float().tolist()]


def _load_reward_model(
    path: str, tokenizer: PreTrainedTokenizerBase | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, trust_remote_code=False)
    return model, tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)


def _ensure_pad_token(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Batched scoring needs a pad token; fall back to EOS, as TRL does."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the reward tokenizer has neither a pad token nor an eos token; set `pad_token`")
        tokenizer.pad_token = tokenizer.eos_token
    # Sequence classification finds each row's last token from config.pad_token_id.
    model.config.pad_token_id = tokenizer.pad_token_id


# ---------------------------------------------------------------------------- loading


def load_reward_funcs(
    reward_funcs: Any,
    reward_processing_classes: Any = None,
) -> list[RewardFunc]:
    """Turn TRL-style ``reward_funcs`` into a list of callables.

    Each item is a callable (sync or ``async def``), a path / hub id of a reward model, or a
    ``PreTrainedModel`` whose tokenizer is at the same position in
    ``reward_processing_classes`` (a single item or a list; ``None`` entries are allowed for
    callables and paths).
    """
    funcs = reward_funcs if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    if not funcs:
        raise ValueError("give at least one reward function")
    tokenizers = _as_list(reward_processing_classes, len(funcs))
    return [_load_one(i, func, tok) for i, (func, tok) in enumerate(zip(funcs, tokenizers, strict=True))]


def _as_list(reward_processing_classes: Any, n: int) -> list[Any]:
    if reward_processing_classes is None:
        return [None] * n
    items = (
        list(reward_processing_classes)
        if isinstance(reward_processing_classes, list | tuple)
        else [reward_processing_classes]
    )
    if len(items) != n:
        raise ValueError(
            f"reward_processing_classes has {len(items)} entries for {n} reward functions; "
            "give one per reward function (None where not needed)"
        )
    return items


def _load_one(position: int, func: Any, tokenizer: Any) -> RewardFunc:
    # A PreTrainedModel is callable too, so it is checked first.
    if isinstance(func, PreTrainedModel):
        if tokenizer is None:
            raise ValueError(
                f"reward function {position} is a {type(func).__name__} instance; pass its tokenizer "
                f"in reward_processing_classes at position {position}"
            )
        return RewardModelScorer(func, tokenizer)
    if isinstance(func, str | os.PathLike):
        return RewardModelScorer(func, tokenizer)
    if callable(func):
        return func  # type: ignore[no-any-return]
    raise ValueError(
        f"reward function {position} is a {type(func).__name__}; give a callable, a reward model "
        "path or hub id, or a PreTrainedModel"
    )


def reward_func_names(funcs: Sequence[RewardFunc]) -> list[str]:
    """Each function's ``__name__`` (through ``functools.partial``), repeats suffixed ``_2``, ``_3``."""
    names: list[str] = []
    for func in funcs:
        base = _func_name(func)
        name, count = base, 1
        while name in names:
            count += 1
            name = f"{base}_{count}"
        names.append(name)
    return names


def _func_name(func: Any) -> str:
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


@dataclass(frozen=True)
class RewardScores:
    """``values: (N, F)`` float32, NaN where function f does not apply to completion n
    (it returned ``None`` or a non-finite value); ``nonfinite_counts[f]``: how many of
    function f's values were nan/inf (and so turned into "does not apply")."""

    values: Tensor
    nonfinite_counts: list[int]


def compute_rewards(
    funcs: Sequence[RewardFunc],
    *,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    columns: dict[str, list[Any]],
    trainer_state: Any = None,
    names: Sequence[str] | None = None,
) -> RewardScores:
    """Call every reward function on the N completions and stack the results into ``(N, F)``.

    Sync functions run one after another, in order; then all async ones run concurrently.
    """
    n = len(completions)
    names = list(names) if names is not None else reward_func_names(funcs)
    _check_inputs(funcs, names, n, prompts, completion_ids, columns)
    kwargs = {
        "prompts": prompts,
        "completions": completions,
        "completion_ids": completion_ids,
        **columns,
        "trainer_state": trainer_state,
    }
    results: dict[int, Any] = {}
    async_positions = [i for i, f in enumerate(funcs) if is_async_reward_func(f)]
    for i, func in enumerate(funcs):
        if i not in async_positions:
            results[i] = _call_sync(func, names[i], n, kwargs)
    gathered = _run_async([funcs[i] for i in async_positions], kwargs)
    for i, result in zip(async_positions, gathered, strict=True):
        if isinstance(result, BaseException):
            raise _failure(names[i], n, result) from result
        results[i] = result
    columns_out = [_to_column(results[i], names[i], n) for i in range(len(funcs))]
    values = torch.stack([c for c, _ in columns_out], dim=1) if columns_out else torch.empty(n, 0)
    return RewardScores(values=values, nonfinite_counts=[count for _, count in columns_out])


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


def _failure(name: str, n: int, error: BaseException) -> RuntimeError:
    hint = ""
    if isinstance(error, TypeError) and "unexpected keyword argument" in str(error):
        hint = " (reward functions are called with every dataset column; accept them with **kwargs)"
    return RuntimeError(
        f"reward function `{name}` failed on a batch of {n} completions: {type(error).__name__}: {error}{hint}"
    )


def _call_sync(func: RewardFunc, name: str, n: int, kwargs: dict[str, Any]) -> Any:
    try:
        result = func(**kwargs)
        # A plain function may still hand back an awaitable (e.g. a lambda around a coroutine).
        if inspect.isawaitable(result):
            awaitable = result
            (result,) = _run_async([lambda: awaitable], {})
            if isinstance(result, BaseException):
                raise result
    except Exception as error:
        raise _failure(name, n, error) from error
    return result


def _run_async(funcs: Sequence[Callable[..., Any]], kwargs: dict[str, Any]) -> list[Any]:
    """Await all ``funcs(**kwargs)`` together in one event loop; exceptions are returned, not raised."""
    if not funcs:
        return []

    async def call(func: Callable[..., Any]) -> Any:
        # Called inside the coroutine so a bad signature is caught per function, too.
        return await func(**kwargs)

    async def gather() -> list[Any]:
        return await asyncio.gather(*(call(f) for f in funcs), return_exceptions=True)

    return _run_coroutine(gather)


def _run_coroutine(make: Callable[[], Coroutine[Any, Any, list[Any]]]) -> list[Any]:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    # This thread's loop is blocked by our synchronous caller, so use a fresh thread and loop.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


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


def as_completions(texts: list[str], conversational: bool) -> list[Any]:
    """What reward functions receive: the texts, or for conversational prompts one assistant
    message per completion (``[{"role": "assistant", "content": text}]``), as in TRL."""
    return [[{"role": "assistant", "content": t}] for t in texts] if conversational else list(texts)
