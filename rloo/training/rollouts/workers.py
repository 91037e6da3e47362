"""The rollout source of ``rollout_workers`` >= 1: :class:`WorkerRollouts`, the pipeline of
:class:`rloo.training.rollouts.source.PipelinedRollouts` sampled by worker processes
(:mod:`rloo.training.parallel.rollout_worker`), which sample the batch of step t + s while the trainer trains the
batch of step t + 1.

Several workers: each generation batch's prompts are cut into ``rollout_workers`` contiguous shares of whole
groups (sizes differing by at most one prompt), each worker samples its share with the same weight version, and
the shares are put back together in order (:func:`rloo.generation.rollout.concat_rollouts`). Every completion is
seeded by its group, so a batch is the same whichever worker samples which share: a run trains the same for any
number of workers (up to float rounding of the smaller decode batches).

The requests run ahead of the trainer: their prompts are drawn when asked for, and a checkpoint keeps the ones
asked for and not yet trained (with the versions they sample with), so a resumed run asks again.

``free_running``: each request is sent the newest synced weights instead of its batch's own, and a worker loads
every version sent since before it starts a batch (:func:`rloo.training.parallel.rollout_worker.newest_first`),
so a batch samples with weights between ``sampling_version(t)`` and t: fresher when generation is the
bottleneck, but which version samples which batch depends on timing (not reproducible; the batches are).

Each version's probe log-probs (the trainer's, taken when the version is made) are compared with each worker's
after it loads that version: a gap beyond the tolerance stops the run (a resumed run's first s batches, sampled by
versions made before the resume, are not checked). A worker that dies is replaced, up to
:data:`MAX_WORKER_RESTARTS` times a run: the new one is sent the versions and asked for the same shares.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import time
import warnings
from typing import Any

import torch
from torch import Tensor

from rloo.generation.device import model_device
from rloo.generation.rollout import concat_rollouts
from rloo.generation.sync_check import check_weight_sync
from rloo.pipeline import SampledBatch, ScoredRollout
from rloo.report import metric_names as names
from rloo.training.parallel import rollout_worker as worker_process
from rloo.training.parallel.weight_sync import Layout, flatten, host_store
from rloo.training.rollouts.source import PipelinedRollouts
from rloo.training.rollouts.versions import sampling_version, trainable_weights, version_allowed
from rloo.waiting import waiting_for

# a run replaces rollout workers that died at most this many times (then it stops, to resume from a checkpoint)
MAX_WORKER_RESTARTS = 3


def shares(prompts: int, workers: int) -> list[slice]:
    """``prompts`` cut into ``workers`` contiguous shares, the first ``prompts % workers`` one longer; empty
    shares (fewer prompts than workers) are left out."""
    size, extra = divmod(prompts, workers)
    bounds = [0]
    for i in range(workers):
        bounds.append(bounds[-1] + size + (1 if i < extra else 0))
    return [slice(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def merge_sampled(parts: list[SampledBatch], pad_token_id: int) -> SampledBatch:
    """The workers' shares of one batch, in order, as one :class:`SampledBatch`."""
    if len(parts) == 1:
        return parts[0]
    episodes = [e for part in parts for e in part.episodes or []] if parts[0].episodes is not None else None
    prompts = [p for part in parts for p in part.episode_prompts or []] if parts[0].episode_prompts else None
    return SampledBatch(
        rollout=concat_rollouts([part.rollout for part in parts], pad_token_id),
        num_truncated_prompts=sum(part.num_truncated_prompts for part in parts),
        episodes=episodes,
        episode_prompts=prompts,
        columns={key: [v for part in parts for v in part.columns[key]] for key in parts[0].columns},
    )


class WorkerRollouts(PipelinedRollouts):
    """:class:`PipelinedRollouts` sampled by ``workers`` worker processes (module docstring)."""

    def __init__(
        self,
        *,
        processing_class: Any,
        settings: Any,
        seed: int,
        workers: int = 1,
        devices: list[str] | None = None,
        stale_after: float = 300.0,
        free: bool = False,
        mixed_precision: bool = False,
        **pipelined: Any,
    ) -> None:
        super().__init__(**pipelined)
        self.devices = devices  # one per worker (None: the policy's)
        self.stale_after = stale_after  # heartbeat_stale_after_s
        self.free = free  # free_running: each request is sent the newest synced version, not the batch's own
        self.store: Any = None  # the rendezvous of the workers' weight-sync groups
        self.flat: dict[int, tuple[Layout, list[Tensor]]] = {}  # versions flattened for sending
        self.started = 0  # workers started so far (each gets its own group's prefix)
        self.mixed_precision = mixed_precision  # bf16/fp16 autocast: the trainer's probe is scored in it
        self.processing_class, self.settings, self.seed = processing_class, settings, seed
        self.count = workers
        self.workers: list[Any] = []
        self.sent: list[int | None] = []  # the version each worker was sent last
        self.inflight: dict[int, tuple[list[dict[str, Any]], list[int], int]] = {}  # step -> rows, groups, version
        self.requested_to: int | None = None
        self.resumed_groups: int | None = None
        self.probes: dict[int, Tensor] = {}  # version -> the trainer's probe log-probs
        self.restarts = 0
        self.last_metrics: dict[str, float] = {}
        tokenizer = getattr(processing_class, "tokenizer", processing_class)
        self.pad_token_id = int(getattr(tokenizer, "pad_token_id", None) or 0)

    @property
    def worker(self) -> Any:
        """The first worker (the only one with ``rollout_workers: 1``)."""
        return self.workers[0] if self.workers else None

    def new_worker(self, index: int) -> Any:
        """A worker process for share ``index`` (a new one also when replacing a dead one)."""
        policy = self.policy()
        trainer_device = str(model_device(policy))
        device = self.devices[index] if self.devices else trainer_device
        if self.store is None:
            self.store = host_store()
        self.started += 1
        return worker_process.RolloutWorker(
            copy.deepcopy(policy).cpu(),
            self.processing_class,
            self.settings,
            device,
            store=self.store,
            prefix=f"rloo-weights/{self.started}/",
            trainer_device=trainer_device,
            stale_after=self.stale_after,
            free=self.free,
        )

    def next_batch(self) -> ScoredRollout:
        step = self.policy_version
        if not self.workers:
            self.workers = [self.new_worker(i) for i in range(self.count)]
            self.sent = [None] * self.count
            self.requested_to = step - 1
            self.note_probe(step)
            if self.resumed_groups is not None:
                self.groups_drawn = self.resumed_groups
        self.request_through(step + self.staleness)
        depth, waited = len(self.inflight), time.perf_counter()
        rows, groups, expected = self.inflight[step]
        answers = [self.receive(i, step) for i in range(len(shares(len(rows), self.count)))]
        wait = time.perf_counter() - waited
        del self.inflight[step]
        gaps = []
        for version, _, answer in answers:
            if not version_allowed(version, step, self.staleness, self.sync_every, self.free):
                allowed = f"{expected} to {step}" if self.free else str(expected)
                raise RuntimeError(
                    f"the rollout worker sampled the batch of step {step} with version {version}, not {allowed}"
                )
            gaps.append(self.check_sync(version, answer.probe))
        self.last_metrics = {
            names.ASYNC_TRAINER_WAIT: wait,
            names.ASYNC_WORKER_IDLE: max(answer.idle for _, _, answer in answers),
            names.ASYNC_QUEUE_DEPTH: float(depth),
            names.ASYNC_RESTARTS: float(self.restarts),
            names.ASYNC_SYNC_SECONDS: max(answer.sync_seconds for _, _, answer in answers),
        }
        if all(gap is not None for gap in gaps):
            self.last_metrics[names.ASYNC_SYNC_GAP] = max(gap for gap in gaps if gap is not None)
        sampled = merge_sampled([part for _, part, _ in answers], self.pad_token_id)
        device = model_device(self.policy())
        sampled = dataclasses.replace(sampled, rollout=sampled.rollout.to(device))
        seconds = max(answer.seconds for _, _, answer in answers)
        scored = self.generate(rows, groups, sampled=(sampled, seconds))
        # free_running: the oldest share's (the staleness logged is the batch's largest)
        return dataclasses.replace(scored, policy_version=min(version for version, _, _ in answers))

    def receive(self, index: int, step: int) -> tuple[int, Any, Any]:
        """Worker ``index``'s answer for ``step``, replacing it if it died (:data:`MAX_WORKER_RESTARTS`)."""
        while True:
            try:
                with waiting_for(f"rollout worker {index} (the batch of step {step})"):
                    answer: tuple[int, Any, Any] = self.workers[index].receive(step)
                return answer
            except worker_process.WorkerDied as died:
                if self.restarts >= MAX_WORKER_RESTARTS:
                    raise RuntimeError(
                        f"{died}, after {self.restarts} restarts in this run; the run stops: resume it from its last "
                        "checkpoint (rloo train ... --resume), with rollout_workers=0 if the worker keeps dying "
                        "(memory?)"
                    ) from None
                self.restarts += 1
                warnings.warn(
                    f"{died}; starting a new worker (restart {self.restarts} of at most {MAX_WORKER_RESTARTS}), "
                    "which samples the same batches",
                    stacklevel=2,
                )
                self.workers[index].close()
                self.workers[index], self.sent[index] = self.new_worker(index), None
                assert self.requested_to is not None
                for again in range(step, self.requested_to + 1):  # what the dead one was asked for, in order
                    self.request(index, again)

    def request(self, index: int, step: int) -> None:
        """Ask worker ``index`` for its share of the batch of ``step`` (after that version's weights)."""
        from rloo.data.prompts import columns_of

        rows, groups, version = self.inflight[step]
        cuts = shares(len(rows), self.count)
        if index >= len(cuts):
            return
        if self.free:  # the newest synced weights (the worker may load newer ones before it starts the batch)
            version = self.newest_synced()
        if self.sent[index] != version:
            if version not in self.flat:  # flattened once, for every worker
                self.flat = {v: f for v, f in self.flat.items() if v in self.versions}
                self.flat[version] = flatten(self.versions[version])
            self.workers[index].send_weights(version, self.flat[version])
            self.sent[index] = version
        share = rows[cuts[index]]
        prompts = [row["prompt"] for row in share]
        self.workers[index].request(step, prompts, columns_of(share), groups[cuts[index]], self.seed)

    def request_through(self, last: int) -> None:
        """Ask the workers for every batch up to the one of step ``last``."""
        assert self.requested_to is not None
        for step in range(self.requested_to + 1, last + 1):
            if step not in self.inflight:
                rows, groups = self.draw()
                self.inflight[step] = (rows, groups, sampling_version(step, self.staleness, self.sync_every))
            for index in range(self.count):
                self.request(index, step)
            self.requested_to = step

    def newest_synced(self) -> int:
        """The newest version made at a sync point (``weight_sync_steps``), kept in :attr:`versions`."""
        version = self.sync_every * (self.policy_version // self.sync_every)
        if version not in self.versions and version == self.policy_version:  # a resumed run's current weights
            self.versions[version] = trainable_weights(self.policy())
        return version

    def note_probe(self, version: int) -> None:
        """The trainer's probe log-probs of ``version`` (the policy holds its weights now)."""
        if version % self.sync_every:  # no batch samples with it (weight_sync_steps)
            return
        self.probes[version] = worker_process.probe_scores(self.policy())
        oldest = sampling_version(version, self.staleness, self.sync_every)
        for old in [v for v in self.probes if v < oldest]:
            del self.probes[old]

    def check_sync(self, version: int, probe: Tensor) -> float | None:
        """The probe's gap between a worker and the trainer for ``version`` (None: made before a resume, not
        checked); raises beyond the tolerance."""
        if version not in self.probes:
            return None
        low = self.mixed_precision or any(
            p.dtype in (torch.bfloat16, torch.float16) for p in self.policy().parameters()
        )
        refusal = (
            f"weight sync check failed for the weights of step {version}: the rollout worker scores the probe "
            "tokens {gap:.3g} nats away from the trainer (tolerance {tolerance:g}), so it samples with other "
            "weights than the trainer sent; the run stops (resume it from its last checkpoint with "
            "rollout_workers=0, and please report it)"
        )
        tolerance = worker_process.PROBE_TOLERANCE.at(low)
        return check_weight_sync(self.probes[version], probe, tolerance, refusal)

    def metrics(self) -> dict[str, float]:
        return dict(self.last_metrics)

    def policy_updated(self, version: int) -> None:
        super().policy_updated(version)
        if self.workers:
            self.note_probe(version)
            self.request_through(version + self.staleness)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "inflight": dict(self.inflight), "groups_drawn": self.groups_drawn}

    def restore(self, state: dict[str, Any]) -> None:
        state = dict(state)
        self.inflight = {int(step): value for step, value in state.pop("inflight", {}).items()}
        self.resumed_groups = state.pop("groups_drawn", None)
        super().restore(state)

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
