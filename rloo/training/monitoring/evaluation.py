"""``RLOOTrainer.evaluate``: K sampled completions per eval prompt, scored as training scores them.

An evaluation draws ``num_generations_eval`` (else ``num_generations``) completions of every eval prompt
with the run's sampling settings, in batches of ``eval_prompts_per_batch`` prompts spread over the
processes (:meth:`rloo.training.parallel.distributed.Ranks.map_batches`), and reports the rewards,
pass@k and ``eval_loss`` (:func:`rloo.training.metrics.eval_metrics`), then the user's task metrics
(``compute_metrics``: :mod:`rloo.training.monitoring.compute_metrics`) on every process's completions.
It has its own sampling seed (:func:`rloo.training.parallel.distributed.eval_seed`) and group ids, so it
leaves the trainer state, and so the run, alone; each completion is seeded on its own, so any number of
processes and any batch size give the same numbers.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rloo.data.loading import eval_rows
from rloo.data.prompts import columns_of
from rloo.pipeline import RolloutSettings, ScoredRollout
from rloo.training.metrics import eval_metrics
from rloo.training.monitoring.compute_metrics import (
    ComputeMetrics,
    EvalCompletions,
    EvalRecords,
    call_compute_metrics,
)
from rloo.training.parallel.distributed import Ranks, eval_seed


@dataclass(frozen=True)
class Evaluation:
    """What an evaluation needs of the trainer. ``scored_rollout(rows, group_ids, sampling_seed=, settings=)``:
    phases 1-2 on dataset rows; ``eval_loss``: TRL's loss of one scored eval batch
    (:meth:`rloo.training.experience.ExperienceMaker.eval_loss`); ``settings``: the run's rollout settings."""

    args: Any  # the run's RLOOConfig: seed, num_generations(_eval), eval_prompts_per_batch
    ranks: Ranks
    reward_names: Sequence[str]
    settings: RolloutSettings
    scored_rollout: Callable[..., ScoredRollout]
    eval_loss: Callable[[ScoredRollout], float]

    def run(self, data: Any, prefix: str = "eval", compute_metrics: ComputeMetrics | None = None) -> dict[str, float]:
        """The ``<prefix>_`` metrics of eval set ``data`` (``<prefix>_<name>_`` for each of a dict of named
        sets; a streaming set is read to its end): the reward metrics, then ``compute_metrics``' (called once
        per set, by the main process, on every process's completions)."""
        if data is None:
            raise ValueError("evaluate() needs an eval_dataset: pass one to the trainer or to evaluate()")
        if isinstance(data, dict):
            named = [self.run(sub, f"{prefix}_{name}", compute_metrics) for name, sub in data.items()]
            return {key: value for metrics in named for key, value in metrics.items()}
        dataset, k = eval_rows(data), self.args.num_generations_eval or self.args.num_generations
        settings = dataclasses.replace(self.settings, num_generations=k)
        keep = compute_metrics is not None  # the completions' texts travel only for the hook

        def score(indices: list[int], batch: int) -> tuple[Tensor, EvalRecords | None]:
            groups, rows = range(indices[0], indices[-1] + 1), [dataset[i] for i in indices]
            scored = self.scored_rollout(rows, groups, sampling_seed=eval_seed(self.args.seed), settings=settings)
            records = EvalRecords.from_scored(scored, columns_of(rows)) if keep else None
            return eval_values(scored, self.eval_loss(scored)), records

        shares = self.ranks.map_batches(score, len(dataset), self.args.eval_prompts_per_batch)
        values = torch.cat([part for part, _ in shares])
        metrics = eval_metrics(values, self.reward_names, prefix, k)
        if compute_metrics is None:
            return metrics
        records = [part for _, part in shares if part is not None]
        completions = EvalCompletions.from_values(records, values, self.reward_names, k, prefix)
        # the main process calls it on every process's completions; its error is raised on every process
        call = functools.partial(call_compute_metrics, compute_metrics, completions, prefix, metrics)
        return metrics | self.ranks.on_main(call)


def eval_values(scored: ScoredRollout, loss: float) -> Tensor:
    """``(N, 2 + F)`` on the CPU: each completion's combined reward (NaN where unscorable), each function's
    score, and the loss of its batch: the rows :func:`rloo.training.metrics.eval_metrics` reads."""
    combined = scored.rewards.rewards_or_nan().unsqueeze(1)
    losses = combined.new_full(combined.shape, loss)  # the batch's, per row
    return torch.cat([combined, scored.rewards.scores.values.to(combined), losses], dim=1).cpu()
