"""How a field of ``RLOOConfig`` is declared: :func:`option` gives it a default, its help text and its TRL
counterpart; :func:`default_value` and :func:`trl_name` read them back (the docs' field table, ``rloo train``'s
flags)."""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any

# each option's TRL counterpart, by its dataclass Field (read with trl_name). Not in the field's
# metadata: transformers' HfArgumentParser (and TRL's TrlParser) pass every metadata key to
# argparse's add_argument, which refuses one it does not know
_TRL_NAMES: dict[Any, str | None] = {}  # dataclasses.Field hashes by identity


def option(default: Any, help: str, *, trl: str | None = None) -> Any:
    """A constructor field with its documentation: ``help`` (what it does, unit, range; the only
    metadata key, as argparse reads it) and ``trl``, the TRL 1.13 ``RLOOConfig``/``TrainingArguments``
    field that means the same (None: no counterpart; :func:`trl_name`)."""
    if isinstance(default, tuple):  # a list field: transformers' HfArgumentParser reads only a default_factory
        declared = field(default_factory=lambda: list(default), metadata={"help": help})
    else:
        declared = field(default=default, metadata={"help": help})
    _TRL_NAMES[declared] = trl
    return declared


def default_value(declared: Any) -> Any:
    """A field's default as the docs and ``--help`` show it (a list field's too)."""
    return declared.default_factory() if declared.default is MISSING else declared.default


def trl_name(declared: Any) -> str | None:
    """The TRL field a field of ``RLOOConfig`` (a ``dataclasses.Field``) means the same as; None: none.
    A ``KeyError`` for a field not declared with :func:`option`."""
    return _TRL_NAMES[declared]
