"""``GRPOTrainer``: ``RLOOTrainer`` whose default config is :class:`rloo.config.trl.grpo_config.GRPOConfig`,
so a TRL GRPO script runs with its imports changed; ``AsyncGRPOTrainer``: the same with TRL 1.16
``AsyncGRPOTrainer``'s arguments and :class:`rloo.config.trl.grpo_config.AsyncGRPOConfig`. The trainer is the
same: what it trains is what its config says (a ``GRPOConfig`` given to ``RLOOTrainer`` trains GRPO too, and an
``RLOOConfig`` given to ``GRPOTrainer`` trains RLOO)."""

from __future__ import annotations

from typing import Any

from rloo.config.trl.grpo_config import AsyncGRPOConfig, GRPOConfig
from rloo.training.trainer import RLOOTrainer


class GRPOTrainer(RLOOTrainer):
    def __init__(self, model: Any, reward_funcs: Any = None, args: Any = None, *more: Any, **keywords: Any) -> None:
        """TRL's ``GRPOTrainer`` arguments, in its order (``RLOOTrainer``'s); ``args=None`` is ``GRPOConfig()``."""
        super().__init__(model, reward_funcs, GRPOConfig() if args is None else args, *more, **keywords)


class AsyncGRPOTrainer(RLOOTrainer):
    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: Any = None,
        train_dataset: Any = None,
        processing_class: Any = None,
        callbacks: Any = None,
        optimizers: tuple[Any, Any] = (None, None),
        peft_config: Any = None,
        tools: Any = None,
        environment_factory: Any = None,
        rollout_worker: Any = None,
        weight_transfer: Any = None,
    ) -> None:
        """TRL 1.16 ``AsyncGRPOTrainer``'s arguments, in its order (it has no ``eval_dataset``); ``args=None`` is
        ``AsyncGRPOConfig()``. ``rollout_worker`` and ``weight_transfer`` (TRL's vLLM-side protocols) are refused:
        rloo's rollout workers are its own processes (``rollout_workers``), sent the weights over torch.distributed."""
        for name, value in (("rollout_worker", rollout_worker), ("weight_transfer", weight_transfer)):
            if value is not None:
                raise ValueError(
                    f"AsyncGRPOTrainer({name}=...) is TRL's vLLM-side protocol, which rloo does not use: its "
                    "rollout workers are processes it starts itself (RLOOConfig.rollout_workers, "
                    "rollout_worker_devices) and sends the weights to; remove it"
                )
        super().__init__(
            model,
            reward_funcs,
            AsyncGRPOConfig() if args is None else args,
            train_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            peft_config=peft_config,
            tools=tools,
            environment_factory=environment_factory,
        )
