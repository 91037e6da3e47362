"""A live training bar (rich) and a clean Ctrl-C: finish the step, save, say how to resume."""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class TrainingProgress:
    """``step i/N [bar] ETA reward=.. kl=.. tok/s=..``, refreshed after every step."""

    def __init__(self, console: Console, total: int, completed: int) -> None:
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
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, step: int, metrics: dict[str, float]) -> None:
        parts = [f"reward={metrics['reward']:.3f}"] if "reward" in metrics else []
        if "kl" in metrics:
            parts.append(f"kl={metrics['kl']:.4f}")
        if "tokens_per_second" in metrics:
            parts.append(f"tok/s={metrics['tokens_per_second']:.0f}")
        self._progress.update(self._task, completed=step, stats=" ".join(parts))


class StopRequest:
    """While active, the first Ctrl-C only asks the loop to stop after the current step;
    a second one interrupts at once. Outside the main thread it does nothing."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
