"""The optimizer's set-up: trainable weights stored in half precision are warned about (issue 25);
bitsandbytes' 8-bit AdamW runs on a CPU (issue 29)."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import bitsandbytes as bnb
import pytest
import torch

from rloo import RLOOConfig, RLOOTrainer
from rloo.tiny import build_tiny_llama
from rloo.training.setup.optimization import build_optimizer, half_precision_warning
from tests.helpers.models import config, dataset, frac7, make_tokenizer, params


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


# ---------------------------------------------------------------------------- 8-bit AdamW (bitsandbytes) on a CPU
def test_8bit_adamw_keeps_8bit_moments_and_follows_adamw_within_its_quantization_error() -> None:
    """bitsandbytes' AdamW with 8-bit moments (blockwise dynamic quantization, for tensors of >= 4096
    elements) against torch's AdamW, five steps on the same gradients: each update is about lr per step
    (|m / sqrt(v)| <= 1), and the quantized moments move it by a few hundredths of lr on average."""
    lr = 1e-3
    start = torch.randn(128, 64, generator=torch.Generator().manual_seed(0)) * 0.02
    eight, full = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    built, _ = build_optimizer(torch.nn.ParameterList([eight]), RLOOConfig(optim="adamw_8bit", learning_rate=lr), 10)
    plain = torch.optim.AdamW([full], lr=lr, weight_decay=0.0)
    grads = torch.Generator().manual_seed(1)
    for _ in range(5):
        eight.grad = torch.randn(128, 64, generator=grads)
        full.grad = eight.grad.clone()
        built.step()
        plain.step()
    state = built.state[eight]
    assert state["state1"].dtype == state["state2"].dtype == torch.uint8  # 1 byte per moment, not 4
    error = (eight - full).detach().abs() / lr
    assert 0 < float(error.mean()) < 0.05 and float(error.max()) < 0.5  # measured: 0.020 and 0.17
    assert float((full - start).detach().abs().max()) > 4 * lr  # the updates are not small beside the error


def test_8bit_adamw_trains_on_the_cpu_and_resumes_exactly(tmp_path: Path) -> None:
    """Real steps of the tiny model with ``optim='adamw_8bit'``: its MLP weights (>= 4096 elements) keep
    8-bit moments, the weights move, and a run resumed from a checkpoint (the 8-bit state saved and loaded
    back) ends where the run that went straight through did."""
    straight = wide_trainer(tmp_path / "straight", optim="adamw_8bit", max_steps=4, save_steps=2)
    before = params(straight.unwrapped_model)
    straight.train()
    optimizer = straight.optimizer.optimizer
    assert type(optimizer) is bnb.optim.AdamW
    assert any(s.get("state1") is not None and s["state1"].dtype == torch.uint8 for s in optimizer.state.values())
    after = params(straight.unwrapped_model)
    assert all(bool(v.isfinite().all()) for v in after.values()) and any(
        not torch.equal(before[k], after[k]) for k in before
    )
    resumed = wide_trainer(tmp_path / "resumed", optim="adamw_8bit", max_steps=4, save_steps=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "straight" / "run" / "checkpoint-2"))
    again = params(resumed.unwrapped_model)
    assert all(torch.equal(after[k], again[k]) for k in after)


def test_paged_8bit_adamw_is_the_plain_one_on_a_cpu(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="Paged optimizers are not supported on CPU"):
        wide_trainer(tmp_path, optim="paged_adamw_8bit", max_steps=1).train()


@pytest.mark.system
def test_bitsandbytes_import_warning_about_4bit_kernels_is_quieted() -> None:
    """peft imports bitsandbytes, which warns on CPUs with AVX512-BF16 that a 4-bit kernel is missing;
    after ``import rloo`` that line is gone (on other CPUs it never appears)."""
    code = "import rloo, peft, bitsandbytes"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "kernels-community" not in result.stderr


def wide_trainer(tmp_path: Path, **overrides: Any) -> RLOOTrainer:
    """The tiny test trainer with hidden size 64, so its MLP weights (64 x 128) reach bitsandbytes'
    ``min_8bit_size`` (4096 elements) and get 8-bit moments."""
    tok = make_tokenizer()
    model = build_tiny_llama(len(tok), hidden_size=64, tokenizer=tok, seed=0)
    return RLOOTrainer(model, frac7, config(tmp_path, **overrides), dataset(), processing_class=tok)
