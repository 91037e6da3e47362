"""``torch_compile``: the training passes run the model's decoder layers compiled, and the rest eager.

Why not ``torch.compile(model)``: a compiled whole model cannot carry the forward pre-hook the chunked and
fused LM heads take their inputs through (:mod:`rloo.forward.lm_head`; a hook would recompile it), so its
passes took the plain head, ``(rows, T, V)`` float32 logits within ``max_logits_memory_mb``: one row a pass
at a 151,936-token vocabulary and 768 tokens (467 MiB a row against 256). Compiling each decoder layer
instead (what torchtune does, and PyTorch's "regional compilation" recipe: one layer's graph serves every
layer of its class) keeps the head ours, prompt sharing and packing, and the rows a pass the eager run takes;
the layers' work, where compilation gains, is compiled.

How: ``nn.Module.compile`` sets a module's ``_compiled_call_impl``, which ``Module.__call__`` runs instead of
its own. :class:`CompiledLayers` compiles each layer's call once (``dynamic=True``: a batch's lengths change
every step) and sets it only inside :meth:`CompiledLayers.active`, around the training passes: sampling, the
reference and the no-grad log-prob passes run the same layers eagerly (their cache objects and one-token
shapes would only recompile). The layers are the modules of the classes the model names in
``_no_split_modules`` (transformers' decoder-layer classes); a model naming none is compiled whole, as
before, with the plain head.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The modules of the classes ``model`` (a PEFT model: its base) lists in ``_no_split_modules``, outermost
    first (a listed module inside another listed one is left to its parent's graph)."""
    get_base: Any = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if type(module).__name__ in names:
            layers.append(module)
            inside.update(id(child) for child in module.modules())
    return layers


class CompiledLayers:
    """``model``'s decoder layers (:func:`decoder_layers`), each call compiled once by ``torch.compile``
    (``backend``, ``mode``, dynamic shapes), run compiled inside :meth:`active` only."""

    def __init__(self, model: nn.Module, backend: str, mode: str | None) -> None:
        self.layers = decoder_layers(model)
        self.calls: list[Callable[..., Any]] = [
            torch.compile(layer._call_impl, backend=backend, mode=mode, dynamic=True) for layer in self.layers
        ]

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The layers run compiled within the block (each restored to its eager call after, also on an error)."""
        for layer, call in zip(self.layers, self.calls, strict=True):
            layer._compiled_call_impl = call
        try:
            yield
        finally:
            for layer in self.layers:
                layer._compiled_call_impl = None


def compile_for_training(model: Any, args: Any) -> tuple[Any, CompiledLayers | None]:
    """What the training passes run when ``args.torch_compile``: ``(model, its compiled layers)``; a model with
    no decoder-layer classes listed ``(torch.compile(model), None)``, whose passes take the plain head; without
    ``torch_compile`` ``(model, None)``."""
    if not args.torch_compile:
        return model, None
    backend = args.torch_compile_backend or "inductor"
    known = torch._dynamo.list_backends(exclude_tags=())
    if backend not in known:
        raise ValueError(f"RLOOConfig.torch_compile_backend={backend!r} is invalid: this torch has {sorted(known)}")
    layers = CompiledLayers(model, backend, args.torch_compile_mode)
    if layers.layers:
        return model, layers
    return torch.compile(model, backend=backend, mode=args.torch_compile_mode, dynamic=True), None
