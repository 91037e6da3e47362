"""Where the trainer's rollouts come from: one object, asked for the next generation batch.

The trainer obtains every batch of scored groups it trains on from a :class:`RolloutSource`, and
tells it each time the policy's weights change. The interface is shaped by the sources to come
(read from TRL 1.18's async GRPO rollout worker, verl's agent loop and AReaL's rollout workflow):
a multi-turn episode runner (a different way to produce the same scored groups), an asynchronous
worker (batches sampled by an older policy: the version says by how much) and a generation server
(weights pushed on :meth:`RolloutSource.policy_updated`). Two exist: :class:`SynchronousRollouts`,
the KV-cached sampler (or vLLM, or multi-turn episodes) and the reward functions, run by the trainer's
own process between optimizer steps with the current weights; and :class:`PipelinedRollouts`
(``max_staleness`` = s >= 1), the same with the weights of s optimizer steps before.

Every batch carries the version of the policy weights that sampled it: the number of optimizer
steps taken before sampling (:attr:`rloo.pipeline.ScoredRollout.policy_version`). The trainer
logs it and checks it: it always equals ``max(0, step - max_staleness)`` for the step being trained.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from rloo.pipeline import ScoredRollout
from rloo.training.parallel.distributed import Ranks
from rloo.training.rollouts.versions import sampling_version, trainable_weights

# the rollout source's entry in a checkpoint's training state (named when only the pipelined source had one)
ROLLOUTS_KEY = "pipelined_rollouts"


class RolloutSource(Protocol):
    """A source of scored groups (K completions of each prompt, scored, a group's rows consecutive)."""

    groups_drawn: int  # prompts drawn so far by every process (the trainer checkpoints it)

    def next_batch(self) -> ScoredRollout:
        """This process's share of the next generation batch, stamped with its policy version."""
        ...

    def policy_updated(self, version: int) -> None:
        """The policy's weights are now those after ``version`` optimizer steps."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint needs to resume this source exactly."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        """Resume from a checkpoint's :meth:`state`."""
        ...

    def close(self) -> None:
        """Release what it holds (a worker process) at the end of ``train()``."""
        ...

    def metrics(self) -> dict[str, float]:
        """The last batch's metrics of the source itself (a worker's waits and checks), logged with the step's."""
        ...


class SynchronousRollouts:
    """Samples each batch with the current policy, in the trainer's process, when asked.

    ``prompts``: the prompt order (``next_rows(n)``); ``generate(rows, group_ids, model=, sampled=)``: phases
    1-2 (sample and score) for dataset rows, with ``model`` (None: the policy), or only score the ``sampled``
    batch (a rollout worker's ``(SampledBatch, seconds)``); every process draws the same
    global batch of ``prompts_per_batch * world_size`` prompts and keeps its share, whole groups each.
    """

    def __init__(
        self,
        *,
        prompts: Any,
        generate: Callable[..., ScoredRollout],
        ranks: Ranks,
        prompts_per_batch: int,
        groups_drawn: int = 0,
        policy_version: int = 0,
    ) -> None:
        self.prompts, self.generate, self.ranks = prompts, generate, ranks
        self.prompts_per_batch = prompts_per_batch
        self.groups_drawn, self.policy_version = groups_drawn, policy_version

    def next_batch(self) -> ScoredRollout:
        rows, groups = self.draw()
        version, model = self.sampling_weights()
        scored = self.generate(rows, groups, model=model)
        return dataclasses.replace(scored, policy_version=version)

    def draw(self) -> tuple[list[dict[str, Any]], list[int]]:
        """This process's share of the next global batch of prompts, and its group ids."""
        world = self.prompts.next_rows(self.prompts_per_batch * self.ranks.world_size)
        rows, first = self.ranks.shard(world), self.groups_drawn + self.ranks.rank * self.prompts_per_batch
        self.groups_drawn += len(world)
        return rows, list(range(first, first + len(rows)))

    def sampling_weights(self) -> tuple[int, nn.Module | None]:
        """The version that samples the next batch, and its model (None: the policy itself)."""
        return self.policy_version, None

    def policy_updated(self, version: int) -> None:
        self.policy_version = version

    def state(self) -> dict[str, Any]:
        """What a checkpoint needs to resume this source exactly (the prompt order is the trainer's)."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state`'s dict."""

    def close(self) -> None:
        """Nothing to release: it samples in this process."""

    def metrics(self) -> dict[str, float]:
        """The last batch's metrics of the source itself (a worker's waits and checks); none here."""
        return {}


class PipelinedRollouts(SynchronousRollouts):
    """A pipeline of depth s = ``max_staleness``: the batch trained at step t is sampled by the weights after
    step ``max(0, t - s)``, as an asynchronous worker s steps behind the trainer samples it. Every batch is
    exactly that far behind, whatever the machine's speed: a run is deterministic, equal for any number of
    processes, and resumes exactly (a checkpoint holds the s older versions still to sample with).

    The sampling model is a copy of the policy (``policy()``) into which each version's trainable weights are
    loaded; the versions are kept on the CPU, the trainable parameters only (a LoRA policy's adapters).
    It samples in the trainer's process, between optimizer steps, so it overlaps nothing: it gives the
    asynchronous loop's semantics (staleness, the off-policy correction, exact resume); :class:`WorkerRollouts`
    samples the same batches in a worker process, overlapping the trainer's steps."""

    def __init__(self, *, policy: Callable[[], nn.Module], staleness: int, sync_every: int = 1, **source: Any) -> None:
        super().__init__(**source)
        self.policy, self.staleness, self.sync_every = policy, staleness, sync_every
        self.versions: dict[int, dict[str, Tensor]] = {}
        self.sampler: nn.Module | None = None
        self.loaded: int | None = None

    def sampling_weights(self) -> tuple[int, nn.Module | None]:
        version = sampling_version(self.policy_version, self.staleness, self.sync_every)
        if version not in self.versions and version == self.policy_version:  # before any update: the policy's
            self.versions[version] = trainable_weights(self.policy())
        if version not in self.versions:
            raise RuntimeError(
                f"max_staleness={self.staleness}: the weights of step {version} are gone (kept: "
                f"{sorted(self.versions)}); a checkpoint saved without them cannot resume this pipeline"
            )
        if self.sampler is None:
            self.sampler = copy.deepcopy(self.policy()).eval().requires_grad_(False)
            self.loaded = None
        if self.loaded != version:
            with torch.no_grad():
                parameters = dict(self.sampler.named_parameters())
                for name, value in self.versions[version].items():
                    parameters[name].copy_(value)
            self.loaded = version
        return version, self.sampler

    def policy_updated(self, version: int) -> None:
        super().policy_updated(version)
        if version % self.sync_every == 0:  # a sync point (weight_sync_steps): a version batches sample with
            self.versions[version] = trainable_weights(self.policy())
        oldest = sampling_version(version, self.staleness, self.sync_every)  # what the next batch samples with
        for old in [v for v in self.versions if v < oldest]:
            del self.versions[old]

    def state(self) -> dict[str, Any]:
        """The versions the next s batches sample with (all but the current weights, which the checkpoint holds)."""
        return {str(v): weights for v, weights in self.versions.items() if v < self.policy_version}

    def restore(self, state: dict[str, Any]) -> None:
        self.versions.update({int(v): weights for v, weights in state.items()})
