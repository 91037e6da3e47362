"""A gated MLP's training forward that saves its two projections, not four tensors of its width.

A gated MLP (Llama's, and transformers' ~130 other classes of the same forward) computes
``down(act(gate(x)) * up(x))``. Autograd saves four ``(tokens, I)`` tensors for its backward: ``gate(x)``
(for ``act``), ``act(gate(x))`` and ``up(x)`` (for the product), and the product (for ``down``'s weight
gradient). With ``I`` about 2-3x the hidden size these are about half of a layer's saved activations
(:mod:`rloo.training.setup.memory_plan`). :class:`_GatedDown` keeps ``gate(x)`` and ``up(x)`` only and
recomputes ``act(gate(x)) * up(x)`` in the backward: one elementwise pass a layer, no GEMM, and the
gradients those of autograd's own ops (the same kernels on the same tensors; a test holds them equal).

Where it applies (:func:`lean_gated_mlps`, around a training pass): a module whose class's ``forward`` is
one of :data:`GATED_FORMS` (its source, read once per class), with a plain ``nn.Linear`` ``down_proj``
(not a LoRA, quantized or FSDP-sharded one), autocast off (rloo's float32 CPU passes; under bf16
autocast the module keeps its own forward) and no gradient checkpointing (which recomputes the layer
anyway, in the backward, where the forward must save what it saved the first time). ``RLOO_LEAN_MLP=0`` turns it off.

Why our own: Liger's fused SwiGLU (``LigerSiLUMulFunction``) saves the same two tensors, but it is a Triton
kernel (CUDA), replaces the model's classes at load, and knows SiLU only; transformers' gradient
checkpointing recomputes the whole layer (a third more forward FLOPs).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import textwrap
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

# the variable that turns the lean MLP off ("0")
LEAN_VARIABLE = "RLOO_LEAN_MLP"
# the forwards (their bodies, the argument named x, whitespace removed) this module computes the same
GATED_FORMS = frozenset(
    {
        "down_proj=self.down_proj(self.act_fn(self.gate_proj(x))*self.up_proj(x))|returndown_proj",
        "returnself.down_proj(self.act_fn(self.gate_proj(x))*self.up_proj(x))",
    }
)
_FORMS: dict[type, bool] = {}


class _GatedDown(torch.autograd.Function):
    """``(gate, up, W, b) -> (act(gate) * up) @ W^T + b``, saving ``gate`` and ``up`` (module docstring)."""

    @staticmethod
    def forward(
        ctx: Any, gate: Tensor, up: Tensor, weight: Tensor, bias: Tensor | None, act: Callable[..., Any]
    ) -> Tensor:
        ctx.act = act
        ctx.save_for_backward(gate, up, weight, bias)
        return nn.functional.linear(act(gate) * up, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        gate, up, weight, bias = ctx.saved_tensors
        with torch.enable_grad():
            leaves = gate.detach().requires_grad_(True), up.detach().requires_grad_(True)
            product = ctx.act(leaves[0]) * leaves[1]
        flat = grad.reshape(-1, grad.shape[-1])
        # as autograd's linear backward computes them: grad @ W, grad^T @ input, grad summed over tokens
        grad_weight = flat.t().mm(product.detach().reshape(-1, product.shape[-1])) if ctx.needs_input_grad[2] else None
        grad_bias = flat.sum(0) if bias is not None and ctx.needs_input_grad[3] else None
        grad_gate, grad_up = torch.autograd.grad(product, leaves, grad.matmul(weight))
        return grad_gate, grad_up, grad_weight, grad_bias, None


def lean_forward(module: Any, x: Tensor) -> Tensor:
    """A gated MLP's forward through :class:`_GatedDown` (its ``down_proj`` a plain ``nn.Linear``)."""
    down: nn.Linear = module.down_proj
    gate, up = module.gate_proj(x), module.up_proj(x)
    return _GatedDown.apply(gate, up, down.weight, down.bias, module.act_fn)  # type: ignore[no-any-return, no-untyped-call]


def gated_form(cls: type) -> bool:
    """Whether ``cls.forward``'s body is one of :data:`GATED_FORMS` (read once per class)."""
    if cls not in _FORMS:
        try:
            lines = textwrap.dedent(inspect.getsource(cls.forward)).splitlines()  # type: ignore[attr-defined]
        except (OSError, TypeError, AttributeError):
            lines = []
        match = re.match(r"\s*def forward\(self, (\w+)(?:: [\w.]+)?\)", lines[0]) if lines else None
        code = (line.split("#")[0].strip() for line in lines[1:])  # the forms hold no "#": comments dropped
        body = [line for line in code if line]
        form = "|".join(body).replace(" ", "")
        if match is not None:
            form = re.sub(rf"\b{match.group(1)}\b", "x", form)
        _FORMS[cls] = match is not None and form in GATED_FORMS
    return _FORMS[cls]


def takes_lean(module: nn.Module) -> bool:
    """Whether ``module`` is a gated MLP of :data:`GATED_FORMS` whose ``down_proj`` is a plain ``nn.Linear``
    with an unsharded weight and whose forward nothing has replaced (accelerate's hooks, another patch)."""
    down = getattr(module, "down_proj", None)
    return (
        "forward" not in vars(module)
        and type(down) is nn.Linear
        and type(down.weight) is nn.Parameter
        and gated_form(type(module))
    )


@contextlib.contextmanager
def lean_gated_mlps(model: nn.Module) -> Iterator[int]:
    """Within the block, ``model``'s gated MLPs that :func:`takes_lean` compute through :class:`_GatedDown`
    when gradients are enabled, autocast is off, no layer is gradient-checkpointed and neither the model nor a
    module of it is ``torch.compile``'s (its graphs are traced from the modules as loaded); else nothing changes.
    Yields how many."""
    devices = {p.device.type for p in model.parameters()}
    off = os.environ.get(LEAN_VARIABLE, "").strip() == "0" or hasattr(model, "_orig_mod")  # torch.compile's wrapper
    if off or not torch.is_grad_enabled() or any(torch.is_autocast_enabled(d) for d in devices):
        yield 0
        return
    everything = list(model.modules())
    # a checkpointed layer's recompute runs in the backward, after the block: it must save what the forward did;
    # a layer compiled for the passes (rloo.training.regional_compile) traced its MLP's own forward
    traced = any(
        getattr(m, "gradient_checkpointing", False) is True or getattr(m, "_compiled_call_impl", None) is not None
        for m in everything
    )
    modules = [] if traced else [m for m in everything if takes_lean(m)]
    for module in modules:
        module.forward = types.MethodType(lean_forward, module)
    try:
        yield len(modules)
    finally:
        for module in modules:
            del module.forward
