"""Data-parallel training across processes, on accelerate / torch.distributed (any backend).

What is split and what stays global (every rank runs the same loop):

- **Prompts.** A generation batch is ``world_size x P`` prompts drawn from one sampler that is
  identical on every rank; rank ``r`` takes prompts ``[r P, (r + 1) P)``. A prompt's K
  completions are generated and scored on one rank, so the leave-one-out baseline always sees
  its whole group. Reward functions run on every rank in parallel.
- **Batch statistics.** Batch-level advantage normalization (``normalize_advantages``, the
  ``reinforce_pp`` estimators) uses the mean and std over every rank's completions
  (:meth:`Ranks.batch_stats`).
- **Loss normalizers.** Token and sequence counts of an optimizer step are summed over ranks,
  so each rank's loss is its share of the global loss (the logged ``loss`` is their sum), and
  the gradients are summed over ranks (:meth:`Ranks.sum_gradients`): exactly the gradient of
  the global loss, for every aggregation mode.
- **Gradients.** Summed by one all-reduce per optimizer step, after every pass of every
  micro-batch (DDP's per-backward hooks are off: ranks may run different numbers of passes,
  since passes follow completion lengths). Clipping then sees the global gradient. Under FSDP,
  FSDP sums them (reduce-scatter) in each backward instead.
- **Metrics.** Per-completion values are gathered and reduced as one batch; step metrics are
  averaged over ranks. Gathering goes through ``all_gather_object``, so a metric that only
  some ranks computed cannot leave a rank waiting on a collective the others never call.
- **Stopping.** A stop request (a signal) is agreed on at each generation-batch boundary, so
  every rank stops after the same batch and writes its share of the checkpoint.

Under FSDP (:mod:`rloo.training.parallel.fsdp`) the processes also run in *lockstep*: every forward
is a collective there, so generation, log-prob passes, training passes and evaluation batches
are run the same number of times on every process (:attr:`Ranks.lockstep`).

Only the main process writes files. One process (``world_size == 1``) calls no collective.
"""

from __future__ import annotations

import atexit
import datetime
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rloo.report import metric_names
from rloo.training.parallel.fsdp import FSDP_HINT, ShardingSettings, sharding_settings

T = TypeVar("T")


# elements per gradient all-reduce (64 MiB of float32): the reduction's extra memory, in DDP's range
GRADIENT_BUCKET_NUMEL = 2**24


class Ranks:
    """The processes of a run: this one's rank, their number, and the collectives the loop needs."""

    def __init__(self, rank: int = 0, world_size: int = 1, lockstep: bool = False) -> None:
        self.rank, self.world_size = rank, world_size
        # sharded parameters: every process must run the same forwards (see count_everywhere)
        self.lockstep = lockstep and world_size > 1

    @classmethod
    def from_accelerator(cls, accelerator: Any, lockstep: bool = False) -> Ranks:
        ranks = cls(accelerator.process_index, accelerator.num_processes, lockstep)
        if ranks.distributed:
            # a process group still alive at interpreter exit aborts the process (gloo's threads
            # are destroyed while joinable: "terminate called without an active exception")
            atexit.register(release_process_group)
        return ranks

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def shard(self, items: list[Any]) -> list[Any]:
        """This rank's contiguous share of ``items`` (whose length is a multiple of world_size)."""
        per_rank = len(items) // self.world_size
        return items[self.rank * per_rank : (self.rank + 1) * per_rank]

    def gather_objects(self, value: Any) -> list[Any]:
        """``[value of rank 0, value of rank 1, ...]`` on every rank (picklable values)."""
        if not self.distributed:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def on_main(self, work: Callable[[], T]) -> T:
        """Run ``work`` on the main process only and share its (picklable) result with every rank;
        an exception it raises is raised on every rank, so no rank waits for a failed main."""
        if not self.distributed:
            return work()
        outcome: list[Any] = [None]
        if self.is_main:
            try:
                outcome = [("ok", work())]
            except Exception as error:
                outcome = [("error", error)]
        dist.broadcast_object_list(outcome, src=0)
        kind, value = outcome[0]
        if kind == "error":
            raise value
        return value  # type: ignore[no-any-return]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def map_batches(self, work: Callable[[list[int], int], T], total: int, size: int) -> list[T]:
        """``work(indices, b)`` for each batch ``b`` of ``size`` consecutive indices of ``range(total)``,
        batch ``b`` on process ``b % world_size``; every process gets all results in batch order.
        In lockstep a process left without a batch in the last round works on batch 0 again and
        drops the result, so every process runs as many batches."""
        batches = [list(range(start, min(start + size, total))) for start in range(0, total, size)]
        rounds = -(-len(batches) // self.world_size) if self.lockstep else 0
        mine = []
        for b in range(self.rank, max(len(batches), rounds * self.world_size), self.world_size):
            if b < len(batches):
                mine.append((b, work(batches[b], b)))
            else:
                work(batches[0], 0)  # a filler batch: its forwards keep the processes in step
        return [result for _, result in sorted((r for part in self.gather_objects(mine) for r in part), key=_first)]

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks of a fixed-length list of floats."""
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=_device())
        dist.all_reduce(tensor)
        return tensor.tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is True on any."""
        return bool(self.sum([float(flag)])[0] > 0)

    def all_done(self, done: bool) -> bool:
        """In lockstep: True on every rank once ``done`` is True on all (generation decodes until
        every process has finished); otherwise ``done`` itself, with no collective."""
        return not self.any(not done) if self.lockstep else done

    def count_everywhere(self, count: int) -> int:
        """In lockstep: the largest ``count`` over ranks (the passes every process runs, some of
        them fillers); otherwise ``count`` itself, with no collective."""
        if not self.lockstep:
            return count
        tensor = torch.tensor([count], dtype=torch.int64, device=_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def batch_stats(self, values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(sum, count, std)`` of ``values[mask]`` over every rank's batch: the global version of
        :func:`rloo.algo.advantages.batch_stats` (std with ddof=1; 0 when fewer than 2)."""
        picked = values[mask].double()  # one process computes it the same way: float64, two passes
        count, total = self.sum([float(picked.numel()), float(picked.sum())])
        mean = total / count if count else 0.0
        # the squared deviations from the global mean, summed in a second round: no cancellation
        (squares,) = self.sum([float(((picked - mean) ** 2).sum())])
        std = math.sqrt(squares / (count - 1)) if count > 1 else 0.0
        total_t, count_t, std_t = (
            torch.tensor(x, dtype=values.dtype, device=values.device) for x in (total, count, std)
        )
        return total_t, count_t, std_t

    def sum_gradients(self, model: nn.Module, bucket_numel: int = GRADIENT_BUCKET_NUMEL) -> None:
        """Replace every gradient by its sum over ranks: one all-reduce per bucket of gradients
        (:func:`gradient_buckets`), so the reduction holds at most one bucket's copy, not a second
        copy of every gradient."""
        if not self.distributed:
            return
        grads = [p.grad for p in model.parameters() if p.requires_grad and p.grad is not None]
        for bucket in gradient_buckets(grads, bucket_numel):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            offset = 0
            for grad in bucket:
                grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
                offset += grad.numel()


def gradient_buckets(grads: list[Tensor], max_numel: int) -> list[list[Tensor]]:
    """``grads`` in order, grouped into runs of one dtype and device of at most ``max_numel``
    elements together (a larger gradient alone): each run is all-reduced as one flat buffer."""
    buckets: list[list[Tensor]] = []
    size = 0
    for grad in grads:
        last = buckets[-1][-1] if buckets else None
        fits = last is not None and size + grad.numel() <= max_numel
        if fits and last is not None and (last.dtype, last.device) == (grad.dtype, grad.device):
            buckets[-1].append(grad)
            size += grad.numel()
        else:
            buckets.append([grad])
            size = grad.numel()
    return buckets


SUPPORTED_ENGINES = ("NO", "MULTI_CPU", "MULTI_GPU", "FSDP")


def check_engine(distributed_type: Any, env: Mapping[str, str] | None = None) -> ShardingSettings | None:
    """The sharding the launch asks for (None: data parallel), refusing what rloo does not run:
    DeepSpeed, FSDP version 1 (:func:`rloo.training.parallel.fsdp.sharding_settings`) and the other
    engines accelerate knows (XLA, Megatron-LM, ...)."""
    settings = sharding_settings(distributed_type, env)
    name = getattr(distributed_type, "name", str(distributed_type))
    if name not in SUPPORTED_ENGINES:
        raise ValueError(f"accelerate is configured for {name}, which rloo does not support: {FSDP_HINT}")
    return settings


def release_process_group() -> None:
    """At exit: wait for every process, then tear the group down. A process that tore its gloo
    connections down while a peer was still finishing its last collective made that peer abort
    ("terminate called without an active exception"), seen as a flaky exit code -6. A peer that is
    gone (crashed) fails the barrier within a minute, and the group is torn down anyway."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=60))
        else:
            dist.barrier()
    except RuntimeError:
        pass
    dist.destroy_process_group()


def exit_process(code: int = 0) -> NoReturn:
    """End a finished distributed process now: release the process group (every process waits for
    the others), flush the output, and ``os._exit(code)``, skipping interpreter finalization. There,
    objects that still hold gloo work (FSDP's sharded modules among them) are destroyed after the group,
    and gloo aborts the process ("terminate called without an active exception", exit -6) now and then
    (seen about once in 20 FSDP runs) although everything was written. ``rloo train`` ends this way;
    a script under torchrun can end with it too."""
    release_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _first(pair: tuple[int, Any]) -> int:
    return pair[0]


def cpu_processes() -> bool:
    """Several processes and no CUDA device: accelerate then runs on CPU with gloo only when told
    (``cpu=True``; ``accelerate launch`` sets it, ``torchrun`` does not)."""
    return not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1


def eval_seed(seed: int) -> int:
    """The sampling seed of evaluation: ``(seed + 1) * 1_000_003``, a stream apart from training's
    (``seed``). Completions are seeded one by one (keyed by the eval row), so evaluation gives the
    same numbers on any number of processes and with any batch size."""
    return (seed + 1) * 1_000_003


def _device() -> torch.device:
    """The device collectives run on: CUDA under NCCL, CPU otherwise (gloo)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


SUMMED_OVER_RANKS = (metric_names.LOSS,)  # each rank's loss is its share of the global loss
# per-token means over the trained rows, weighted by each rank's "_tokens"
TOKEN_MEANS = (metric_names.ENTROPY, metric_names.KL, "aux_loss", metric_names.FIRST_STEP_LOG_RATIO)
# clip fractions over every row's actions, weighted by each rank's "_actions" (update_metrics)
WEIGHTS = {key: "_tokens" for key in TOKEN_MEANS} | {key: "_actions" for key in metric_names.CLIP_RATIO_MEANS}


def reduce_step_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One optimizer step's metrics over ranks: ``loss`` summed; the means weighted by what each
    rank's are over (:data:`WEIGHTS`: ``_tokens``, ``_actions``), so they equal one process's mean
    over every rank's; ``*_min`` / ``*_max`` the extreme over ranks; every other key averaged over the
    ranks that logged it (NaN ignored, as in a logging window)."""
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for metrics in per_rank for k in metrics if not k.startswith("_")):
        weight_key = WEIGHTS.get(key)
        present = [(m[key], m.get(weight_key, 1.0) if weight_key else 1.0) for m in per_rank if key in m]
        if key in SUMMED_OVER_RANKS:
            out[key] = sum(v for v, _ in present)  # a NaN on any rank stays NaN: skipped everywhere
            continue
        if key.endswith(("_min", "_max")):  # the extreme over ranks (NaN ignored)
            finite = [v for v, _ in present if not math.isnan(v)]
            out[key] = (min if key.endswith("_min") else max)(finite) if finite else math.nan
            continue
        values = [(v, w) for v, w in present if not math.isnan(v)]
        weight = sum(w for _, w in values)
        out[key] = sum(v * w for v, w in values) / weight if weight > 0 else math.nan
    return out
