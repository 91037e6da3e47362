"""rloo: online RL fine-tuning of causal language models with RLOO.

``import rloo`` stays light: the trainer and its heavy dependencies load on first use.
"""

from __future__ import annotations

import logging
from typing import Any

# bitsandbytes, which peft imports whenever it is installed, warns at import on CPUs with AVX512-BF16 that it
# could not fetch a 4-bit matmul kernel from the hub; rloo has no 4-bit layers (it uses bitsandbytes' 8-bit
# optimizers only), so that module's logger, which logs nothing else, is quieted
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)

__version__ = "0.1.0"
__all__ = [
    "AsyncGRPOConfig",
    "AsyncGRPOTrainer",
    "GRPOConfig",
    "GRPOTrainer",
    "RLOOConfig",
    "RLOOTrainer",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name == "RLOOConfig":
        from rloo.config import RLOOConfig

        return RLOOConfig
    if name == "RLOOTrainer":
        from rloo.training.trainer import RLOOTrainer

        return RLOOTrainer
    if name == "GRPOConfig":  # RLOOConfig with TRL's GRPOConfig defaults (rloo/config/trl/grpo_config.py)
        from rloo.config.trl.grpo_config import GRPOConfig

        return GRPOConfig
    if name == "GRPOTrainer":
        from rloo.training.grpo_trainer import GRPOTrainer

        return GRPOTrainer
    if name == "AsyncGRPOConfig":  # GRPOConfig with TRL's AsyncGRPOConfig asynchronous defaults
        from rloo.config.trl.grpo_config import AsyncGRPOConfig

        return AsyncGRPOConfig
    if name == "AsyncGRPOTrainer":
        from rloo.training.grpo_trainer import AsyncGRPOTrainer

        return AsyncGRPOTrainer
    raise AttributeError(f"module 'rloo' has no attribute {name!r}")
