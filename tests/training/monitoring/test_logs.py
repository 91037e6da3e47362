"""The console's start-up line and log lines (rloo.training.monitoring.logs)."""

from __future__ import annotations

from typing import Any

from rloo.training.monitoring.logs import device_text, log_console, log_line


def test_the_start_up_line_names_the_precision_never_accelerates_no() -> None:
    assert device_text("cpu", "no", sharded=False) == "cpu (fp32)"
    assert device_text("cuda:0", "bf16", sharded=True) == "cuda:0 (bf16, FSDP2)"


def test_the_end_of_training_summary_is_a_line_of_its_own_not_a_bare_step_line() -> None:
    """It printed ``step 30/30 `` after the last log (issue 24): the summary holds no step metric."""
    summary = {"train_runtime": 12.34, "train_steps_per_second": 2.43, "train_loss": 1.5e-9}
    line = log_line(30, 30, {"step": 30.0, "epoch": 0.6, **summary})
    assert line == "trained to step 30/30 in 12.3 s (2.43 steps/s), train_loss=0"  # float noise around 0
    assert log_line(3, 30, {"reward": 0.5, "kl": 0.01}) == "step 3/30 reward=0.5 kl=0.01"


def test_log_lines_are_not_wrapped_when_piped(capsys: Any, monkeypatch: Any) -> None:
    """Piped output was hard-wrapped at 80 columns (issue 24); a terminal still wraps at its width."""
    log_console(stderr=True).print("step 1/30 " + " ".join(f"metric_{i}=0.123456" for i in range(12)))
    assert len(capsys.readouterr().err.splitlines()) == 1
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: as if a terminal
    assert log_console(stderr=True).soft_wrap is False


def test_float_noise_around_zero_prints_as_zero_on_the_console() -> None:
    # a group of equal rewards gives reward_std ~4e-9 in float32; the loss is ~0 by construction
    line = log_line(3, 30, {"reward": 0.5, "reward_std": 3.983e-09, "loss": -1.907e-08, "kl": 2.5e-06})
    assert line == "step 3/30 reward=0.5 reward_std=0 kl=2.5e-06 loss=0"
