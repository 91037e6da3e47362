"""Counting what a piece of code dispatches: aten ops and host syncs, numbers that do not depend on
the machine's speed.

A host sync is an op whose result the CPU must wait for before it can go on: on a GPU it drains the
launch queue, so host time and device time add up instead of overlapping, and inside a CUDA graph
capture it is an error. On a CPU nothing waits, but the same ops are dispatched, so the count taken
here is the count a GPU run makes (``torch.cuda.set_sync_debug_mode`` counts them only on CUDA).

Counted as syncs: ``_local_scalar_dense`` (``.item()``, ``bool()``, ``int()``, ``float()`` of a
tensor), ops whose output size depends on the values (``nonzero``, ``masked_select``, ``unique``,
indexing with a boolean mask, ``repeat_interleave`` with tensor repeats and no ``output_size``),
``equal`` (a reduction read back), and ``Tensor.tolist()`` (one copy to the host; it dispatches no
op, so it is counted by wrapping the method while counting).

Counted as views: ops that only make a new view of a tensor (their schema returns an alias of an input
they do not write: ``view``, ``slice``, ``transpose``, ...; and ``_unsafe_view``, which does not say so).
Each costs the host a dispatch but launches no kernel on a GPU, so ``non_view_ops`` is the closer count of
a step's kernel launches there.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ops that always wait for the device (their output, or its size, is read on the host)
SYNC_OPS = frozenset(
    {"_local_scalar_dense", "nonzero", "masked_select", "equal", "_unique2", "unique_dim", "unique_consecutive"}
)


def _is_view(func: Any) -> bool:
    return bool(getattr(func, "is_view", False)) or func.overloadpacket.__name__ == "_unsafe_view"


def _is_sync(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if name in SYNC_OPS:
        return True
    if name == "index":  # a boolean mask among the indices: its true count sizes the output
        indices = args[1] if len(args) > 1 else ()
        return any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices if i is not None
        )
    if name == "repeat_interleave":  # tensor repeats: their sum sizes the output, unless it is given
        return isinstance(args[0], torch.Tensor) and kwargs.get("output_size") is None and len(args) < 4
    return False


class OpCounts(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the aten ops dispatched (``ops``, by name), the host syncs among them (``syncs``, by
    name; ``tolist`` included) and the views (``views``, by name) while active. Use as a context manager;
    nesting another dispatch mode inside is fine."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()
        self.views: Counter[str] = Counter()
        self._tolist: Any = None

    @property
    def total_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def non_view_ops(self) -> int:
        """The ops that are not views: on a GPU, about the kernels launched."""
        return self.total_ops - sum(self.views.values())

    @property
    def total_syncs(self) -> int:
        return sum(self.syncs.values())

    def __enter__(self) -> OpCounts:
        tolist, syncs = torch.Tensor.tolist, self.syncs

        def counted_tolist(tensor: torch.Tensor) -> Any:
            syncs["tolist"] += 1
            return tolist(tensor)

        self._tolist = tolist
        torch.Tensor.tolist = counted_tolist  # type: ignore[method-assign,assignment]
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        torch.Tensor.tolist = self._tolist  # type: ignore[method-assign]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if _is_view(func):
            self.views[name] += 1
        if _is_sync(name, args, kwargs):
            self.syncs[name] += 1
        return func(*args, **kwargs)
