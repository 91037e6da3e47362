"""The optimizer and learning-rate schedule of a run, and how many steps it takes."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from transformers import get_scheduler

from rloo.config import RLOOConfig


def total_steps(args: RLOOConfig, num_prompts: int, world_size: int = 1) -> int:
    """``max_steps``, or the optimizer steps of ``num_train_epochs`` over ``num_prompts`` prompts
    (a generation batch takes ``prompts_per_generation`` prompts on each of ``world_size`` processes)."""
    if args.max_steps > 0:
        return args.max_steps
    generations = math.ceil(args.num_train_epochs * num_prompts / (args.prompts_per_generation * world_size))
    return max(1, generations * args.optimizer_steps_per_generation)


def build_optimizer(model: nn.Module, args: RLOOConfig, max_steps: int) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW over the trainable parameters, and the ``lr_scheduler_type`` schedule with warmup
    (``warmup_steps``, else ``warmup_ratio`` of ``max_steps``)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable,
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
        weight_decay=args.weight_decay,
    )
    warmup = args.warmup_steps or math.ceil(args.warmup_ratio * max_steps)
    return optimizer, get_scheduler(args.lr_scheduler_type, optimizer, warmup, max_steps)


def zero_grads_if_none(model: nn.Module) -> None:
    """Give every trainable parameter a zero gradient where it has none (every row was skipped:
    the gradient is exactly zero, and AdamW still steps, as it would on the plain path)."""
    for param in model.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)
