"""Activation offloading (TRL's ``activation_offloading``): what a training pass's forward saves for its
backward is kept in CPU memory, and each tensor is copied back to the GPU when the backward reaches it.

It is a pair of :class:`torch.autograd.graph.saved_tensors_hooks`, entered around the forward of each
training pass (:class:`rloo.training.update.Updater`); the no-grad log-prob passes save nothing. A saved
tensor goes to the CPU unless it is a parameter or a view of one (the GPU holds those anyway: a copy
would only add traffic and, in the backward, a second GPU copy), or is smaller than
:data:`MIN_OFFLOAD_BYTES`. The gradient is unchanged: the backward reads the same values.

Where we depart from TRL (torchtune's ``OffloadActivations``): the copies run on the compute stream,
not a side stream (simpler, never racing, but not overlapped with compute); the LM head's activations
are offloaded too (rloo's chunked head frees them chunk by chunk). With ``gradient_checkpointing`` the
checkpointed layers save nothing and their inputs are held by the checkpoint, not offloaded.

On a CPU the activations are in CPU memory already: the trainer leaves offloading off there, with a
warning. The hooks themselves still run on a CPU (a tensor on the CPU is copied like any other),
which is how the tests check that the gradient is unchanged.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.graph import saved_tensors_hooks

# TRL's min_offload_size: a smaller tensor costs more to move than it frees
MIN_OFFLOAD_BYTES = 1024


@dataclass
class OffloadCounts:
    """What the hooks moved to the CPU since they were made: tensors and their bytes."""

    tensors: int = 0
    bytes: int = 0


def stays_on_device(tensor: Tensor, min_bytes: int) -> bool:
    """Whether a saved tensor is kept where it is: a parameter or a view of one, a tensor of another
    kind than a plain strided one (sparse, a tensor subclass), or fewer than ``min_bytes`` bytes."""
    if isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter):
        return True
    if type(tensor) is not Tensor or tensor.layout != torch.strided:
        return True
    return tensor.numel() * tensor.element_size() < min_bytes


class ActivationOffload(saved_tensors_hooks):
    """Within it, tensors saved for the backward are copied into CPU memory (pinned with ``pin_memory``,
    so the copies back need no synchronization) and copied back to their device when the backward
    needs them. ``counts``: what was moved."""

    def __init__(self, pin_memory: bool, min_bytes: int = MIN_OFFLOAD_BYTES) -> None:
        self.pin_memory, self.min_bytes = pin_memory, min_bytes
        self.counts = OffloadCounts()
        super().__init__(self._pack, self._unpack)

    def _pack(self, tensor: Tensor) -> Any:
        if stays_on_device(tensor, self.min_bytes):
            return tensor
        host = torch.empty(tensor.size(), dtype=tensor.dtype, pin_memory=self.pin_memory)
        # same stream as the compute: a later kernel reusing the tensor's memory runs after the copy
        host.copy_(tensor, non_blocking=self.pin_memory)
        self.counts.tensors += 1
        self.counts.bytes += host.numel() * host.element_size()
        return tensor.device, host

    def _unpack(self, packed: Any) -> Tensor:
        if isinstance(packed, Tensor):
            return packed
        device, host = packed
        return host.to(device, non_blocking=self.pin_memory)  # type: ignore[no-any-return]


def offload_context(enabled: bool, device: torch.device) -> Callable[[], AbstractContextManager[Any]]:
    """What each training pass's forward runs within: :class:`ActivationOffload` when ``enabled``
    (``activation_offloading``) on an accelerator, else nothing. On a CPU it would only copy CPU
    memory to CPU memory: off, with a warning."""
    if not enabled:
        return contextlib.nullcontext
    if device.type == "cpu":
        warnings.warn(
            "activation_offloading=True has no effect on a CPU: the activations are in CPU memory already",
            UserWarning,
            stacklevel=2,
        )
        return contextlib.nullcontext
    hooks = ActivationOffload(pin_memory=device.type == "cuda")
    return lambda: hooks
