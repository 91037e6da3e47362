"""The optimizer and learning-rate schedule of a run, and how many steps it takes.

``optim`` names an optimizer as transformers does (``TrainingArguments.optim``), and the class
and keyword arguments come from transformers' own factory, ``Trainer.get_optimizer_cls_and_kwargs``,
so ``adafactor`` or ``adamw_8bit`` are built exactly as a TRL run builds them. The factory reads a
handful of ``TrainingArguments`` fields; it gets them from :class:`_FactoryArgs`, not from a real
``TrainingArguments``: constructing one resets accelerate's shared state (its ``__post_init__``
sets up devices), which breaks the trainer's live ``Accelerator``, and it validates dozens of
fields rloo does not have. Where we depart from transformers' Trainer: ``weight_decay`` applies
to every trainable parameter (the Trainer exempts biases and norm weights), as rloo always did.
``optim_args`` reaches the factory as written; rloo checks it first (validation), because the
factory ignores the keys it does not read, and every key for the AdamW and Adafactor optimizers.

Trainable weights stored in bf16/fp16 (full fine-tuning with ``model_init_kwargs={"dtype":
"bfloat16"}``, as TRL's examples write it) are warned about, not upcast or refused: an update below
half a rounding step of its weight is lost (:func:`half_precision_warning`), which at RL learning
rates is most of them, but float32 master weights would add 2 bytes per parameter that a user who
chose bf16 weights may not have; the warning names both fixes (float32 weights with bf16 compute,
or LoRA).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch
from packaging.version import Version
from torch import nn
from transformers import Trainer, get_scheduler

from rloo.config import RLOOConfig
from rloo.training.parallel.fsdp import ShardingSettings, one_process_group, shard_model

BITSANDBYTES_OPTIMIZERS = ("adamw_8bit", "paged_adamw_8bit")
# the first bitsandbytes whose optimizers run on a CPU (its pull request 1901; 0.49.2 ran them on CUDA/XPU
# only); paged_adamw_8bit is the plain 8-bit AdamW there (bitsandbytes warns: nothing to page)
BITSANDBYTES_ON_CPU = "0.50.0"


def total_steps(args: RLOOConfig, num_prompts: int | None, world_size: int = 1) -> int:
    """``max_steps``, or the optimizer steps of ``num_train_epochs`` over ``num_prompts`` prompts
    (a generation batch takes ``prompts_per_generation`` prompts on each of ``world_size`` processes).
    ``num_prompts=None`` (a streaming dataset: its length is unknown) needs ``max_steps``."""
    if args.max_steps > 0:
        return args.max_steps
    if num_prompts is None:
        raise ValueError(
            "RLOOConfig.max_steps=-1 is invalid with a streaming train_dataset: its length is unknown, so "
            "num_train_epochs cannot give a step count; set max_steps (as transformers asks for an IterableDataset)"
        )
    generations = math.ceil(args.num_train_epochs * num_prompts / (args.prompts_per_generation * world_size))
    return max(1, generations * args.optimizer_steps_per_generation)


@dataclass(frozen=True)
class _FactoryArgs:
    """The ``TrainingArguments`` fields transformers' optimizer factory reads for rloo's optimizers."""

    optim: str
    learning_rate: float
    adam_beta1: float
    adam_beta2: float
    adam_epsilon: float
    weight_decay: float
    optim_args: str | None = None


def optimizer_class_and_kwargs(args: RLOOConfig) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The ``optim`` optimizer class and its keyword arguments (``lr``, the ``adam_*`` fields for the
    AdamW ones, ``weight_decay``), from transformers' factory; the parameters are not included."""
    check_optimizer_available(args.optim)
    view = _FactoryArgs(
        args.optim,
        args.learning_rate,
        args.adam_beta1,
        args.adam_beta2,
        args.adam_epsilon,
        args.weight_decay,
        args.optim_args,
    )
    optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(view)  # type: ignore[arg-type]
    # torch's AdamW would default to 0.01; the factory leaves weight decay to the Trainer's param groups
    # (an optim_args weight_decay, which the factory already read, wins)
    return optimizer_cls, {"weight_decay": args.weight_decay, **kwargs}


def bitsandbytes_version() -> str | None:
    """The installed bitsandbytes' version, or None."""
    try:
        return metadata.version("bitsandbytes")
    except metadata.PackageNotFoundError:
        return None


def check_optimizer_available(optim: str) -> None:
    """Raise a ``ValueError`` saying what to install when ``optim`` needs bitsandbytes: the package, and on
    a machine without a CUDA GPU a version whose 8-bit optimizers run on the CPU (:data:`BITSANDBYTES_ON_CPU`)."""
    if optim not in BITSANDBYTES_OPTIMIZERS:
        return
    version = bitsandbytes_version()
    instead = "or use optim='adamw_torch' (or 'adafactor', less memory)"
    if version is None:
        raise ValueError(
            f"RLOOConfig.optim={optim!r} needs the bitsandbytes package, which is not installed: "
            f"pip install 'bitsandbytes>={BITSANDBYTES_ON_CPU}' (or rloo's extra: pip install -e '.[bitsandbytes]'), "
            f"{instead}"
        )
    if not torch.cuda.is_available() and Version(version) < Version(BITSANDBYTES_ON_CPU):
        raise ValueError(
            f"RLOOConfig.optim={optim!r} without a CUDA GPU needs bitsandbytes >= {BITSANDBYTES_ON_CPU}: the "
            f"installed bitsandbytes {version} runs its 8-bit optimizers on CUDA (and XPU) devices only. "
            f"pip install -U 'bitsandbytes>={BITSANDBYTES_ON_CPU}', {instead}"
        )


def build_optimizer(model: nn.Module, args: RLOOConfig, max_steps: int) -> tuple[torch.optim.Optimizer, Any]:
    """The ``optim`` optimizer over the trainable parameters (AdamW by default), and the
    ``lr_scheduler_type`` schedule with ``lr_scheduler_kwargs`` and warmup (``warmup_steps``, a count or a
    fraction of ``max_steps``, else ``warmup_ratio`` of ``max_steps``)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    warning = half_precision_warning(trainable, args.learning_rate)
    if warning is not None:
        warnings.warn(warning, UserWarning, stacklevel=2)
    optimizer_cls, kwargs = optimizer_class_and_kwargs(args)
    optimizer = optimizer_cls(trainable, **kwargs)
    warmup = args.steps("warmup_steps", max_steps) or math.ceil(args.warmup_ratio * max_steps)
    schedule_kwargs = dict(args.lr_scheduler_kwargs or {})
    return optimizer, get_scheduler(
        args.lr_scheduler_type, optimizer, warmup, max_steps, scheduler_specific_kwargs=schedule_kwargs
    )


def half_precision_warning(trainable: list[nn.Parameter], learning_rate: float) -> str | None:
    """Why trainable weights stored in bf16/fp16 learn little, or None when none are. A weight w
    keeps its value under an update u smaller than half its rounding step, which is at least
    ``|w| x eps / 4`` (``eps``: the dtype's spacing at 1, 2^-7 for bf16); AdamW's update is about
    ``learning_rate``, so every weight above ``4 x learning_rate / eps`` loses it (5e-4 at 1e-6 in bf16)."""
    half = [p for p in trainable if p.dtype in (torch.bfloat16, torch.float16)]
    if not half:
        return None
    count, dtype = sum(p.numel() for p in half), str(half[0].dtype).removeprefix("torch.")
    smallest = 4 * learning_rate / torch.finfo(half[0].dtype).eps
    return (
        f"{count:,} trainable parameters are stored in {dtype}: an optimizer update smaller than half a rounding "
        f"step of its weight is lost, and at learning_rate={learning_rate:g} that is every update of a weight "
        f"above about {smallest:.1e} in magnitude, so training may silently do little. Load the weights in float32 "
        "(drop dtype from model_init_kwargs; bf16=True still computes in bf16) or train LoRA adapters (peft_config)"
    )


def zero_grads_if_none(model: nn.Module) -> None:
    """Give every trainable parameter a zero gradient where it has none (every row was skipped:
    the gradient is exactly zero, and AdamW still steps, as it would on the plain path)."""
    for param in model.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)


def prepare_training(
    accelerator: Any,
    policy: nn.Module,
    reference: nn.Module | None,
    args: Any,
    max_steps: int,
    settings: ShardingSettings | None,
) -> tuple[Any, Any, Any]:
    """``(model, optimizer, scheduler)`` for the run, and a separate ``reference`` model (if any)
    on the device. Data parallel: accelerate prepares the policy (DDP, which broadcasts the initial
    weights) and the optimizer. Sharded: the policy and the reference are sharded here
    (:func:`shard_model`) and the optimizer built over the policy's shards; accelerate prepares
    neither (its FSDP2 ``prepare`` insists on wrapping the model itself), so the run is the same
    on GPUs, where accelerate reports FSDP, and on CPUs, where it reports plain multi-CPU. One process
    is sharded only to offload its parameters (``fsdp_offload_params``), over a process group of its own."""
    if settings is None or (accelerator.num_processes == 1 and not settings.offload_params):
        if reference is not None:
            reference.to(accelerator.device)
        optimizer, scheduler = build_optimizer(policy, args, max_steps)
        model, optimizer = accelerator.prepare(policy, optimizer)
        return model, optimizer, scheduler
    unsupported = ("sync_ref_model", "torch_compile", "fp16", "log_grad_variance", "max_staleness")
    refused = [n for n in unsupported if getattr(args, n, 0)]
    if refused:
        raise ValueError(
            f"{', '.join(refused)} not supported with FSDP in rloo (the sharded reference's state is not "
            "checkpointed; compiling a sharded model is untested; fp16's gradient scaler is not applied to "
            "sharded gradients: use bf16; the gradient-variance probe runs a forward per completion, unevenly "
            "over processes; a stale sampling copy would be a second sharded model); drop them, or train data parallel"
        )
    if accelerator.num_processes == 1:
        one_process_group(accelerator.device)
    for model in (policy, reference):
        if model is not None:
            shard_model(model, settings, accelerator.device, accelerator.num_processes)
    optimizer, scheduler = build_optimizer(policy, args, max_steps)
    return policy, optimizer, scheduler
