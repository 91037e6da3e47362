"""The progress line's time left: the mean step time so far times the steps left (issue 43)."""

from __future__ import annotations

import io

from rich.console import Console

from rloo.training.monitoring.progress import TrainingProgress, time_left


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
