"""The optimizer's set-up: trainable weights stored in half precision are warned about (issue 25)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from rloo import RLOOConfig
from rloo.training.setup.optimization import build_optimizer, half_precision_warning


def one_adamw_step(dtype: torch.dtype, learning_rate: float) -> float:
    """The share of weights one AdamW step changes, for weights of typical size (std 0.02) in ``dtype``."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter((torch.randn(4096) * 0.02).to(dtype))
    before = weight.detach().clone()
    optimizer = torch.optim.AdamW([weight], lr=learning_rate, weight_decay=0.0)
    weight.grad = torch.randn_like(weight)
    optimizer.step()
    return float((weight.detach() != before).float().mean())


def test_bf16_weights_lose_most_updates_at_rl_learning_rates() -> None:
    # the fact the warning states: at lr 1e-6 an update below half a bf16 rounding step is rounded away
    assert one_adamw_step(torch.float32, 1e-6) == 1.0
    assert one_adamw_step(torch.bfloat16, 1e-6) < 0.1


def test_half_precision_trainable_weights_are_warned_about_with_the_fix(tmp_path: Path) -> None:
    args = RLOOConfig(output_dir=str(tmp_path), learning_rate=1e-6)
    model = torch.nn.Linear(8, 8).to(torch.bfloat16)
    with pytest.warns(
        UserWarning, match=r"72 trainable parameters are stored in bfloat16.*above about 5\.1e-04.*float32"
    ):
        build_optimizer(model, args, max_steps=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_optimizer(torch.nn.Linear(8, 8), args, max_steps=10)  # float32: no warning
    frozen_half = torch.nn.Linear(8, 8).to(torch.bfloat16).requires_grad_(False)  # e.g. a LoRA base
    assert half_precision_warning([p for p in frozen_half.parameters() if p.requires_grad], 1e-6) is None
