"""``GRPOTrainer``: ``RLOOTrainer`` whose default config is :class:`rloo.config.trl.grpo_config.GRPOConfig`,
so a TRL GRPO script runs with its imports changed. The trainer is the same: what it trains is what
its config says (a ``GRPOConfig`` given to ``RLOOTrainer`` trains GRPO too, and an ``RLOOConfig``
given to ``GRPOTrainer`` trains RLOO)."""

from __future__ import annotations

from typing import Any

from rloo.config.trl.grpo_config import GRPOConfig
from rloo.training.trainer import RLOOTrainer


class GRPOTrainer(RLOOTrainer):
    def __init__(self, model: Any, reward_funcs: Any = None, args: Any = None, *more: Any, **keywords: Any) -> None:
        """TRL's ``GRPOTrainer`` arguments, in its order (``RLOOTrainer``'s); ``args=None`` is ``GRPOConfig()``."""
        super().__init__(model, reward_funcs, GRPOConfig() if args is None else args, *more, **keywords)
