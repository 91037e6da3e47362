"""Weights from the trainer to a rollout worker over torch.distributed (``rollout_workers`` >= 1).

Each worker shares a process group of two with the trainer's process that spawned it (rank 0 the trainer, rank 1
the worker), built directly on a ``TCPStore`` the trainer hosts on 127.0.0.1 (a free port), not through
``init_process_group``: the trainer may already be in its own data-parallel group, and a restarted worker gets a
fresh group under a new store prefix while the others keep theirs. One group per worker, not one for all: a
collective needs every member, so a worker busy sampling would hold back the weights of an idle one, and a dead
member would break everyone's.

The backend (:func:`sync_backend`): NCCL where trainer and worker are on two different CUDA devices (GPU to
GPU); gloo everywhere else: the CPU, and one GPU shared by trainer and worker (NCCL refuses two ranks on one
device), where the weights cross through host memory as they would through a queue.

A version is sent as a header on the worker's request queue (``("weights", version, layout)``: names, shapes and
dtypes) followed by one broadcast per dtype of the trainable weights flattened into one buffer
(:func:`flatten`); the trainer posts the broadcasts without waiting (the worker joins them when it reads the
header, after the batch it may be sampling), and keeps the buffers until they completed.

Why not the queues that carry the requests? They move tensors through shared memory, one host only, and
copy a GPU's weights through it; a process group is the transport that reaches other devices (NCCL) and,
for a future worker on another machine, other hosts. On this 2-core CPU, gloo moves 400 MB between two local
processes in 0.1-0.26 s.
"""

from __future__ import annotations

import datetime
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]

HOST = "127.0.0.1"
# the worker may take a while to start (importing, unpickling its copy of the policy); a dead one is noticed sooner:
# the trainer checks it is alive while waiting
TIMEOUT = datetime.timedelta(minutes=10)


@dataclass(frozen=True)
class Slot:
    """Where one weight lies in its dtype's flat buffer."""

    name: str
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class Layout:
    """A version's weights as flat buffers: for each dtype (in order), its weights and the buffer's length."""

    buffers: tuple[tuple[torch.dtype, int, tuple[Slot, ...]], ...]


def sync_backend(trainer_device: str, worker_device: str) -> str:
    """``"nccl"`` where trainer and worker are on two different CUDA devices, else ``"gloo"`` (the CPU, or one GPU
    shared by both: NCCL refuses two ranks on one device)."""
    trainer, worker = torch.device(trainer_device), torch.device(worker_device)
    if trainer.type == worker.type == "cuda" and _index(trainer) != _index(worker):
        return "nccl"
    return "gloo"


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def flatten(weights: dict[str, Tensor]) -> tuple[Layout, list[Tensor]]:
    """``weights`` as one flat buffer per dtype (in the order the dtypes first appear), with the :class:`Layout`
    that puts them back."""
    by_dtype: dict[torch.dtype, list[tuple[str, Tensor]]] = {}
    for name, value in weights.items():
        by_dtype.setdefault(value.dtype, []).append((name, value))
    buffers, flats = [], []
    for dtype, items in by_dtype.items():
        slots, offset = [], 0
        for name, value in items:
            slots.append(Slot(name, tuple(value.shape), offset))
            offset += value.numel()
        buffers.append((dtype, offset, tuple(slots)))
        flats.append(torch.cat([value.reshape(-1) for _, value in items]))
    return Layout(tuple(buffers)), flats


def unflatten(layout: Layout, flats: list[Tensor]) -> dict[str, Tensor]:
    """The weights of ``flats`` by name (views into them): the inverse of :func:`flatten`."""
    weights = {}
    for (_, _, slots), flat in zip(layout.buffers, flats, strict=True):
        for slot in slots:
            size = 1
            for n in slot.shape:
                size *= n
            weights[slot.name] = flat[slot.offset : slot.offset + size].view(slot.shape)
    return weights


def _group(store: Any, prefix: str, rank: int, backend: str) -> Any:
    prefixed = PrefixStore(prefix, store)
    if backend == "nccl":  # its communicator is made at the first broadcast, on the buffer's device
        return dist.ProcessGroupNCCL(prefixed, rank, 2, dist.ProcessGroupNCCL.Options())
    return dist.ProcessGroupGloo(prefixed, rank, 2, TIMEOUT)


class WeightSender:
    """The trainer's end of one worker's group: :meth:`send` posts a version's broadcasts.

    The group is built in a thread (it waits for the worker to join), so spawning a worker does not block the
    trainer; :meth:`ready` waits for it while the worker is alive."""

    def __init__(self, store: Any, prefix: str, backend: str, device: str) -> None:
        self.backend = backend
        self.device = device if backend == "nccl" else "cpu"
        self.group: Any = None
        self.error: BaseException | None = None
        self.pending: list[tuple[Any, list[Tensor]]] = []  # posted broadcasts and the buffers they read

        def connect() -> None:
            try:
                self.group = _group(store, prefix, 0, backend)
            except BaseException as error:  # re-raised by ready()
                self.error = error

        self.thread = threading.Thread(target=connect, daemon=True, name="rloo-weight-sync")
        self.thread.start()

    def ready(self, alive: Any, poll: float) -> bool:
        """Wait for the group (``alive()`` says whether the worker still runs); False when the worker died first."""
        while self.thread.is_alive():
            self.thread.join(timeout=poll)
            if self.thread.is_alive() and not alive():
                return False
        if self.error is not None:
            raise RuntimeError(f"the weight-sync group with the rollout worker failed: {self.error}") from self.error
        return True

    def send(self, flats: list[Tensor]) -> None:
        """Post the broadcasts of a version's flat buffers (:func:`flatten`, on the CPU: flattened once for every
        worker); the worker receives them after reading their layout."""
        self.pending = [(work, flats) for work, flats in self.pending if not work.is_completed()]
        flats = [flat.to(self.device) for flat in flats]  # NCCL: onto the trainer's GPU
        works = [self.group.broadcast(flat, 0) for flat in flats]
        self.pending.extend((work, flats) for work in works)


class WeightReceiver:
    """The worker's end of its group with the trainer."""

    def __init__(self, store_port: int, prefix: str, backend: str, device: str) -> None:
        self.device = device if backend == "nccl" else "cpu"
        if backend == "nccl":
            torch.cuda.set_device(torch.device(device))
        store = TCPStore(HOST, store_port, is_master=False, timeout=TIMEOUT)
        self.group = _group(store, prefix, 1, backend)

    def receive(self, layout: Layout) -> dict[str, Tensor]:
        """The weights the trainer broadcast after ``layout`` (views into fresh flat buffers on the group's
        device)."""
        flats = [torch.empty(length, dtype=dtype, device=self.device) for dtype, length, _ in layout.buffers]
        for flat in flats:
            self.group.broadcast(flat, 0).wait()
        return unflatten(layout, flats)


def host_store() -> Any:
    """The trainer's rendezvous store for its workers' groups (127.0.0.1, a free port: ``store.port``)."""
    return TCPStore(HOST, 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
