"""A live training bar (rich): the last step's numbers and the time left (stop signals:
:mod:`rloo.training.monitoring.signals`)."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from rloo.report import metric_names as names


class TrainingProgress:
    """``step i/N [bar] ETA last step: reward=.. kl=.. tok/s=..``, refreshed after every step.

    The bar shows the last step's numbers (the log lines show means over ``logging_steps``; both
    say which), and is cleared when training ends, so no stale bar is left below the last log
    and the summary. When the console is not a terminal (output piped to ``tee``, a scheduler's
    log) rich draws no live bar, so a plain ``step i/N last step: ...`` line is printed instead,
    at most every ``interval`` seconds, and at the last step (before its log line).
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
            transient=True,
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
        parts = [f"reward={metrics[names.REWARD]:.3f}"] if names.REWARD in metrics else []
        if names.KL in metrics:
            parts.append(f"kl={metrics[names.KL]:.4f}")
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
