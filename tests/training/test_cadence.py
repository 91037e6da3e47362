"""When a step logs, and which step a generation batch's completions are logged under (rloo/training/cadence.py)."""

from __future__ import annotations

from pathlib import Path

from rloo.training.cadence import completions_step, logging_due
from tests.helpers.models import config


def test_a_batch_logs_its_completions_under_the_first_logged_step_it_trains(tmp_path: Path) -> None:
    # two optimizer steps per generation batch (num_iterations=2), a metrics row every 3 steps and at the last
    args = config(tmp_path, num_iterations=2, logging_steps=3, max_steps=5)
    assert args.optimizer_steps_per_generation == 2
    assert [step for step in range(1, 6) if logging_due(args, step, 5)] == [3, 5]
    # batches drawn at global_step 0 (trains 1-2), 2 (3-4), 4 (5: max_steps cuts it)
    assert [completions_step(args, drawn, 5) for drawn in (0, 2, 4)] == [None, 3, 5]
    first = config(tmp_path, logging_steps=3, max_steps=5, logging_first_step=True)
    assert [completions_step(first, drawn, 5) for drawn in range(5)] == [1, None, 3, None, 5]
