"""Which fused attention kernel SDPA runs on a GPU: flash, then memory-efficient, then cuDNN, then math.

PyTorch 2.9 made cuDNN attention the first choice on SM 9.0/10.0 (H100, H200, B200; pytorch#162073).
cuDNN attention builds an execution graph per shape and caches it by shape ("building the graph takes
several hundred milliseconds", sglang#4650; recompiling per sequence length unless
``TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1``, pytorch#155958), and RL training meets a new shape at nearly
every step: the key length grows each decode step, compaction changes the batch at random steps, and
passes take new bucket lengths. It runs in bf16/fp16 only, which fits what was measured on an H200: the
synchronous loop 4.4x slower in bf16 than in fp32, with 5-7 s outliers in some steps
(``../shared/design/gpu_step.md`` section 2.3; to be confirmed by ``benchmarks/gpu_vs_trl.sh``'s A/B).
Flash and memory-efficient attention take any shape without a build, as PyTorch ordered them before 2.9.

A training run holds :func:`sdpa_priority` around its loop. ``RLOO_SDPA_PRIORITY=torch`` keeps PyTorch's
own order (for the benchmark's A/B); any other value is refused.
"""

from __future__ import annotations

import contextlib
import os
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

PRIORITY = [
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.MATH,
]
ENV = "RLOO_SDPA_PRIORITY"


def sdpa_priority(device: torch.device) -> AbstractContextManager[Any]:
    """A context in which SDPA on ``device`` tries :data:`PRIORITY` in order (every backend stays allowed:
    a shape flash cannot run falls to the next); nothing off CUDA or with ``RLOO_SDPA_PRIORITY=torch``."""
    choice = os.environ.get(ENV, "rloo")
    if choice not in ("rloo", "torch"):
        raise ValueError(f"{ENV}={choice!r}: use 'rloo' (flash, efficient, cuDNN, math) or 'torch' (its own order)")
    if device.type != "cuda" or choice == "torch":
        return contextlib.nullcontext()
    return sdpa_kernel(PRIORITY, set_priority=True)
