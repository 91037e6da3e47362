"""The step's phases and their timer: each phase is one call in a named timer, logged as ``timing/<phase>``.

A generation batch goes through (``RLOOTrainer._train_on_next_batch``, read top to bottom):

1-2. ``rollout``     the rollout source's next batch of scored groups; the source reports the two
                     phases inside it, ``generate`` and ``score`` (an asynchronous source would
                     report its workers', and ``rollout`` the time the trainer waited);
3.   ``logprobs``    reference and old log-probs;
4.   ``advantages``  KL penalty, baseline, the batch's metrics;
     ``diagnostics`` the completion log and the gradient-variance probe, when due;
5.   ``update``      forward/backward passes and the optimizer step, once per optimizer step;
6.   ``log``         logging, evaluation and checkpoints after each optimizer step.

Timings are this process's wall-clock seconds. A step logs the batch's phases 1-4, its own
``update``, and the ``log`` phase before it (its own is not over when it is logged). The same
shape as verl's ``marked_timer`` and torchtune's "# step N" blocks.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from rloo.report import metric_names as names

# every phase a step is timed in, in order (``timing/<phase>``)
PHASES = ("rollout", "generate", "score", "logprobs", "advantages", "diagnostics", "update", "log")
BATCH_PHASES = ("rollout", "logprobs", "advantages", "diagnostics")  # once per generation batch, outside the update


class PhaseTimer:
    """The last duration of each phase, in seconds."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.record(phase, time.perf_counter() - start)

    def record(self, phase: str, seconds: float) -> None:
        """``phase`` took ``seconds`` (a phase timed elsewhere, e.g. inside the rollout source)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}: the step's phases are {PHASES}")
        self.last[phase] = seconds

    def step_metrics(self, steps_per_generation: int, completion_tokens: float) -> dict[str, float]:
        """``timing/<phase>`` of the last optimizer step; ``timing/step``: its update plus its share of the
        batch's phases 1-4 (diagnostics included); ``step_time`` (TRL's name): its update; ``tokens_per_second``:
        completion tokens generated (by every process) per second of the batch's phases 1-5."""
        update = self.last["update"]
        batch_seconds = sum(self.last.get(phase, 0.0) for phase in BATCH_PHASES)
        seconds = batch_seconds + update * steps_per_generation
        return {
            **{names.timing(phase): self.last[phase] for phase in PHASES if phase in self.last},
            names.timing("step"): update + batch_seconds / steps_per_generation,
            "step_time": update,
            "tokens_per_second": completion_tokens / max(seconds, 1e-9),
        }
