"""The console's start-up line and log lines (rloo.training.monitoring.logs)."""

from __future__ import annotations

from rloo.training.monitoring.logs import device_text


def test_the_start_up_line_names_the_precision_never_accelerates_no() -> None:
    assert device_text("cpu", "no", sharded=False) == "cpu (fp32)"
    assert device_text("cuda:0", "bf16", sharded=True) == "cuda:0 (bf16, FSDP2)"
