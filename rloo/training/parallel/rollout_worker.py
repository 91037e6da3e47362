"""Sampling in a worker process (``max_staleness`` >= 1 with ``rollout_workers: 1``): generation overlaps training.

The worker is a spawned process holding its own copy of the policy, the tokenizer and the sampling settings;
the trainer's process keeps the prompt order, the reward functions and the optimizer. They speak through two
queues (torch's multiprocessing: tensors travel through shared memory):

- ``("weights", version, trainable_weights)``: load them (the trainable parameters: a LoRA policy's adapters);
- ``("sample", step, prompts, columns, group_ids, seed)``: sample the batch of ``step`` with the weights loaded
  last, answered with ``("batch", step, version, SampledBatch, seconds)`` (or ``("error", step, traceback)``);
- ``("stop",)``.

The pipeline is :class:`rloo.training.rollouts.source.PipelinedRollouts`': the batch trained at step t is sampled
by the weights after step ``max(0, t - s)``. After optimizer step t the trainer sends the weights of step t and
asks for the batch of step ``t + s``, then trains the batch of step t + 1, which the worker sampled while the
trainer trained the one before: with s >= 1 the worker is one batch ahead. Every completion is seeded by its
group, so the worker samples what the trainer's process would (up to float rounding: the worker computes with
one thread); the reward functions run in the trainer's process (they need not be picklable).

A worker that dies (killed, out of memory) or raises stops the run with a message naming it and the step; it
exits by itself when the trainer's process is gone (it checks its parent every second).
"""

from __future__ import annotations

import os
import pickle
import queue
import time
import traceback
from typing import Any

import torch

POLL_SECONDS = 1.0


class RolloutWorker:
    """The trainer's handle on one worker process."""

    def __init__(self, model: torch.nn.Module, processing_class: Any, settings: Any) -> None:
        context = torch.multiprocessing.get_context("spawn")
        self.requests: Any = context.Queue()
        self.results: Any = context.Queue()
        payload = pickle.dumps((model, processing_class, settings))
        self.process = context.Process(
            target=serve, args=(self.requests, self.results, payload, os.getpid()), daemon=True, name="rloo-rollouts"
        )
        self.process.start()

    def send_weights(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        self.requests.put(("weights", version, weights))

    def request(
        self, step: int, prompts: list[Any], columns: dict[str, list[Any]], groups: list[int], seed: int
    ) -> None:
        self.requests.put(("sample", step, prompts, columns, groups, seed))

    def receive(self, step: int) -> tuple[int, Any, float]:
        """``(version, SampledBatch, seconds)`` of the batch of ``step`` (the next answer: they come in order)."""
        while True:
            try:
                message = self.results.get(timeout=POLL_SECONDS)
            except (queue.Empty, EOFError, OSError):  # a killed worker can leave its pipe cut mid-message
                self.process.join(timeout=POLL_SECONDS)
                if not self.process.is_alive():
                    raise RuntimeError(
                        f"the rollout worker (pid {self.process.pid}) died (exit code {self.process.exitcode}) while "
                        f"sampling the batch of step {step}; the run stops: resume it from its last checkpoint "
                        "(rloo train ... --resume), with rollout_workers=0 if the worker keeps dying (memory?)"
                    ) from None
                continue
            if message[0] == "error":
                raise RuntimeError(f"the rollout worker failed sampling the batch of step {message[1]}:\n{message[2]}")
            _, answered, version, sampled, seconds = message
            if answered != step:
                raise RuntimeError(f"the rollout worker answered the batch of step {answered}, expected {step}")
            return version, sampled, seconds

    def close(self) -> None:
        if self.process.is_alive():
            self.requests.put(("stop",))
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.terminate()


def serve(requests: Any, results: Any, payload: bytes, parent: int) -> None:
    """The worker's loop (in the spawned process)."""
    from rloo.pipeline import sample_batch

    torch.set_num_threads(1)
    model, processing_class, settings = pickle.loads(payload)
    model.eval().requires_grad_(False)
    parameters = dict(model.named_parameters())
    version = None
    while True:
        try:
            message = requests.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if os.getppid() != parent:  # the trainer is gone
                return
            continue
        if message[0] == "stop":
            return
        if message[0] == "weights":
            _, version, weights = message
            with torch.no_grad():
                for name, value in weights.items():
                    parameters[name].copy_(value)
            continue
        _, step, prompts, columns, groups, seed = message
        began = time.perf_counter()
        try:
            with torch.no_grad():
                sampled = sample_batch(
                    model,
                    processing_class,
                    prompts,
                    columns,
                    settings,
                    groups,
                    generator=None,
                    sampling_seed=seed,
                    step=0,
                    all_done=None,
                )
            results.put(("batch", step, version, sampled, time.perf_counter() - began))
        except Exception:
            results.put(("error", step, traceback.format_exc()))
