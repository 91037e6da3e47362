"""Never train on in silence after a NaN: config, skipped steps, the stop, no non-finite weights saved."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from rloo import RLOOConfig
from rloo.training.monitoring.nonfinite import NonFiniteGuard, NonFiniteTrainingError
from tests.helpers.models import trainer


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", math.inf),
        ("learning_rate", math.nan),
        ("reward_weights", [1.0, math.nan]),
        ("reward_clip_range", (0.0, math.nan)),
        ("beta", math.inf),
        ("max_grad_norm", math.inf),
        ("entropy_coef", math.nan),
    ],
)
def test_non_finite_settings_are_rejected_at_construction(field: str, value: Any) -> None:
    # before: NaN reward_weights / reward_clip_range or temperature=inf trained to the end
    with pytest.raises(ValueError, match=rf"RLOOConfig.{field}=.* is invalid: must be finite"):
        RLOOConfig(**{field: value})


def test_epsilon_high_below_epsilon_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"epsilon_high=0.1 is invalid: must be >= epsilon \(0.2\)"):
        RLOOConfig(epsilon_high=0.1)
    assert RLOOConfig(epsilon_high=0.1, clip_ratio=False).algorithm.clip_ratio is False  # no clip: no constraint


def test_guard_counts_skips_and_stops_after_the_limit() -> None:
    guard = NonFiniteGuard(limit=2)
    assert guard.step_is_finite([0.5], 1.0, step=1)
    assert not guard.step_is_finite([math.nan], 1.0, step=2)
    assert guard.step_is_finite([0.5], 2.0, step=3)  # a finite step resets the run of bad ones
    assert not guard.step_is_finite([0.5], math.inf, step=4)
    with pytest.raises(NonFiniteTrainingError, match="training stopped at step 5: the last 2 optimizer steps"):
        guard.step_is_finite([], math.nan, step=5)
    assert guard.total == 3


class NanGradientsFrom:
    """From the end of step ``step`` on, every gradient of the first parameter is NaN."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer: Any) -> None:
        if trainer.state.global_step == self.step:
            first = next(p for p in trainer.model.parameters() if p.requires_grad)
            first.register_hook(lambda grad: grad * math.nan)


def test_non_finite_gradients_skip_the_step_then_stop_the_run(tmp_path: Path) -> None:
    # before: NaN gradients were applied (NaN weights) and training ran to the end with exit 0
    t = trainer(tmp_path, max_steps=10, save_steps=1, max_nonfinite_steps=3, logging_steps=1)
    t.add_callback(NanGradientsFrom(step=2))
    with pytest.raises(
        NonFiniteTrainingError, match=r"stopped at step 5: the last 3 optimizer steps.*lower learning_rate"
    ):
        t.train()
    run = tmp_path / "run"
    assert sorted(p.name for p in run.glob("checkpoint-*")) == [
        "checkpoint-1",
        "checkpoint-2",
        "checkpoint-3",
        "checkpoint-4",
    ]
    good, skipped = (
        load_file(str(run / "checkpoint-2" / "model.safetensors")),
        load_file(str(run / "checkpoint-4" / "model.safetensors")),
    )
    assert all(torch.equal(good[k], skipped[k]) for k in good)  # the skipped steps made no update
    assert all(bool(v.isfinite().all()) for v in skipped.values())
    assert [row["train/nonfinite_steps"] for row in t.state.log_history if "reward" in row] == [0.0, 0.0, 1.0, 2.0]
    # the schedule advanced only on the 2 steps that updated the weights (issue 25: it stepped on skipped ones)
    assert t.scheduler.last_epoch == 2
    assert "non-finite loss or gradient and was skipped" in (run / "warnings.log").read_text()
    assert not (run / "final").exists()


def test_weights_that_are_not_finite_are_never_written(tmp_path: Path) -> None:
    t = trainer(tmp_path, max_steps=1)
    with torch.no_grad():
        next(t.unwrapped_model.parameters())[0, 0] = math.nan
    with pytest.raises(NonFiniteTrainingError, match=r"not writing .*final: weight .* is not finite"):
        t.save_model(str(tmp_path / "final"))
    assert not (tmp_path / "final").exists()
