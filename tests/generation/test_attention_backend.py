"""The SDPA backend order a run holds on a GPU: flash and efficient before cuDNN, restored after."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend

from rloo.generation.attention_backend import ENV, sdpa_priority


def order() -> list[int]:
    return list(torch._C._get_sdp_priority_order())


def test_a_gpu_run_tries_flash_then_efficient_before_cudnn_and_restores_the_order() -> None:
    before = order()
    with sdpa_priority(torch.device("cuda")):
        inside = order()
    assert inside[:3] == [
        int(b) for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION)
    ]
    assert order() == before


def test_nothing_changes_on_a_cpu_or_when_asked_to_keep_torchs_order(monkeypatch: pytest.MonkeyPatch) -> None:
    before = order()
    with sdpa_priority(torch.device("cpu")):
        assert order() == before
    monkeypatch.setenv(ENV, "torch")
    with sdpa_priority(torch.device("cuda")):
        assert order() == before
    monkeypatch.setenv(ENV, "cudnn-first")
    with pytest.raises(ValueError, match="RLOO_SDPA_PRIORITY='cudnn-first'"):
        sdpa_priority(torch.device("cuda"))
