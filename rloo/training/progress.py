"""A live training bar (rich) and a clean Ctrl-C: finish the step, save, say how to resume."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class TrainingProgress:
    """``step i/N [bar] ETA last step: reward=.. kl=.. tok/s=..``, refreshed after every step.

    The bar shows the last step's numbers (the log lines show means over ``logging_steps``; both
    say which). When the console is not a terminal (output piped to ``tee``, a scheduler's log)
    rich draws no live bar, so a plain ``step i/N last step: ...`` line is printed instead, at most
    every ``interval`` seconds, and at the last step.
    """

    def __init__(self, console: Console, total: int, completed: int, interval: float = 30.0) -> None:
        self.console, self.total, self.interval = console, total, interval
        self.plain = not console.is_terminal
        self._last_line = time.monotonic()
        self._progress = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[stats]}"),
            console=console,
            transient=False,
        )
        self._task = self._progress.add_task("train", total=total, completed=completed, stats="")

    def __enter__(self) -> TrainingProgress:
        if not self.plain:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.plain:
            self._progress.stop()

    def update(self, step: int, metrics: dict[str, float]) -> None:
        parts = [f"reward={metrics['reward']:.3f}"] if "reward" in metrics else []
        if "kl" in metrics:
            parts.append(f"kl={metrics['kl']:.4f}")
        if "tokens_per_second" in metrics:
            parts.append(f"tok/s={metrics['tokens_per_second']:.0f}")
        stats = "last step: " + " ".join(parts)
        if not self.plain:
            self._progress.update(self._task, completed=step, stats=stats)
            return
        now = time.monotonic()
        if now - self._last_line >= self.interval or step == self.total:
            self._last_line = now
            self.console.print(f"step {step}/{self.total} {stats}", highlight=False)


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class TrainingInterrupted(KeyboardInterrupt):
    """A stop signal ended training after a checkpoint was written; ``exit_code`` is 128 + the signal."""

    def __init__(self, signum: int, checkpoint: Path) -> None:
        super().__init__(f"{signal.Signals(signum).name}: checkpoint saved to {checkpoint}")
        self.signum, self.checkpoint, self.exit_code = signum, checkpoint, 128 + signum


class StopRequest:
    """While active, the first Ctrl-C, SIGTERM or SIGHUP (what schedulers send before a kill) asks
    the loop to stop after the current step and says so; a second one interrupts at once.
    Outside the main thread it does nothing."""

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
        self._previous = {}
