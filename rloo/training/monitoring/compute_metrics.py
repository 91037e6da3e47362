"""The ``compute_metrics`` hook: task metrics (exact match, F1, ...) on the evaluation completions.

transformers' Trainer and TRL's DPO/SFT trainers take ``compute_metrics(EvalPrediction) -> dict``.
TRL's GRPOTrainer has none today: its first version passed one to transformers' Trainer, which never
called it (GRPO's ``prediction_step`` returns no predictions), and TRL #2606 removed it; trl#2959 asks
for it back. rloo's follows the interface the pull requests there propose: an ``EvalPrediction`` whose
``predictions`` are the N evaluation completions and whose ``label_ids`` are the ``(N, F)`` reward
scores; :class:`EvalCompletions` adds, by name, the prompts and dataset columns (the reference answers)
reward functions get.

Called once per evaluation (per named eval set), after every process's completions are gathered: the
main process calls it and shares its metrics with the others (transformers calls it on every process
with the gathered predictions; one call means a hook that writes a file or calls a service does it
once, and every process logs the same numbers). A returned key gets the prefix (``eval_``, or
``eval_<set>_``) unless it has it, as in transformers, so ``metric_for_best_model`` can name it.

Where we depart from transformers: what it returns is checked (a dict of finite real numbers, none
replacing one of evaluation's own metrics), and a failure names the hook, as reward functions' do
(:mod:`rloo.rewards.calling`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import EvalPrediction

from rloo.data.prompts import repeat_per_completion
from rloo.pipeline import ScoredRollout
from rloo.rewards.calling import callable_name
from rloo.rewards.resolve import import_callable

ComputeMetrics = Callable[[EvalPrediction], Mapping[str, Any]]


class ComputeMetricsError(RuntimeError):
    """``compute_metrics`` raised, or returned something that is not a dict of finite numbers."""


class EvalCompletions(EvalPrediction):
    """What ``compute_metrics`` receives: one evaluation's N = P x K completions (a prompt's K consecutive).

    As transformers' ``EvalPrediction``: ``predictions``: the N completions, as reward functions get them
    (text, or ``[{"role": "assistant", "content": ...}]`` for conversational prompts); ``label_ids``:
    ``(N, F)`` float32 array, reward function f's score of completion n, NaN where it does not apply.
    ``inputs`` and ``losses`` are None, so ``predictions, label_ids = eval_pred`` unpacks.

    By name: ``completions`` (= ``predictions``); ``prompts``: each completion's dataset prompt (N);
    ``columns``: every other dataset column, one value per completion (``columns["answer"]``);
    ``scores`` (= ``label_ids``) and ``reward_names`` (F); ``rewards``: ``(N,)`` the weighted combination,
    NaN where no function applies; ``num_generations``: K (rows ``i*K .. i*K + K - 1`` are prompt i's);
    ``metric_key_prefix``: ``eval``, or ``eval_<set>`` for a named eval set.
    """

    def __init__(
        self,
        *,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        columns: Mapping[str, Sequence[Any]],
        scores: np.ndarray,
        rewards: np.ndarray,
        reward_names: Sequence[str],
        num_generations: int,
        metric_key_prefix: str = "eval",
    ) -> None:
        n = len(completions)
        sizes = {"prompts": len(prompts), "scores": len(scores), "rewards": len(rewards)}
        sizes |= {f"columns[{name!r}]": len(values) for name, values in columns.items()}
        wrong = {key: size for key, size in sizes.items() if size != n}
        if wrong or scores.shape[1:] != (len(reward_names),):
            raise ValueError(f"{n} completions with {sizes}, scores {scores.shape}, {len(reward_names)} reward names")
        # a list, not an array: completions are texts or messages, as in the TRL pull requests
        super().__init__(predictions=list(completions), label_ids=scores)  # type: ignore[arg-type]
        self.completions, self.prompts, self.columns = list(completions), list(prompts), dict(columns)
        self.scores, self.rewards, self.reward_names = scores, rewards, list(reward_names)
        self.num_generations, self.metric_key_prefix = num_generations, metric_key_prefix

    @classmethod
    def from_values(
        cls, records: Sequence[EvalRecords], values: torch.Tensor, reward_names: Sequence[str], k: int, prefix: str
    ) -> EvalCompletions:
        """Joined from eval batches' ``records`` (in batch order) and their ``values``: ``(N, 1 + F[+1])``
        rows of :func:`rloo.training.metrics.eval_metrics` (the combined reward, each function's scores)."""
        names = list(records[0].columns) if records else []
        array = values.float().numpy()
        return cls(
            prompts=[prompt for part in records for prompt in part.prompts],
            completions=[completion for part in records for completion in part.completions],
            columns={name: [value for part in records for value in part.columns[name]] for name in names},
            scores=array[:, 1 : 1 + len(reward_names)].astype(np.float32),
            rewards=array[:, 0].astype(np.float32),
            reward_names=reward_names,
            num_generations=k,
            metric_key_prefix=prefix,
        )


@dataclass(frozen=True)
class EvalRecords:
    """One eval batch's completions with their prompts and columns (N each): gathered from every process."""

    prompts: list[Any]
    completions: list[Any]
    columns: dict[str, list[Any]]

    @classmethod
    def from_scored(cls, scored: ScoredRollout, columns: Mapping[str, Sequence[Any]]) -> EvalRecords:
        """The batch's completions as reward functions got them, each with its dataset prompt and the
        dataset ``columns`` (one value per prompt), repeated for each of a prompt's K completions."""
        k = len(scored.completion_texts) // len(scored.prompts)
        per_completion = {name: repeat_per_completion(values, k) for name, values in columns.items()}
        return cls(repeat_per_completion(scored.prompts, k), scored.reward_completions(), per_completion)


def resolve_compute_metrics(spec: Any) -> ComputeMetrics | None:
    """``compute_metrics`` as given: None, a callable, or a ``package.module:function`` string (run files)."""
    if spec is None or callable(spec):
        return spec  # type: ignore[no-any-return]
    if isinstance(spec, str):
        return import_callable(spec, what="compute_metrics")  # type: ignore[no-any-return]
    raise ValueError(
        f"compute_metrics is a {type(spec).__name__} ({spec!r}); give a function that takes an EvalPrediction "
        "and returns a dict of metrics, or its import string 'package.module:function'"
    )


def call_compute_metrics(
    hook: ComputeMetrics, completions: EvalCompletions, prefix: str | None, logged: Collection[str] = ()
) -> dict[str, float]:
    """``hook(completions)``, checked (:func:`checked_metrics`); a failure inside it is re-raised as a
    :class:`ComputeMetricsError` naming it and the evaluation, with the original as its cause."""
    name = callable_name(hook)
    try:
        result = hook(completions)
    except Exception as error:
        n, k = len(completions.completions), completions.num_generations
        raise ComputeMetricsError(
            f"compute_metrics `{name}` failed on the {n} completions of {completions.metric_key_prefix!r} "
            f"({n // k} prompts x {k}): {type(error).__name__}: {error}; fix the function (it gets one "
            "EvalPrediction: predictions = the completions, label_ids = the reward scores, and by name "
            "prompts, completions, columns, rewards)"
        ) from error
    return checked_metrics(result, name, prefix, logged)


def checked_metrics(result: Any, name: str, prefix: str | None, logged: Collection[str] = ()) -> dict[str, float]:
    """``{prefix_key: float}`` of what ``compute_metrics`` ``name`` returned: a key without ``<prefix>_`` gets
    it (``prefix`` None: keys as given). Refused with a :class:`ComputeMetricsError` naming the hook and the
    key: not a mapping, a key that is not a string, a value that is not a real number (a 0-d array or tensor
    counts), NaN or inf, a key that would replace one of ``logged`` (evaluation's own) or another key."""
    where = f"compute_metrics `{name}`"
    if not isinstance(result, Mapping):
        raise ComputeMetricsError(
            f"{where} returned a {type(result).__name__}; return a dict of metric name -> number, "
            "e.g. {'accuracy': 0.75}"
        )
    metrics: dict[str, float] = {}
    for key, value in result.items():
        if not isinstance(key, str):
            raise ComputeMetricsError(f"{where} returned the key {key!r} ({type(key).__name__}); name metrics by str")
        number = _real(value)
        if number is None:
            raise ComputeMetricsError(
                f"{where} returned {key!r}: {value!r} ({type(value).__name__}); give each metric one real number "
                "(float, int, or a 0-d array or tensor)"
            )
        if not math.isfinite(number):
            raise ComputeMetricsError(
                f"{where} returned {key!r}: {number}; metrics must be finite: leave a metric out when this "
                "evaluation has no value for it"
            )
        full = key if prefix is None or key.startswith(f"{prefix}_") else f"{prefix}_{key}"
        if full in logged or full in metrics:
            theirs = "evaluation's own" if full in logged else "another key's"
            raise ComputeMetricsError(f"{where} returned {key!r}, logged as {full!r}, {theirs} name; rename it")
        metrics[full] = number
    return metrics


def _real(value: Any) -> float | None:
    """``value`` as a float if it is one real number (a 0-d array or tensor too), else None."""
    if isinstance(value, torch.Tensor | np.ndarray) and value.ndim == 0:
        value = value.item()
    return float(value) if isinstance(value, numbers.Real) else None
