"""A live training bar (rich): the last step's numbers and the time left (stop signals:
:mod:`rloo.training.monitoring.signals`)."""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from rloo.report import metric_names as names


def time_left(elapsed: float, done: int, remaining: int) -> str:
    """``(1:10 left)``: the mean time of the ``done`` steps so far (``elapsed`` seconds) times the
    ``remaining`` ones, as m:ss (h:mm:ss from an hour); "" before the first step and after the last."""
    if done <= 0 or remaining <= 0:
        return ""
    seconds = round(elapsed / done * remaining)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    shown = f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
    return f"({shown} left)"


class TrainingProgress:
    """``step i/N [bar] (m:ss left) last step: reward=.. kl=.. tok/s=..``, refreshed after every step.

    The time left is the mean step time of this run so far (set-up excluded; a resumed run's
    earlier steps not counted) times the steps left to ``max_steps``. The bar shows the last step's
    numbers (the log lines show means over ``logging_steps``; both say which), and is cleared when
    training ends, so no stale bar is left below the last log and the summary. When the console is
    not a terminal (output piped to ``tee``, a scheduler's log) rich draws no live bar, so a plain
    ``step i/N (m:ss left) last step: ...`` line is printed instead, at most every ``interval``
    seconds, and at the last step (before its log line). ``clock``: seconds (tests pass their own).
    """

    def __init__(
        self,
        console: Console,
        total: int,
        completed: int,
        interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console, self.total, self.interval, self.clock = console, total, interval, clock
        self.plain = not console.is_terminal
        self._start, self._first = clock(), completed
        self._last_line = self._start
        self._progress = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[left]}"),
            TextColumn("{task.fields[stats]}"),
            console=console,
            transient=True,
        )
        self._task = self._progress.add_task("train", total=total, completed=completed, stats="", left="")

    def __enter__(self) -> TrainingProgress:
        if not self.plain:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.plain:
            self._progress.stop()

    def update(self, step: int, metrics: dict[str, float]) -> None:
        parts = [f"reward={metrics[names.REWARD]:.3f}"] if names.REWARD in metrics else []
        if names.KL in metrics:
            parts.append(f"kl={metrics[names.KL]:.4f}")
        if "tokens_per_second" in metrics:
            parts.append(f"tok/s={metrics['tokens_per_second']:.0f}")
        stats = "last step: " + " ".join(parts)
        now = self.clock()
        left = time_left(now - self._start, step - self._first, self.total - step)
        if not self.plain:
            self._progress.update(self._task, completed=step, stats=stats, left=left)
            return
        if now - self._last_line >= self.interval or step == self.total:
            self._last_line = now
            self.console.print(f"step {step}/{self.total} {left + ' ' if left else ''}{stats}", highlight=False)
