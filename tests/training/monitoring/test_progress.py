"""The progress line's time left (issue 43) and what the run waits for (issue 42)."""

from __future__ import annotations

import io
import time
from typing import Any, cast

from rich.console import Console

from rloo.training.monitoring.progress import TrainingProgress, WaitColumn, WaitReports, time_left
from rloo.waiting import Wait, current_wait, waiting_for


def test_time_left_is_the_mean_step_time_so_far_times_the_steps_left() -> None:
    assert time_left(30.0, done=3, remaining=7) == "(1:10 left)"  # 10 s a step x 7
    assert time_left(10.0, done=1, remaining=999) == "(2:46:30 left)"  # 9990 s
    assert time_left(0.4, done=2, remaining=3) == "(0:01 left)"  # 0.6 s, rounded
    assert time_left(5.0, done=0, remaining=3) == ""  # no step yet: nothing to go by
    assert time_left(5.0, done=5, remaining=0) == ""  # done


def test_a_resumed_run_counts_only_its_own_steps() -> None:
    """Resumed at step 5 of 10, the first step after 20 s: 4 steps left at 20 s each."""
    out = io.StringIO()
    ticks = iter([100.0, 120.0])
    console = Console(file=out, force_terminal=False, width=200)
    progress = TrainingProgress(console, total=10, completed=5, interval=0.0, clock=lambda: next(ticks))
    with progress:
        progress.update(6, {"reward": 0.25})
    assert out.getvalue().splitlines() == ["step 6/10 (1:20 left) last step: reward=0.250"]


def test_the_terminal_bar_shows_the_same_time_left() -> None:
    ticks = iter([0.0, 30.0])
    console = Console(file=io.StringIO(), force_terminal=True, width=120, color_system=None)
    progress = TrainingProgress(console, total=10, completed=0, clock=lambda: next(ticks))
    progress.update(3, {"reward": 0.5})
    (task,) = progress._progress.tasks
    assert task.fields["left"] == "(1:10 left)" and task.completed == 3


def test_a_wait_is_printed_after_a_few_seconds_then_each_time_it_doubles() -> None:
    """On a console that is not a terminal (a scheduler's log): 5 s, 10 s, 20 s, ... never every tick."""
    reports = WaitReports(after=5.0)
    wait = Wait("the vLLM server at http://127.0.0.1:8000 (/generate/)", since=0.0)
    lines = [(t, reports.due(wait, float(t))) for t in range(0, 50)]
    printed = [(t, line) for t, line in lines if line is not None]
    assert [t for t, _ in printed] == [5, 10, 20, 40]
    assert printed[0][1] == "waiting for the vLLM server at http://127.0.0.1:8000 (/generate/) (5 s)"
    assert reports.due(None, 60.0) is None
    assert reports.due(Wait("sampling", since=58.0), 63.0) == "waiting for sampling (5 s)"  # a new wait: anew


def test_the_live_bar_names_the_wait_once_it_has_lasted_a_few_seconds() -> None:
    column, task = WaitColumn(after=5.0), cast(Any, None)
    with waiting_for("reward function `judge` (8 completions)"):
        assert column.render(task).plain == ""  # a short wait is not news
        begun(7.0)
        assert column.render(task).plain == "waiting for reward function `judge` (8 completions) (7 s)"
        with waiting_for("the vLLM server at http://127.0.0.1:8000 (/health/)"):  # a short try inside it
            assert column.render(task).plain.startswith("waiting for reward function `judge`")
    assert column.render(task).plain == ""


def begun(seconds_ago: float) -> None:
    """The newest open wait, as if it had begun ``seconds_ago``."""
    wait = current_wait()
    assert wait is not None
    object.__setattr__(wait, "since", time.monotonic() - seconds_ago)


def test_a_plain_console_prints_a_long_wait_while_the_step_has_not_ended() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with TrainingProgress(console, total=3, completed=0, tick=0.01), waiting_for("a rollout worker (step 1)"):
        begun(5.0)
        for _ in range(500):
            if "waiting for" in out.getvalue():
                break
            time.sleep(0.01)
    assert out.getvalue().startswith("waiting for a rollout worker (step 1) (5 s)"), out.getvalue()
