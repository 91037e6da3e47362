"""A clean stop on Ctrl-C, SIGTERM or SIGHUP: finish the step, save a checkpoint, say how to resume."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from rich.markup import escape

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class TrainingInterrupted(KeyboardInterrupt):
    """A stop signal ended training after a checkpoint was written; ``exit_code`` is 128 + the signal."""

    def __init__(self, signum: int, checkpoint: Path) -> None:
        super().__init__(f"{signal.Signals(signum).name}: checkpoint saved to {checkpoint}")
        self.signum, self.checkpoint, self.exit_code = signum, checkpoint, 128 + signum


def interrupted_message(step: int, checkpoint: Path, output_dir: Path, cli: bool) -> str:
    """What the trainer prints after a stop signal's checkpoint (rich markup: paths escaped): how to resume,
    in Python and, when its ``config.yaml`` re-runs the run (``cli``), with ``rloo train``."""
    resume = escape(f"rloo train {output_dir / 'config.yaml'} --resume")  # user text: no markup
    how = (
        f"trainer.train(resume_from_checkpoint=True) or `{resume}`"
        if cli
        else "trainer.train(resume_from_checkpoint=True)"
    )
    return f"interrupted at step {step}: checkpoint saved to {escape(str(checkpoint))}. Resume with {how}."


def note_resume(error: BaseException, checkpoint: Path | None, output_dir: Path, cli: bool) -> None:
    """Add to an ``error`` that stopped a run in mid-training (a lost vLLM server, a worker that keeps dying)
    its newest ``checkpoint`` and how to resume once the cause is fixed (an exception note: tracebacks and
    ``rloo train``'s one-line error show it); nothing when no checkpoint was written yet."""
    if checkpoint is None:
        return
    how = f"`rloo train {output_dir / 'config.yaml'} --resume`" if cli else "trainer.train(resume_from_checkpoint=True)"
    error.add_note(f"The run's newest checkpoint is {checkpoint}: once the cause is fixed, resume with {how}.")


_exiting = {"quiet": False}


def _while_exiting(signum: int, frame: FrameType | None) -> None:
    """A stop signal once the run has stopped and the process is exiting (its checkpoint, if any, is
    written): said so, not a ``KeyboardInterrupt`` traceback from an atexit callback; another one
    ends the process at once, as the signal's default does."""
    if _exiting["quiet"]:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _exiting["quiet"] = True
    sys.stderr.write(
        f"\n{signal.Signals(signum).name} received while exiting: the run has already stopped, exiting "
        "(send it again to exit at once)\n"
    )


def quiet_until_exit() -> None:
    """From now until the process exits, stop signals are acknowledged instead of raising
    (:func:`_while_exiting`): for a process whose run stopped and that is exiting. Main thread only."""
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            signal.signal(signum, _while_exiting)


class StopRequest:
    """While active, the first Ctrl-C, SIGTERM or SIGHUP (what schedulers send before a kill) asks
    the loop to stop after the current step and says so; a second one interrupts at once.
    Outside the main thread it does nothing. On leaving, the previous handlers come back; after a
    stop the process's own handler (:func:`quiet_until_exit`) is put back when the process exits
    (an atexit callback, registered after the others, so it runs before them): a further signal while
    exiting is acknowledged, never a traceback."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.signum = signum
        sys.stderr.write(
            f"\n{signal.Signals(signum).name} received: stopping after this step and saving a checkpoint "
            "(send it again to stop at once, without one)\n"
        )

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if self._previous and self.requested:  # registered anew: the latest runs first
            atexit.unregister(quiet_until_exit)
            atexit.register(quiet_until_exit)
        self._previous = {}
