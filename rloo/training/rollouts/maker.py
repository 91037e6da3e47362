"""Phases 1-2 for dataset rows: :class:`RolloutMaker`, the run's policy sampling K completions per prompt and
its reward functions scoring them.

One object, built once by the trainer and handed to the rollout source and to the evaluation, so neither
calls back into the trainer for a batch: what it needs of the run (the policy, whose weights change; the trainer
state, which a resume replaces) it reads through getters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from torch import nn

from rloo.data.prompts import columns_of
from rloo.pipeline import RolloutSettings, SampledBatch, ScoredRollout, generate_and_score
from rloo.rewards.calling import RewardFunctions


@dataclass(frozen=True)
class RolloutMaker:
    """``maker(rows, group_ids, sampling_seed)``: the scored rollouts of dataset ``rows``
    (:func:`rloo.pipeline.generate_and_score`), with the run's settings, policy and precision."""

    policy: Callable[[], nn.Module]  # the current policy (unwrapped)
    processing_class: Any
    rewards: RewardFunctions
    settings: RolloutSettings
    trainer_state: Callable[[], Any]  # what reward functions get as ``trainer_state``
    autocast: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
    all_done: Callable[[bool], bool] | None = None  # lockstep decoding (FSDP): has every process finished

    def __call__(
        self,
        rows: list[dict[str, Any]],
        group_ids: Sequence[int],
        sampling_seed: int,
        settings: RolloutSettings | None = None,
        model: nn.Module | None = None,
        sampled: tuple[SampledBatch, float] | None = None,
    ) -> ScoredRollout:
        """``settings``: the run's by default (evaluation's K differs); ``model``: the policy by default (a
        stale copy samples for a pipelined source); ``sampled``: a rollout worker's batch, only scored here."""
        return generate_and_score(
            self.policy() if model is None else model,
            self.processing_class,
            [row["prompt"] for row in rows],
            columns_of(rows),
            self.rewards,
            settings or self.settings,
            group_ids=group_ids,
            sampling_seed=sampling_seed,
            trainer_state=self.trainer_state(),
            autocast=self.autocast,
            all_done=self.all_done,
            sampled=sampled,
        )
