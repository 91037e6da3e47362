"""Where the trainer's rollouts come from: one object, asked for the next generation batch.

The trainer obtains every batch of scored groups it trains on from a :class:`RolloutSource`, and
tells it each time the policy's weights change. The interface is shaped by the sources to come
(read from TRL 1.18's async GRPO rollout worker, verl's agent loop and AReaL's rollout workflow):
a multi-turn episode runner (a different way to produce the same scored groups), an asynchronous
worker (batches sampled by an older policy: the version says by how much) and a generation server
(weights pushed on :meth:`RolloutSource.policy_updated`). Only the synchronous source exists
today: :class:`SynchronousRollouts`, the KV-cached sampler and the reward functions, run by the
trainer's own process between optimizer steps.

Every batch carries the version of the policy weights that sampled it: the number of optimizer
steps taken before sampling (:attr:`rloo.pipeline.ScoredRollout.policy_version`). The trainer
logs it and checks it: in the synchronous loop it always equals the step being trained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rloo.pipeline import ScoredRollout
from rloo.training.parallel.distributed import Ranks


class RolloutSource(Protocol):
    """A source of scored groups (K completions of each prompt, scored, a group's rows consecutive)."""

    groups_drawn: int  # prompts drawn so far by every process (the trainer checkpoints it)

    def next_batch(self) -> ScoredRollout:
        """This process's share of the next generation batch, stamped with its policy version."""
        ...

    def policy_updated(self, version: int) -> None:
        """The policy's weights are now those after ``version`` optimizer steps."""
        ...


class SynchronousRollouts:
    """Samples each batch with the current policy, in the trainer's process, when asked.

    ``prompts``: the prompt order (``next_rows(n)``); ``generate(rows, group_ids)``: phases 1-2
    (sample and score) for dataset rows; every process draws the same global batch of
    ``prompts_per_batch * world_size`` prompts and keeps its share, whole groups each.
    """

    def __init__(
        self,
        *,
        prompts: Any,
        generate: Callable[[list[dict[str, Any]], Sequence[int]], ScoredRollout],
        ranks: Ranks,
        prompts_per_batch: int,
        groups_drawn: int = 0,
        policy_version: int = 0,
    ) -> None:
        self.prompts, self.generate, self.ranks = prompts, generate, ranks
        self.prompts_per_batch = prompts_per_batch
        self.groups_drawn, self.policy_version = groups_drawn, policy_version

    def next_batch(self) -> ScoredRollout:
        world = self.prompts.next_rows(self.prompts_per_batch * self.ranks.world_size)
        rows, first = self.ranks.shard(world), self.groups_drawn + self.ranks.rank * self.prompts_per_batch
        self.groups_drawn += len(world)
        scored = self.generate(rows, range(first, first + len(rows)))
        return dataclasses.replace(scored, policy_version=self.policy_version)

    def policy_updated(self, version: int) -> None:
        self.policy_version = version


def check_policy_version(scored: ScoredRollout, step: int) -> None:
    """A synchronous batch must have been sampled by the policy being trained (``step`` optimizer
    steps taken): anything else is a weight update the sampler missed."""
    if scored.policy_version != step:
        raise RuntimeError(
            f"the rollouts trained at step {step} were sampled by the policy of step {scored.policy_version}: "
            "the rollout source missed a weight update (RolloutSource.policy_updated)"
        )
