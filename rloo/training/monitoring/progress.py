"""A live training bar (rich): the last step's numbers, the time left, and what the run waits for when a wait
passes a few seconds (:mod:`rloo.waiting`; stop signals: :mod:`rloo.training.monitoring.signals`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TextColumn
from rich.text import Text

from rloo import waiting
from rloo.report import metric_names as names

WAIT_SHOWN_AFTER = 5.0  # seconds a wait lasts before the progress line names it


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


class WaitReports:
    """When to print a wait on a console that is not a terminal: once it has lasted ``after`` seconds, then
    each time its length doubles (5 s, 10 s, 20 s, ...: a wait of an hour prints ~10 lines)."""

    def __init__(self, after: float = WAIT_SHOWN_AFTER) -> None:
        self.after = after
        self._wait: waiting.Wait | None = None
        self._next = after

    def due(self, wait: waiting.Wait | None, now: float) -> str | None:
        """The line to print now about ``wait`` (None: nothing due)."""
        if wait is None:
            return None
        if wait != self._wait:
            self._wait, self._next = wait, self.after
        seconds = wait.seconds(now)
        if seconds < self._next:
            return None
        self._next = 2 * seconds
        return waiting.describe(wait, now)


class WaitColumn(ProgressColumn):
    """The live bar's column naming the current wait once it has lasted ``after`` seconds (read at every refresh)."""

    def __init__(self, after: float = WAIT_SHOWN_AFTER) -> None:
        super().__init__()
        self.after = after

    def render(self, task: Task) -> Text:
        wait = waiting.current_wait(lasted=self.after)
        if wait is None:
            return Text("")
        return Text(waiting.describe(wait, time.monotonic()), style="yellow")


class TrainingProgress:
    """``step i/N [bar] (m:ss left) last step: reward=.. kl=.. tok/s=..``, refreshed after every step.

    The time left is the mean step time of this run so far (set-up excluded; a resumed run's
    earlier steps not counted) times the steps left to ``max_steps``. The bar shows the last step's
    numbers (the log lines show means over ``logging_steps``; both say which), and is cleared when
    training ends, so no stale bar is left below the last log and the summary. When the console is
    not a terminal (output piped to ``tee``, a scheduler's log) rich draws no live bar, so a plain
    ``step i/N (m:ss left) last step: ...`` line is printed instead, at most every ``interval``
    seconds, and at the last step (before its log line). ``clock``: seconds (tests pass their own).

    A wait (:mod:`rloo.waiting`: sampling, a reward function, a tool, the vLLM server, a rollout worker) that
    has lasted :data:`WAIT_SHOWN_AFTER` seconds is named: in the live bar's last column, else in a plain
    ``waiting for ... (12 s)`` line (:class:`WaitReports`), from a daemon thread that looks every ``tick`` s.
    """

    def __init__(
        self,
        console: Console,
        total: int,
        completed: int,
        interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        tick: float = 1.0,
    ) -> None:
        self.console, self.total, self.interval, self.clock, self.tick = console, total, interval, clock, tick
        self.plain = not console.is_terminal
        self._start, self._first = clock(), completed
        self._last_line = self._start
        self._progress = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("{task.fields[left]}"),
            TextColumn("{task.fields[stats]}"),
            WaitColumn(),
            console=console,
            transient=True,
        )
        self._task = self._progress.add_task("train", total=total, completed=completed, stats="", left="")
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None

    def __enter__(self) -> TrainingProgress:
        if not self.plain:
            self._progress.start()
        else:
            self._stopped.clear()
            self._watcher = threading.Thread(target=self._watch_waits, daemon=True, name="rloo-waits")
            self._watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.plain:
            self._progress.stop()
        self._stopped.set()
        if self._watcher is not None:
            self._watcher.join()
            self._watcher = None

    def _watch_waits(self) -> None:
        """Print the current wait when :class:`WaitReports` says (a plain console: no live bar to show it)."""
        reports = WaitReports()
        while not self._stopped.wait(self.tick):
            line = reports.due(waiting.current_wait(lasted=reports.after), time.monotonic())
            if line is not None:
                self.console.print(line, highlight=False)

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
