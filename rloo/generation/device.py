"""What the sampler and the passes ask of a model: whether it is a peft model (:func:`is_peft_model`), and
where it computes (:func:`model_device`): the device of its parameters, or, for parameters FSDP2 sharded and offloaded
to CPU memory (``fsdp_offload_params``), the device of their mesh, where each layer's parameters are
gathered to run. Inputs the sampler and the passes build go there (a CPU tensor would meet the GPU's
activations). Its parameters' ``.device`` would say "cpu" there, which is what ms-swift#9844 fixed too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def mesh_device(mesh: Any) -> torch.device:
    """The device a device mesh's collectives and computation run on: this process's current one of the
    mesh's type, as FSDP picks it (the CPU for a CPU mesh)."""
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh.device_type, torch.get_device_module(mesh.device_type).current_device())


def model_device(model: nn.Module) -> torch.device:
    """The device ``model`` computes on (see the module's docstring)."""
    parameter = next(model.parameters())
    mesh = getattr(parameter, "device_mesh", None)  # a DTensor: sharded by FSDP2
    if mesh is None or mesh.device_type == parameter.device.type:
        return parameter.device
    return mesh_device(mesh)


def is_peft_model(model: nn.Module) -> bool:
    """Whether ``model`` is a peft ``PeftModel`` (a LoRA policy: its adapters sit beside the base weights)."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)
