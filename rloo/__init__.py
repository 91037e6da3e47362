"""rloo: online RL fine-tuning of causal language models with RLOO.

``import rloo`` stays light: the trainer and its heavy dependencies load on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["GRPOConfig", "GRPOTrainer", "RLOOConfig", "RLOOTrainer", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "RLOOConfig":
        from rloo.config import RLOOConfig

        return RLOOConfig
    if name == "RLOOTrainer":
        from rloo.training.trainer import RLOOTrainer

        return RLOOTrainer
    if name == "GRPOConfig":  # RLOOConfig with TRL's GRPOConfig defaults (rloo/config/grpo_config.py)
        from rloo.config.grpo_config import GRPOConfig

        return GRPOConfig
    if name == "GRPOTrainer":
        from rloo.training.grpo_trainer import GRPOTrainer

        return GRPOTrainer
    raise AttributeError(f"module 'rloo' has no attribute {name!r}")
