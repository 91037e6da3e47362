"""The step's seam and phases: rollouts come only from the rollout source, each stamped with the policy
version that sampled it; every phase of the step is timed and logged as ``timing/<phase>``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rloo.pipeline import ScoredRollout
from rloo.training.rollouts.source import SynchronousRollouts
from rloo.training.rollouts.versions import check_policy_version
from rloo.training.timing import PHASES, PhaseTimer
from tests.helpers.models import trainer


def test_the_timer_keeps_each_phases_last_duration_and_the_step_share() -> None:
    timer = PhaseTimer()
    for phase, seconds in {"rollout": 3.0, "generate": 2.0, "score": 0.5, "logprobs": 1.0, "advantages": 2.0}.items():
        timer.record(phase, seconds)
    timer.record("update", 9.0)
    timer.record("update", 1.0)  # the second optimizer step of the batch
    metrics = timer.step_metrics(steps_per_generation=2, completion_tokens=80.0)
    assert metrics["timing/update"] == metrics["step_time"] == 1.0
    assert metrics["timing/step"] == 1.0 + (3.0 + 1.0 + 2.0) / 2  # generate/score are inside rollout
    assert metrics["tokens_per_second"] == 80.0 / (6.0 + 1.0 * 2)
    assert "timing/log" not in metrics  # no log phase before the first step
    with pytest.raises(ValueError, match=r"unknown phase 'train'.*'rollout'"):
        timer.record("train", 1.0)


def test_every_phase_is_logged_and_every_batch_carries_its_policy_version(tmp_path: Path) -> None:
    t = trainer(tmp_path, max_steps=3, log_completions=True, num_iterations=2)
    t.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "loss" in row]
    assert [row["step"] for row in steps] == [1, 2, 3]
    assert all(f"timing/{phase}" in steps[-1] for phase in PHASES)
    assert all(row[f"timing/{phase}"] >= 0 for row in steps for phase in PHASES if f"timing/{phase}" in row)
    # two optimizer steps per batch (num_iterations=2): the batch of step 1 was sampled by the policy of step 0
    assert [row["policy_version"] for row in steps] == [0.0, 0.0, 2.0]
    completions = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert {row["policy_version"] for row in completions} == {0, 2}


class RecordingSource:
    """A rollout source over another one: records what it hands out, and can lag the policy."""

    def __init__(self, inner: SynchronousRollouts, lag: int = 0) -> None:
        self.inner, self.lag = inner, lag
        self.handed: list[ScoredRollout] = []

    @property
    def groups_drawn(self) -> int:
        return self.inner.groups_drawn

    @groups_drawn.setter
    def groups_drawn(self, value: int) -> None:
        self.inner.groups_drawn = value

    def next_batch(self) -> ScoredRollout:
        self.handed.append(self.inner.next_batch())
        return self.handed[-1]

    def policy_updated(self, version: int) -> None:
        self.inner.policy_updated(max(0, version - self.lag))

    def state(self) -> dict[str, Any]:
        return self.inner.state()

    def restore(self, state: dict[str, Any]) -> None:
        self.inner.restore(state)

    def close(self) -> None:
        self.inner.close()

    def metrics(self) -> dict[str, float]:
        return self.inner.metrics()


def test_the_trainer_takes_its_rollouts_from_the_source_only(tmp_path: Path) -> None:
    t = trainer(tmp_path, max_steps=2)
    assert isinstance(t.rollouts, SynchronousRollouts)
    source = RecordingSource(t.rollouts)
    t.rollouts = source
    t.train()
    assert [scored.policy_version for scored in source.handed] == [0, 1]
    assert t.state.num_groups_seen == source.groups_drawn == 2 * t.args.prompts_per_generation


def test_a_batch_sampled_by_another_policy_than_the_trained_one_is_refused(tmp_path: Path) -> None:
    t = trainer(tmp_path, max_steps=3)
    t.rollouts = RecordingSource(t.rollouts, lag=1)  # misses a weight update
    with pytest.raises(RuntimeError, match=r"trained at step 1 were sampled by the policy of step 0"):
        t.train()


def test_the_check_passes_on_the_step_being_trained() -> None:
    scored: Any = type("Scored", (), {"policy_version": 4})()
    check_policy_version(scored, 4)
    with pytest.raises(RuntimeError, match="missed a weight update"):
        check_policy_version(scored, 5)
