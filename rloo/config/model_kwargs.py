"""``model_init_kwargs`` made writable and unambiguous before the config is frozen.

TRL's own example script passes ``model_init_kwargs={"dtype": torch.bfloat16}``: a ``torch.dtype``
object, which ``config.yaml`` cannot hold. Here a dtype object becomes its name (``"bfloat16"``;
``from_pretrained`` takes either), transformers 4's ``torch_dtype`` key becomes transformers 5's
``dtype``, and every other value must be one YAML can write (numbers, strings, booleans, None,
lists and mappings of them), so the recorded run file rebuilds the same model.

Checked without importing torch (the config module stays light to import).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# from_pretrained's dtype names (torch attribute names) besides "auto"
DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64", "float", "half", "double", "auto")


class InitKwargsError(ValueError):
    """A bad ``model_init_kwargs`` entry: ``key`` names it, ``fix`` says what to give."""

    def __init__(self, key: str, fix: str) -> None:
        super().__init__(fix)
        self.key, self.fix = key, fix


def _is_torch_dtype(value: Any) -> bool:
    return type(value).__module__ == "torch" and type(value).__name__ == "dtype"


def dtype_name(value: Any, key: str = "dtype") -> str:
    """``torch.bfloat16`` or ``"bfloat16"`` -> ``"bfloat16"`` (``"torch.bfloat16"`` too); else an error."""
    name = str(value).removeprefix("torch.") if _is_torch_dtype(value) or isinstance(value, str) else None
    if name not in DTYPE_NAMES:
        raise InitKwargsError(key, f"{key} must be a torch dtype or one of {list(DTYPE_NAMES)}, got {value!r}")
    return name


def _writable(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(_writable(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _writable(v) for k, v in value.items())
    return False


def normalize_init_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the dtype as a name under ``dtype``; raises :class:`InitKwargsError` naming the key."""
    out = dict(kwargs)
    if "torch_dtype" in out:
        old = out.pop("torch_dtype")
        if "dtype" in out and dtype_name(out["dtype"]) != dtype_name(old, "torch_dtype"):
            raise InitKwargsError("torch_dtype", "give the dtype once, as dtype (torch_dtype is its older name)")
        out.setdefault("dtype", old)
    if "dtype" in out:
        out["dtype"] = dtype_name(out["dtype"])
    for key, value in out.items():
        if not _writable(value):
            raise InitKwargsError(
                key,
                f"{key}={value!r} cannot be recorded in config.yaml; give plain values (numbers, strings, "
                "booleans, lists, mappings), or load the model yourself and pass it as `model`",
            )
    return out
