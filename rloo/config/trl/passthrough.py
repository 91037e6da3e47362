"""Keyword mappings the config passes through to transformers (``model_init_kwargs``,
``generation_kwargs``, ``chat_template_kwargs``), made writable and unambiguous before the config
is frozen.

``model_init_kwargs``:
TRL's own example script passes ``model_init_kwargs={"dtype": torch.bfloat16}``: a ``torch.dtype``
object, which ``config.yaml`` cannot hold. Here a dtype object becomes its name (``"bfloat16"``;
``from_pretrained`` takes either), transformers 4's ``torch_dtype`` key becomes transformers 5's
``dtype``, and every other value must be one YAML can write (numbers, strings, booleans, None,
lists and mappings of them), so the recorded run file rebuilds the same model.

Checked without importing torch (the config module stays light to import).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from enum import Enum
from typing import Any

from rloo.config.fields.generation import GenerationFields

# from_pretrained's dtype names (torch attribute names) besides "auto"
DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64", "float", "half", "double", "auto")


class KwargsError(ValueError):
    """A bad entry of a keyword mapping: ``key`` names it, ``fix`` says what to give."""

    def __init__(self, key: str, fix: str) -> None:
        super().__init__(fix)
        self.key, self.fix = key, fix


def _is_torch_dtype(value: Any) -> bool:
    return type(value).__module__ == "torch" and type(value).__name__ == "dtype"


def dtype_name(value: Any, key: str = "dtype") -> str:
    """``torch.bfloat16`` or ``"bfloat16"`` -> ``"bfloat16"`` (``"torch.bfloat16"`` too); else an error."""
    name = str(value).removeprefix("torch.") if _is_torch_dtype(value) or isinstance(value, str) else None
    if name not in DTYPE_NAMES:
        raise KwargsError(key, f"{key} must be a torch dtype or one of {list(DTYPE_NAMES)}, got {value!r}")
    return name


def _writable(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list | tuple):
        return all(_writable(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _writable(v) for k, v in value.items())
    return False


def lift_dtype(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``RLOOConfig`` keywords with TRL AsyncGRPOConfig's ``dtype`` (the policy's load dtype) moved into
    ``model_init_kwargs``, where rloo's ``from_pretrained`` keywords are; a ``dtype`` already in
    ``model_init_kwargs`` wins, as in TRL."""
    out = dict(kwargs)
    if "dtype" not in out:
        return out
    dtype, init = out.pop("dtype"), out.get("model_init_kwargs")
    if isinstance(init, str):
        raise ValueError(
            f"RLOOConfig(dtype={dtype!r}) goes into model_init_kwargs, given here as a string: give model_init_kwargs "
            "as a mapping, with its dtype"
        )
    out["model_init_kwargs"] = {"dtype": dtype, **(init or {})}
    return out


def normalize_init_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the dtype as a name under ``dtype``; raises :class:`KwargsError` naming the key."""
    out = dict(kwargs)
    if "torch_dtype" in out:
        old = out.pop("torch_dtype")
        if "dtype" in out and dtype_name(out["dtype"]) != dtype_name(old, "torch_dtype"):
            raise KwargsError("torch_dtype", "give the dtype once, as dtype (torch_dtype is its older name)")
        out.setdefault("dtype", old)
    if "dtype" in out:
        out["dtype"] = dtype_name(out["dtype"])
    if "quantization_config" in out:
        out["quantization_config"] = quantization_settings(out["quantization_config"])
    return check_writable(out, "or load the model yourself and pass it as `model`")


def quantization_settings(config: Any) -> Any:
    """A ``BitsAndBytesConfig``'s fields as a plain mapping config.yaml can hold (its ``quant_method`` enum as
    its value); anything else as given."""
    if not hasattr(config, "to_dict"):
        return config
    return {
        key: getattr(value, "value", value) if isinstance(value, Enum) else value
        for key, value in config.to_dict().items()
    }


def check_writable(kwargs: Mapping[str, Any], alternative: str = "") -> dict[str, Any]:
    """``kwargs`` as a dict when config.yaml can hold every value; else :class:`KwargsError` naming the key."""
    for key, value in kwargs.items():
        if not isinstance(key, str) or not _writable(value):
            raise KwargsError(
                str(key),
                f"{key}={value!r} cannot be recorded in config.yaml; give string keys and plain values (numbers, "
                f"strings, booleans, lists, mappings){', ' + alternative if alternative else ''}",
            )
    return dict(kwargs)


# generation_kwargs keys that have their own RLOOConfig field: set the field (TRL lets the
# dictionary override it silently; here the run file shows one value)
_FIELD_FOR = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_completion_length",
    "max_tokens": "max_completion_length",
}
GENERATION_KEYS = ("stop_strings", "stop", "eos_token_id", "do_sample")
# transformers' beam-search settings (length_penalty and the rest act only on beams)
BEAM_SEARCH_KEYS = ("num_beams", "num_beam_groups", "length_penalty", "early_stopping", "diversity_penalty")
BEAM_SEARCH = (
    "rloo does not do beam search: beams are the likeliest sequences, not K independent samples of the policy, and "
    "RLOO's leave-one-out baseline and policy gradient need samples; drop {keys} (num_beams=1 is accepted)"
)


def lift_generation_fields(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``RLOOConfig`` keywords with each ``generation_kwargs`` key that has its own field (``top_k``,
    ``max_new_tokens``, ...) moved to that field, so the run file shows one value, and ``num_beams=1``
    dropped (it is sampling). A field also given with another value than its default and the key's
    is an error naming both (TRL lets the dictionary win silently)."""
    given = kwargs.get("generation_kwargs")
    if not isinstance(given, Mapping):
        return dict(kwargs)
    defaults = {f.name: f.default for f in dataclasses.fields(GenerationFields)}
    out, rest = dict(kwargs), dict(given)
    for key in [key for key in given if key in _FIELD_FOR]:
        name, value = _FIELD_FOR[key], rest.pop(key)
        if out.get(name, defaults[name]) not in (defaults[name], value):
            raise ValueError(
                f"RLOOConfig got generation_kwargs={{{key!r}: {value!r}}} and {name}={out[name]!r}: "
                f"give the value once, as {name}"
            )
        out[name] = value
    if rest.get("num_beams") == 1:
        del rest["num_beams"]
    out["generation_kwargs"] = rest or None  # nothing left: as if not given
    return out


def _strings(key: str, value: Any) -> list[str]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list | tuple) or not values or not all(isinstance(v, str) and v for v in values):
        raise KwargsError(key, f"{key} must be a non-empty string or a list of them, got {value!r}")
    return list(values)


def _token_ids(key: str, value: Any) -> list[int]:
    values = [value] if isinstance(value, int) else value
    ok = isinstance(values, list | tuple) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    )
    if not ok:
        raise KwargsError(key, f"{key} must be a token id or a list of them (ints >= 0), got {value!r}")
    return list(values)


def normalize_generation_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``{"stop_strings": [...], "eos_token_id": [...]}`` (each only when given) from TRL's
    ``generation_kwargs``: ``stop_strings`` (transformers' name) or ``stop`` (vLLM's), extra EOS ids,
    and ``do_sample=True`` (what rloo does anyway). Keys with their own field were moved to it by
    :func:`lift_generation_fields` (one given later, as a command line's JSON, names the field to set);
    beam search is refused saying why; other keys raise :class:`KwargsError` naming what is supported."""
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in _FIELD_FOR:
            raise KwargsError(key, f"{key} has its own field: set {_FIELD_FOR[key]}={value!r} instead")
        if key in ("stop_strings", "stop"):
            if "stop_strings" in out:
                raise KwargsError(key, "give the stop strings once, as stop_strings (stop is vLLM's name)")
            out["stop_strings"] = _strings(key, value)
        elif key == "eos_token_id":
            out["eos_token_id"] = _token_ids(key, value)
        elif key in BEAM_SEARCH_KEYS:
            raise KwargsError(str(key), BEAM_SEARCH.format(keys=", ".join(k for k in kwargs if k in BEAM_SEARCH_KEYS)))
        elif key == "do_sample":
            if value is not True:
                raise KwargsError(key, "rloo always samples (RLOO needs K different completions); drop do_sample")
        else:
            raise KwargsError(str(key), f"{key!r} is not supported; generation_kwargs may hold {list(GENERATION_KEYS)}")
    return out
