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

    KEY = "pipelined_rollouts"

    def __init__(self, *, policy: Callable[[], nn.Module], staleness: int, **source: Any) -> None:
        super().__init__(**source)
        self.policy, self.staleness = policy, staleness
        self.versions: dict[int, dict[str, Tensor]] = {}
        self.sampler: nn.Module | None = None
        self.loaded: int | None = None

    def sampling_weights(self) -> tuple[int, nn.Module | None]:
        version = max(0, self.policy_version - self.staleness)
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
        self.versions[version] = trainable_weights(self.policy())
        for old in [v for v in self.versions if v < version - self.staleness]:
            del self.versions[old]

    def state(self) -> dict[str, Any]:
        """The versions the next s batches sample with (all but the current weights, which the checkpoint holds)."""
        return {str(v): weights for v, weights in self.versions.items() if v < self.policy_version}

    def restore(self, state: dict[str, Any]) -> None:
        self.versions.update({int(v): weights for v, weights in state.items()})


class WorkerRollouts(PipelinedRollouts):
    """:class:`PipelinedRollouts` sampled in a worker process (``rollout_workers: 1``), which samples the batch
    of step t + s while the trainer trains the batch of step t + 1 (:mod:`rloo.training.parallel.rollout_worker`).
    The requests run ahead of the trainer: their prompts are drawn when asked for, and a checkpoint keeps the
    ones asked for and not yet trained (with the versions they sample with), so a resumed run asks again."""

    def __init__(self, *, processing_class: Any, settings: Any, seed: int, **pipelined: Any) -> None:
        super().__init__(**pipelined)
        self.processing_class, self.settings, self.seed = processing_class, settings, seed
        self.worker: Any = None
        self.inflight: dict[int, tuple[list[dict[str, Any]], list[int], int]] = {}  # step -> rows, groups, version
        self.requested_to: int | None = None
        self.sent: int | None = None
        self.resumed_groups: int | None = None

    def next_batch(self) -> ScoredRollout:
        from rloo.training.parallel.rollout_worker import RolloutWorker

        step = self.policy_version
        if self.worker is None:
            self.worker = RolloutWorker(copy.deepcopy(self.policy()).cpu(), self.processing_class, self.settings)
            self.requested_to, self.sent = step - 1, None
            if self.resumed_groups is not None:
                self.groups_drawn = self.resumed_groups
        self.request_through(step + self.staleness)
        version, sampled, seconds = self.worker.receive(step)
        rows, groups, expected = self.inflight.pop(step)
        if version != expected:
            raise RuntimeError(
                f"the rollout worker sampled the batch of step {step} with version {version}, not {expected}"
            )
        scored = self.generate(rows, groups, sampled=(sampled, seconds))
        return dataclasses.replace(scored, policy_version=version)

    def request_through(self, last: int) -> None:
        """Ask the worker for every batch up to the one of step ``last``, each after its version's weights."""
        from rloo.data.prompts import columns_of

        assert self.requested_to is not None
        for step in range(self.requested_to + 1, last + 1):
            if step not in self.inflight:
                rows, groups = self.draw()
                self.inflight[step] = (rows, groups, max(0, step - self.staleness))
            rows, groups, version = self.inflight[step]
            if self.sent != version:
                self.worker.send_weights(version, self.versions[version])
                self.sent = version
            self.worker.request(step, [row["prompt"] for row in rows], columns_of(rows), groups, self.seed)
            self.requested_to = step

    def policy_updated(self, version: int) -> None:
        super().policy_updated(version)
        if self.worker is not None:
            self.request_through(version + self.staleness)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "inflight": dict(self.inflight), "groups_drawn": self.groups_drawn}

    def restore(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.inflight = {int(step): value for step, value in state.pop("inflight", {}).items()}
        self.resumed_groups = state.pop("groups_drawn", None)
        super().restore(state)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


def trainable_weights(model: nn.Module) -> dict[str, Tensor]:
    """``model``'s trainable parameters, copied to the CPU."""
    return {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters() if p.requires_grad}


def rollout_source(
    args: Any,
    ranks: Ranks,
    policy: Callable[[], nn.Module],
    worker: tuple[Any, Any],
    *,
    reward_weights: Tensor,
    **source: Any,
) -> RolloutSource:
    """The run's rollout source: :class:`PipelinedRollouts` with ``max_staleness`` >= 1 (:class:`WorkerRollouts`
    with ``rollout_workers`` 1: ``worker`` is the processing class and rollout settings it needs), else
    synchronous; each batch of ``prompts_per_generation`` prompts per process. With ``dynamic_sampling``,
    wrapped in :class:`rloo.training.rollouts.dynamic_sampling.DynamicSampling` (``reward_weights``: the
    reward functions', which say which groups have a signal)."""
    drawn = _batches(args, ranks, policy, worker, prompts_per_batch=args.prompts_per_generation, **source)
    if not args.dynamic_sampling:
        return drawn
    from rloo.data.images import is_processor
    from rloo.training.rollouts.dynamic_sampling import DynamicSampling, task_signal

    processing_class = worker[0]
    tokenizer = processing_class.tokenizer if is_processor(processing_class) else processing_class
    signal = task_signal(args, reward_weights)
    return DynamicSampling(
        drawn, signal=signal, max_rounds=args.max_num_gen_batches, pad_token_id=tokenizer.pad_token_id
    )


def _batches(
    args: Any, ranks: Ranks, policy: Callable[[], nn.Module], worker: tuple[Any, Any], **source: Any
) -> SynchronousRollouts:
    if args.max_staleness == 0:
        return SynchronousRollouts(ranks=ranks, **source)
    if ranks.lockstep:
        raise ValueError(
            f"RLOOConfig.max_staleness={args.max_staleness} with FSDP2-sharded training is not built yet (the "
            "stale sampling copy would be a second sharded model); train data-parallel, or with max_staleness=0"
        )
    if args.rollout_workers:
        processing_class, settings = worker
        if settings.custom is not None or (settings.agent is not None and settings.agent.environments is not None):
            raise ValueError(
                "RLOOConfig.rollout_workers=1 with a rollout_func or an environment_factory is not built yet (the "
                "worker would need them in its process); use rollout_workers=0"
            )
        return WorkerRollouts(
            ranks=ranks,
            policy=policy,
            staleness=args.max_staleness,
            processing_class=processing_class,
            settings=settings,
            seed=args.seed,
            **source,
        )
    return PipelinedRollouts(ranks=ranks, policy=policy, staleness=args.max_staleness, **source)


def check_policy_version(scored: ScoredRollout, step: int, staleness: int = 0) -> None:
    """A batch trained at ``step`` must have been sampled by the policy of step ``max(0, step - staleness)``
    (``max_staleness``; 0: the policy being trained): anything else is a weight update the sampler missed."""
    expected = max(0, step - staleness)
    if scored.policy_version != expected:
        raise RuntimeError(
            f"the rollouts trained at step {step} were sampled by the policy of step {scored.policy_version}, not "
            f"{expected} (max_staleness={staleness}): the rollout source missed a weight update "
            "(RolloutSource.policy_updated)"
        )
