"""Sampling in worker processes (``max_staleness`` >= 1 with ``rollout_workers`` >= 1): generation overlaps training.

The worker is a spawned process holding its own copy of the policy, the tokenizer and the sampling settings;
the trainer's process keeps the prompt order, the reward functions and the optimizer. They speak through two
queues (torch's multiprocessing) and send the weights over a torch.distributed group of their own
(:mod:`rloo.training.parallel.weight_sync`: gloo, or NCCL between two GPUs):

- ``("weights", version, layout)``: receive the broadcasts that follow (the trainable parameters: a LoRA
  policy's adapters), load them and score the probe tokens with them (:func:`probe_scores`);
- ``("sample", step, prompts, columns, group_ids, seed)``: sample the batch of ``step`` with the weights loaded
  last, answered with ``("batch", step, version, SampledBatch, Answer)`` (or ``("error", step, traceback)``);
- ``("stop",)``.

The weight-sync check: the trainer scores the same probe tokens with each version's weights when it makes them
(:meth:`~rloo.training.rollouts.workers.WorkerRollouts.policy_updated`); a batch whose worker scored
them more than :data:`PROBE_TOLERANCE` apart (the sync did not take, or loaded other weights) stops the run,
naming the version.

The pipeline is :class:`rloo.training.rollouts.source.PipelinedRollouts`': the batch trained at step t is sampled
by the weights after step ``max(0, t - s)``. After optimizer step t the trainer sends the weights of step t and
asks for the batch of step ``t + s``, then trains the batch of step t + 1, which the worker sampled while the
trainer trained the one before: with s >= 1 the worker is one batch ahead. Every completion is seeded by its
group, so the worker samples what the trainer's process would (up to float rounding: the worker computes with
one thread); the reward functions run in the trainer's process (they need not be picklable).

A worker that dies (killed, out of memory) raises :class:`WorkerDied`, and so does one that hangs: it beats a
shared heartbeat at every decoded token and every second it waits, and one silent for ``heartbeat_stale_after_s``
seconds (TRL's AsyncGRPO name; TRL then aborts the run) is killed. On either the rollout source starts a new
one (it samples the same batches: every completion is seeded by its group); a worker that raises stops the run
with the traceback. A worker exits by itself when the trainer's process is gone (it checks its parent every
second). It samples on the policy's device (one GPU shared with the trainer, or the CPU) unless
``rollout_worker_devices`` names another.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from rloo.generation.sync_check import ProbeTolerance, probe_logprobs
from rloo.training.parallel import weight_sync

POLL_SECONDS = 1.0
CLOSED = ("closed",)  # put by the trainer's process itself: the reader thread stops
STARTUP_SECONDS = 600.0  # a worker's allowance to give its first sign of life (heartbeat_stale_after_s after it)
# the probe: fixed token ids whose next-token log-probs the worker and the trainer compare after each sync
PROBE_LENGTH = 16
# nats: float32 forwards on two devices or thread counts agree to ~1e-5; a step of training moves them far more
PROBE_TOLERANCE = ProbeTolerance(full=1e-3, half=0.05)


class WorkerDied(RuntimeError):
    """The worker process is gone (killed, out of memory): a new one can take its place."""


class WorkerOutOfMemory(WorkerDied):
    """The worker ran out of memory sampling a batch (``MemoryError``, ``torch.OutOfMemoryError``): a new one
    can take its place, since memory may have been short for a moment (another process, fragmentation)."""


# the last line of a traceback that ran out of memory: Python's, CUDA's, and the CPU allocator's (a RuntimeError)
OOM_ERRORS = ("MemoryError", "OutOfMemoryError", "CUDA out of memory", "can't allocate memory")
LESS_MEMORY = (
    "give sampling less at once (a smaller per_device_train_batch_size or max_completion_length, more "
    "rollout_workers to split each batch) or another device (rollout_worker_devices)"
)


def ended(exitcode: int | None) -> str:
    """How a worker process ended, in words: a signal by name (SIGKILL: what the kernel's out-of-memory
    killer sends), else its exit code."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        oom = (
            " (what the kernel's out-of-memory killer sends: `dmesg` says whether it did)" if name == "SIGKILL" else ""
        )
        return f"was killed by {name}{oom}"
    return f"died (exit code {exitcode})"


def failure(step: int, pid: int | None, trace: str, sampling: bool = True) -> RuntimeError:
    """The error for a worker's ``("error", step, traceback)`` (``sampling`` False: it failed outside a batch,
    starting up or loading weights before the batch of ``step``, and ended): :class:`WorkerOutOfMemory` when it
    ran out of memory (the run replaces it), else a ``RuntimeError`` with the traceback (the run stops)."""
    last = next((line for line in reversed(trace.strip().splitlines()) if line.strip()), "")
    doing = (
        f"sampling the batch of step {step}"
        if sampling
        else f"starting up or loading new weights before the batch of step {step}"
    )
    if any(name in last for name in OOM_ERRORS):
        return WorkerOutOfMemory(
            f"the rollout worker (pid {pid}) ran out of memory {doing} ({last.strip()}): {LESS_MEMORY}"
        )
    return RuntimeError(f"the rollout worker failed {doing}:\n{trace}")


@dataclass(frozen=True)
class Answer:
    """A sampled batch's bookkeeping: the seconds it took, the worker's idle seconds waiting for its request,
    the log-probs of the probe tokens (:func:`probe_scores`) under the weights that sampled it, and the
    seconds the worker spent receiving and loading weights since its last answer."""

    seconds: float
    idle: float
    probe: Tensor
    sync_seconds: float = 0.0


def probe_scores(model: nn.Module) -> Tensor:
    """``log p(x_{t+1} | x_<=t)`` of :data:`PROBE_LENGTH` fixed token ids under ``model`` (float32, no gradient,
    on the CPU): what the weight-sync check (:mod:`rloo.generation.sync_check`) compares."""
    vocab = int(model.get_input_embeddings().weight.shape[0])  # type: ignore[operator]
    device = next(model.parameters()).device
    ids = (torch.arange(PROBE_LENGTH, device=device) * 7919 + 11) % max(1, vocab - 1) + 1
    return probe_logprobs(model, ids, 1)


class RolloutWorker:
    """The trainer's handle on one worker process."""

    def __init__(
        self,
        model: torch.nn.Module,
        processing_class: Any,
        settings: Any,
        device: str = "cpu",
        *,
        store: Any,
        prefix: str,
        trainer_device: str = "cpu",
        stale_after: float = 300.0,
        free: bool = False,
    ) -> None:
        context = torch.multiprocessing.get_context("spawn")
        self.requests: Any = context.Queue()
        self.results: Any = context.Queue()
        self.heartbeat: Any = context.Value("d", 0.0, lock=False)  # the worker's last sign of life (0: none yet)
        self.stale_after, self.spawned = stale_after, time.time()
        self.backend = weight_sync.sync_backend(trainer_device, device)
        payload = pickle.dumps((model, processing_class, settings, device))
        channel = (store.port, prefix, self.backend, free)
        self.process = context.Process(
            target=serve,
            args=(self.requests, self.results, payload, os.getpid(), channel, self.heartbeat),
            daemon=True,
            name="rloo-rollouts",
        )
        self.process.start()
        self.inbox: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self.read, daemon=True, name="rloo-rollouts-reader").start()
        self.sender = weight_sync.WeightSender(store, prefix, self.backend, trainer_device)

    def send_weights(self, version: int, flat: tuple[weight_sync.Layout, list[Tensor]]) -> None:
        """Post a version's weights, flattened (:func:`~rloo.training.parallel.weight_sync.flatten`; the worker
        loads them before its next batch); a worker that died before joining the group is left for
        :meth:`receive` to report."""
        if not self.sender.ready(lambda: self.process.is_alive() and not self.hung(), POLL_SECONDS):
            return
        layout, flats = flat
        self.sender.send(flats)
        self.requests.put(("weights", version, layout))

    def request(
        self, step: int, prompts: list[Any], columns: dict[str, list[Any]], groups: list[int], seed: int
    ) -> None:
        self.requests.put(("sample", step, prompts, columns, groups, seed))

    def silent(self) -> float:
        """Seconds since the worker's last sign of life (since it was spawned, before its first)."""
        return time.time() - (float(self.heartbeat.value) or self.spawned)

    def hung(self) -> bool:
        """Whether the worker gave no sign of life for ``stale_after`` seconds (``heartbeat_stale_after_s``); before
        its first (importing, loading its copy of the policy) it has :data:`STARTUP_SECONDS` at least."""
        allowed = self.stale_after if self.heartbeat.value else max(self.stale_after, STARTUP_SECONDS)
        return self.silent() > allowed

    def read(self) -> None:
        """The reader thread: the worker's answers into :attr:`inbox`. A worker stopped or killed halfway through
        writing one would block a reader forever (the trainer's process holds the pipe's other end too, so no
        end-of-file comes), so the trainer never reads the pipe itself; :meth:`close` wakes a reader that waits."""
        while True:
            try:
                message = self.results.get()
            except Exception:  # a cut message: the worker is dead or being replaced
                return
            if message == CLOSED:
                return
            self.inbox.put(message)

    def receive(self, step: int) -> tuple[int, Any, Answer]:
        """``(version, SampledBatch, Answer)`` of the batch of ``step`` (the next answer: they come in order); a
        worker that died, or hung (killed here), raises :class:`WorkerDied`."""
        while True:
            try:
                message = self.inbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if self.process.is_alive() and self.hung():
                    silent = self.silent()
                    self.process.kill()
                    self.process.join(timeout=10)
                    raise WorkerDied(
                        f"the rollout worker (pid {self.process.pid}) gave no sign of life for {silent:.0f} s "
                        f"(heartbeat_stale_after_s={self.stale_after:g}) while sampling the batch of step {step}: "
                        "hung, so it was killed"
                    ) from None
                self.process.join(timeout=POLL_SECONDS)
                if not self.process.is_alive():
                    with contextlib.suppress(queue.Empty):  # its last answer, still on the reader's way
                        self.inbox.put(self.inbox.get(timeout=POLL_SECONDS))
                        continue
                    raise WorkerDied(
                        f"the rollout worker (pid {self.process.pid}) {ended(self.process.exitcode)} while "
                        f"sampling the batch of step {step}"
                    ) from None
                continue
            if message[0] == "error":
                outside = message[1] is None  # it failed outside a batch (loading weights) and is ending
                if outside:
                    self.process.join(timeout=10)
                raise failure(step, self.process.pid, message[2], sampling=not outside)
            _, answered, version, sampled, answer = message
            if answered != step:
                raise RuntimeError(f"the rollout worker answered the batch of step {answered}, expected {step}")
            return version, sampled, answer

    def close(self) -> None:
        if self.process.is_alive():
            self.requests.put(("stop",))
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.terminate()
        self.results.put(CLOSED)  # the reader's last message (after a cut one it fails to read, and ends too)


def newest_first(pending: list[Any]) -> tuple[list[Any], list[Any]]:
    """``free_running``: the ``"weights"`` messages among ``pending`` (in order: their broadcasts arrive in that
    order), to load before the next batch, the newest last; and the other messages, in order, still to do."""
    return [m for m in pending if m[0] == "weights"], [m for m in pending if m[0] != "weights"]


def serve(
    requests: Any, results: Any, payload: bytes, parent: int, channel: tuple[int, str, str, bool], heartbeat: Any
) -> None:
    """The worker's process: :class:`Serving`'s loop. An error outside a batch (loading weights: a batch's own
    are answered in its place) is answered as ``("error", None, traceback)`` before the process ends, so the
    trainer says what went wrong (out of memory: a new worker takes its place) instead of only that it died."""
    try:
        Serving(requests, results, payload, parent, channel, heartbeat).run()
    except Exception:
        with contextlib.suppress(Exception):  # the trainer's process may be gone
            results.put(("error", None, traceback.format_exc()))
            results.close()
            results.join_thread()  # the answer is written before the process ends
        raise


class Serving:
    """The worker's loop (in the spawned process). ``channel``: the trainer's store port, this worker's prefix,
    the backend of their weight-sync group and ``free_running`` (before a batch, load the newest weights
    already sent: :func:`newest_first`); ``heartbeat``: a shared number it sets to the time at every decoded
    token (through the sampler's per-token ``all_done`` callback, which it answers as a lone process does) and
    every second it waits."""

    def __init__(
        self,
        requests: Any,
        results: Any,
        payload: bytes,
        parent: int,
        channel: tuple[int, str, str, bool],
        heartbeat: Any,
    ) -> None:
        torch.set_num_threads(1)
        self.requests, self.results, self.parent, self.heartbeat = requests, results, parent, heartbeat
        self.model, self.processing_class, self.settings, device = pickle.loads(payload)
        self.model.to(device).eval().requires_grad_(False)
        self.parameters = dict(self.model.named_parameters())
        port, prefix, backend, self.free = channel
        self.receiver = weight_sync.WeightReceiver(port, prefix, backend, device)
        self.version: int | None = None
        self.probe = torch.zeros(0)
        self.idle = self.syncing = 0.0  # seconds since the last answer
        self.pending: list[Any] = []  # messages read ahead (free_running)

    def beat(self, done: bool = False) -> bool:
        self.heartbeat.value = time.time()
        return done

    def run(self) -> None:
        while True:
            self.beat()
            message = self.next_message()
            if message is None:
                if os.getppid() != self.parent:  # the trainer is gone
                    return
                continue
            if message[0] == "stop":
                return
            if message[0] == "weights":
                self.load([message])
                continue
            if self.free:  # the weights sent since this request was: the newest sample it
                self.read_ahead()
                headers, self.pending = newest_first(self.pending)
                if headers:
                    self.load(headers)
            self.sample(message)

    def next_message(self) -> Any:
        """The next message (read ahead, or from the queue), None after a second without one."""
        if self.pending:
            return self.pending.pop(0)
        waited = time.perf_counter()
        try:
            return self.requests.get(timeout=POLL_SECONDS)
        except queue.Empty:
            return None
        finally:
            self.idle += time.perf_counter() - waited

    def read_ahead(self) -> None:
        while True:
            try:
                self.pending.append(self.requests.get_nowait())
            except queue.Empty:
                return

    def load(self, headers: list[Any]) -> None:
        """Receive the versions of ``headers`` in order (their broadcasts come in that order), load the last and
        score the probe with it."""
        began = time.perf_counter()
        weights: dict[str, Tensor] = {}
        for _, self.version, layout in headers:
            weights = self.receiver.receive(layout)
        with torch.no_grad():
            for name, value in weights.items():
                self.parameters[name].copy_(value)
        self.syncing += time.perf_counter() - began
        self.beat()
        self.probe = probe_scores(self.model)

    def sample(self, message: Any) -> None:
        from rloo.pipeline import sample_batch

        _, step, prompts, columns, groups, seed = message
        began = time.perf_counter()
        try:
            with torch.no_grad():
                sampled = sample_batch(
                    self.model,
                    self.processing_class,
                    prompts,
                    columns,
                    self.settings,
                    groups,
                    generator=None,
                    sampling_seed=seed,
                    step=0,
                    all_done=self.beat,
                )
            sampled = dataclasses.replace(sampled, rollout=sampled.rollout.to("cpu"))  # no CUDA handles to share
            answer = Answer(time.perf_counter() - began, self.idle, self.probe, self.syncing)
            self.results.put(("batch", step, self.version, sampled, answer))
            self.idle = self.syncing = 0.0
        except Exception:
            self.results.put(("error", step, traceback.format_exc()))
