"""A rollout worker that runs out of memory (issue 42), seen from the trainer's side: a worker that reports
``MemoryError`` / ``torch.OutOfMemoryError`` is replaced like one that died (memory may have been short for a
moment), saying what ran out and what to give it; one that the kernel's out-of-memory killer ends is named as
killed by SIGKILL. The worker's process is a stand-in here (no process starts: the fast tier); the replacement
itself is tested with real processes in ``tests/training/rollouts/test_pipelined.py``."""

from __future__ import annotations

import queue
import signal
from dataclasses import dataclass
from typing import Any

import pytest

from rloo.training.parallel.rollout_worker import RolloutWorker, WorkerDied, WorkerOutOfMemory, ended, failure

OOM_TRACE = """Traceback (most recent call last):
  File "rloo/training/parallel/rollout_worker.py", line 340, in sample
    sampled = sample_batch(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB
"""

CPU_OOM_TRACE = """Traceback (most recent call last):
  File "rloo/training/parallel/weight_sync.py", line 162, in receive
RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried \
to allocate 42024960 bytes. Error code 12 (Cannot allocate memory)
"""


@dataclass
class GoneProcess:
    """A worker process that has ended with ``exitcode``."""

    exitcode: int | None
    pid: int = 4242

    def is_alive(self) -> bool:
        return False

    def join(self, timeout: float | None = None) -> None:
        pass


def handle(process: Any, *messages: Any) -> RolloutWorker:
    """A trainer-side handle on ``process`` whose reader has received ``messages``."""
    worker = object.__new__(RolloutWorker)
    worker.inbox = queue.Queue()
    for message in messages:
        worker.inbox.put(message)
    worker.process = process
    return worker


def test_a_worker_out_of_memory_is_replaced_naming_what_ran_out_and_what_to_give_it() -> None:
    worker = handle(GoneProcess(None), ("error", 7, OOM_TRACE))
    with pytest.raises(WorkerOutOfMemory) as raised:
        worker.receive(7)
    assert isinstance(raised.value, WorkerDied)  # the rollout source starts a new worker for the same shares
    message = str(raised.value)
    assert "ran out of memory sampling the batch of step 7 (torch.OutOfMemoryError: CUDA out of memory." in message
    assert "max_completion_length" in message and "rollout_worker_devices" in message


def test_a_python_memory_error_is_out_of_memory_too_and_another_error_stops_the_run_with_its_traceback() -> None:
    assert isinstance(failure(3, 1, "Traceback ...\nMemoryError\n"), WorkerOutOfMemory)
    other = failure(3, 1, "Traceback ...\n  File 'x.py'\nKeyError: 'prompt'\n")
    assert type(other) is RuntimeError and "KeyError: 'prompt'" in str(other)


def test_the_cpu_allocators_runtime_error_is_out_of_memory_too() -> None:
    """torch's CPU allocator raises a RuntimeError, not ``torch.OutOfMemoryError`` (read off a worker under an
    address-space limit; it was "died (exit code 1)" before)."""
    assert isinstance(failure(3, 1, CPU_OOM_TRACE), WorkerOutOfMemory)


def test_a_worker_that_failed_loading_weights_and_ended_is_named_so() -> None:
    """A worker whose loop failed outside a batch answers ``("error", None, traceback)`` and ends: named as
    failing before the batch the trainer waits for, replaced when it ran out of memory, else the run stops."""
    worker = handle(GoneProcess(1), ("error", None, CPU_OOM_TRACE))
    with pytest.raises(
        WorkerOutOfMemory, match="ran out of memory starting up or loading new weights before the batch of step 5"
    ):
        worker.receive(5)
    worker = handle(GoneProcess(1), ("error", None, "Traceback ...\nValueError: bad layout\n"))
    with pytest.raises(
        RuntimeError, match=r"failed starting up or loading new weights before the batch of step 5:\n(.|\n)*bad layout"
    ):
        worker.receive(5)


def test_a_worker_killed_by_the_out_of_memory_killer_is_named_so() -> None:
    worker = handle(GoneProcess(-signal.SIGKILL))
    with pytest.raises(WorkerDied, match=r"pid 4242\) was killed by SIGKILL \(what the kernel's out-of-memory killer"):
        worker.receive(2)
    assert ended(1) == "died (exit code 1)"
    assert ended(-signal.SIGTERM) == "was killed by SIGTERM"
    assert ended(-200) == "was killed by signal 200"
