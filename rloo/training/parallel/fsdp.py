"""Sharded parameters (FSDP2, ``torch.distributed.fsdp.fully_shard``) for the training loop.

An accelerate config with ``distributed_type: FSDP`` and ``fsdp_version: 2``
(``examples/accelerate/fsdp2.yaml``) asks for it. rloo shards the policy itself, with
``fully_shard`` on each decoder layer and then on the whole model, over a 1-D mesh of every
process, on GPUs (NCCL) and on CPUs (gloo) alike: accelerate's own FSDP plugin is not used,
because ``Accelerator(cpu=True)`` ignores it (it runs plain multi-CPU instead) and its
``prepare`` would also wrap what rloo wraps. The same code therefore runs on every device.

What sharding asks of the loop (:mod:`rloo.training.parallel.distributed` for the rest):

- **Lockstep.** Every forward all-gathers each layer's parameters, a collective: every process
  must run the same number of forwards. Generation decodes until every process is done
  (:meth:`Ranks.all_done`); log-prob and training passes are padded to the largest count over
  processes with passes whose result is dropped, or whose loss is multiplied by 0
  (:meth:`Ranks.count_everywhere`); evaluation runs the same number of batches everywhere.
- **Gradients.** FSDP reduce-scatters each backward's gradients; its divide factor is set to 1,
  so they are summed over processes, as the loss of each process is its share of the global loss.
  Clipping uses the norm of the whole (sharded) gradient (:func:`clip_grad_norm`).
- **Saving.** Weights are gathered into a full state dict (on every process, a collective) and
  the main process writes consolidated safetensors (the adapter only under LoRA); the optimizer
  state is saved full, too, and loaded back sharded on resume.
- **Parameter offload** (``fsdp_offload_params: true``, torch's ``CPUOffloadPolicy``). The shards,
  their gradients and the optimizer state (so its step) live in CPU memory; a unit's parameters are
  copied to the GPU for its forward and backward only. Inputs go to the mesh's device, not to where
  the parameters are (:func:`rloo.generation.device.model_device`), and the gradient's norm is
  reduced there (:func:`clip_grad_norm`). One process is sharded too when it offloads.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import _IncompatibleKeys

from rloo.generation.device import mesh_device

FSDP_HINT = "use examples/accelerate/fsdp2.yaml (FSDP2), or data parallel training (examples/accelerate/ddp.yaml)"


@dataclass(frozen=True)
class ShardingSettings:
    """What of an accelerate FSDP config rloo uses. ``wrap_classes``: module class names sharded
    on their own (empty: the model's ``_no_split_modules``, its decoder layers). ``offload_params``
    (``fsdp_offload_params``): the shards, their gradients and the optimizer state live in CPU memory."""

    reshard_after_forward: bool = True
    wrap_classes: tuple[str, ...] = ()
    offload_params: bool = False


def _flag(env: Mapping[str, str], name: str, default: str = "false") -> bool:
    return env.get(name, default).strip().lower() in ("true", "1", "yes")


def sharding_settings(distributed_type: Any, env: Mapping[str, str] | None = None) -> ShardingSettings | None:
    """The sharding an accelerate launch asks for (None: data parallel), from its
    ``distributed_type`` and the ``FSDP_*`` variables ``accelerate launch`` sets. Refuses, with
    what to use instead, what rloo does not run: DeepSpeed, FSDP version 1, and accelerate's
    activation checkpointing (``gradient_checkpointing`` does it)."""
    env = os.environ if env is None else env
    name = getattr(distributed_type, "name", str(distributed_type))
    if name == "DEEPSPEED" or _flag(env, "ACCELERATE_USE_DEEPSPEED"):
        raise ValueError(
            "accelerate is configured for DeepSpeed, which rloo does not support: its engine owns backward, "
            "gradient reduction, clipping and the optimizer step, which rloo's loop does itself (padded, "
            f"lockstep passes and globally normalized losses); {FSDP_HINT}"
        )
    if name != "FSDP" and not _flag(env, "ACCELERATE_USE_FSDP"):
        return None
    version = env.get("FSDP_VERSION", "1")
    if version != "2":
        raise ValueError(f"accelerate is configured for FSDP version {version}; rloo runs FSDP2 only: {FSDP_HINT}")
    if _flag(env, "FSDP_ACTIVATION_CHECKPOINTING"):
        raise ValueError(
            "fsdp_activation_checkpointing: true is not used by rloo; set it to false and set "
            "gradient_checkpointing: true in the run file instead"
        )
    classes = tuple(c.strip() for c in env.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "").split(",") if c.strip())
    return ShardingSettings(
        _flag(env, "FSDP_RESHARD_AFTER_FORWARD", "true"), classes, _flag(env, "FSDP_OFFLOAD_PARAMS")
    )


def wrap_units(model: nn.Module, classes: tuple[str, ...] = ()) -> list[nn.Module]:
    """The submodules sharded on their own: those of ``classes``, else of the ``_no_split_modules``
    of the transformers models inside ``model`` (decoder layers), in module order."""
    names = set(classes)
    if not names:
        for module in model.modules():
            names.update(getattr(module, "_no_split_modules", None) or ())
    units = [m for m in model.modules() if m is not model and any(c.__name__ in names for c in type(m).__mro__)]
    if not units:
        raise ValueError(
            f"cannot shard {type(model).__name__}: no submodule of class {sorted(names) or '(none named)'}; set "
            "fsdp_transformer_layer_cls_to_wrap in the accelerate config to its decoder layer class"
        )
    return units


def shard_model(model: nn.Module, settings: ShardingSettings, device: torch.device, world_size: int) -> None:
    """Shard ``model`` in place over every process: each wrap unit, then the whole model (the
    embeddings, the head and whatever else is left). Gradients are summed over processes. With
    ``offload_params`` the shards stay in CPU memory (pinned on a GPU machine) and each unit's
    parameters visit ``device`` only while it runs; the model is then never moved there whole."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    if not settings.offload_params:
        model.to(device)
    for tensor in model.state_dict().values() if world_size > 1 else ():  # as DDP: every process starts
        staged = tensor.to(device)  # from the main's weights; offloaded, through the device one at a time
        torch.distributed.broadcast(staged, src=0)  # (NCCL sends no CPU memory)
        if staged is not tensor:
            tensor.copy_(staged)
    # pinned CPU memory needs an accelerator; on a CPU the "offloaded" shards stay where they are
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if settings.offload_params else OffloadPolicy()
    for unit in [*wrap_units(model, settings.wrap_classes), model]:
        fully_shard(unit, mesh=mesh, reshard_after_forward=settings.reshard_after_forward, offload_policy=offload)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            # each process's loss is its share of the global loss: the global gradient is the sum
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM


def one_process_group(device: torch.device) -> None:
    """A process group of this process alone, where none is up (``fully_shard`` needs one): sharding one
    process offloads its parameters to CPU memory (``offload_params``), over a mesh of one."""
    import atexit

    import torch.distributed as dist

    if dist.is_initialized():
        return
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=0, world_size=1)
    atexit.register(dist.destroy_process_group)


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(module, FSDPModule) for module in model.modules())


def clip_grad_norm(parameters: list[nn.Parameter], max_norm: float) -> float:
    """Clip the sharded gradients of ``parameters`` to a global norm of ``max_norm`` (the norm of
    the whole gradient, every process's shards together); returns that norm before clipping."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(norm, DTensor):
        norm = _full_norm(norm)  # the sum of every shard's squares, then the root
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return float(norm)


def _full_norm(norm: Any) -> torch.Tensor:
    """A norm over shards (a DTensor, each process's part) as one tensor on every process. Offloaded
    shards (CPU memory, mesh on a GPU) have their part reduced on the mesh's device (NCCL reduces no
    CPU memory; torch's own clipping fails there, pytorch#148532), then brought back beside the gradients."""
    from torch.distributed.tensor import DTensor

    local = norm.to_local()
    mesh = norm.device_mesh
    if local.device.type == mesh.device_type:
        return norm.full_tensor()  # type: ignore[no-any-return]
    on_mesh = DTensor.from_local(local.to(mesh_device(mesh)), mesh, norm.placements, run_check=False)
    return on_mesh.full_tensor().to(local.device)


def _full_options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_model_state(model: nn.Module) -> dict[str, Any]:
    """``model``'s full (unsharded) state dict on the CPU of the main process ({} on the others).
    Every process must call it: the shards are gathered."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options(cpu_offload=True))


def load_full_model_state(model: nn.Module, state: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Load a full state dict (every process has it, e.g. read from a checkpoint) into sharded
    ``model``; each process keeps its shards. Returns ``(missing, unexpected)`` keys."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    keys = set_model_state_dict(model, state, options=_full_options(strict=False))
    return list(keys.missing_keys), list(keys.unexpected_keys)


@contextlib.contextmanager
def full_state_loading(model: nn.Module) -> Iterator[None]:
    """Within it, ``model.load_state_dict`` of a sharded ``model`` takes a full state dict (what a
    checkpoint holds; peft's ``set_peft_model_state_dict`` calls it with the adapter's keys) and
    keeps each process's shards; a model that is not sharded is left alone."""
    if not is_sharded(model):
        yield
        return

    def load(state: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        del model.load_state_dict  # torch's loader calls the module's own
        try:
            missing, unexpected = load_full_model_state(model, dict(state))
        finally:
            model.load_state_dict = load  # type: ignore[method-assign,assignment]
        return _IncompatibleKeys(missing, unexpected)

    model.load_state_dict = load  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        model.__dict__.pop("load_state_dict", None)


def full_optimizer_state(model: nn.Module, optimizer: Any) -> dict[str, Any]:
    """The optimizer's full state (keyed by parameter name) on the main process's CPU ({} elsewhere)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, _inner(optimizer), options=_full_options(cpu_offload=True))


def load_full_optimizer_state(model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(model, _inner(optimizer), state, options=_full_options())


def _inner(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)
