"""Training state on disk without pickle: tensors in safetensors, everything else in JSON.

A checkpoint's optimizer, scheduler, RNG and sampler states are nested dicts, lists and
tuples of numbers, strings, tensors and numpy arrays. :func:`save_state` writes the tensors
to ``<name>.safetensors`` and the structure to ``<name>.json``, with each tensor or array
replaced by a tagged reference; :func:`load_state` reads them back. Neither file format can
carry code, so loading a shared or downloaded checkpoint never runs any (``torch.load`` with
``weights_only=False``, which earlier versions used, unpickles arbitrary objects).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

_TENSOR, _ARRAY, _TUPLE = "__tensor__", "__ndarray__", "__tuple__"


class _Tensors(dict[str, torch.Tensor]):
    """A state's tensors by key, on the CPU. A tensor whose memory one already stored holds is copied:
    safetensors refuses shared memory, and bitsandbytes' 8-bit optimizers share one quantization map
    between every parameter's state (on a GPU ``.cpu()`` copies anyway; on a CPU it does not)."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: set[int] = set()

    def add(self, tensor: torch.Tensor) -> str:
        stored = tensor.detach().cpu().contiguous()
        address = stored.untyped_storage().data_ptr()
        if stored.numel() and address in self.storages:
            stored = stored.clone()
        self.storages.add(stored.untyped_storage().data_ptr())
        key = f"t{len(self)}"
        self[key] = stored
        return key


def _encode(value: Any, tensors: _Tensors) -> Any:
    """``value`` as JSON-ready data; each tensor is stored in ``tensors`` under a fresh key."""
    if isinstance(value, torch.Tensor):
        return {_TENSOR: tensors.add(value)}
    if isinstance(value, np.ndarray):
        return {_ARRAY: value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        if not all(isinstance(k, str | int) for k in value):
            raise TypeError(f"cannot store a dict with keys of type {sorted({type(k).__name__ for k in value})}")
        # JSON keys are strings: int keys (optimizer state ids) are tagged to come back as ints
        return {("i:" if isinstance(k, int) else "s:") + str(k): _encode(v, tensors) for k, v in value.items()}
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot store a {type(value).__name__} in a checkpoint's training state")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if _TENSOR in value:
        return tensors[value[_TENSOR]]
    if _ARRAY in value:
        return np.asarray(value[_ARRAY], dtype=np.dtype(value["dtype"]))
    if _TUPLE in value:
        return tuple(_decode(v, tensors) for v in value[_TUPLE])
    return {(int(k[2:]) if k.startswith("i:") else k[2:]): _decode(v, tensors) for k, v in value.items()}


def save_state(state: dict[str, Any], folder: Path, name: str) -> list[Path]:
    """Write ``state`` as ``folder/<name>.json`` and ``folder/<name>.safetensors``; returns both paths."""
    tensors = _Tensors()
    structure = _encode(state, tensors)
    json_path, tensor_path = folder / f"{name}.json", folder / f"{name}.safetensors"
    save_file(tensors, str(tensor_path))
    json_path.write_text(json.dumps(structure, allow_nan=True))
    return [json_path, tensor_path]


def load_state(folder: Path, name: str) -> dict[str, Any]:
    """Read what :func:`save_state` wrote; nothing in either file is executed."""
    json_path, tensor_path = folder / f"{name}.json", folder / f"{name}.safetensors"
    try:
        structure = json.loads(json_path.read_text())
        tensors = load_file(str(tensor_path))
        state = _decode(structure, tensors)
    except Exception as error:  # any parse failure of untrusted files (SafetensorError included)
        raise ValueError(
            f"the training state in {folder} is unreadable ({type(error).__name__}: {error}); "
            "resume from another checkpoint"
        ) from error
    if not isinstance(state, dict):
        raise ValueError(f"the training state in {json_path} is not a mapping; resume from another checkpoint")
    return state
