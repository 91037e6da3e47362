"""The annotations of ``RLOOConfig``'s container fields: one type for the type checker (what a
constructed config holds), another at run time (what the constructor also accepts).

transformers' ``HfArgumentParser`` (and TRL's ``TrlParser`` on top of it) build their command-line
flags from the run-time annotations: a ``list[X]`` field takes several values (``--reward_weights
1.0 0.5``), a ``dict | str | None`` field takes one string (a JSON object, as transformers' own
``TrainingArguments`` reads ``--accelerator_config '{...}'``). ``Mapping``/``Sequence`` and
``tuple`` annotations, which the type checker prefers, would make those flags fail. The
constructor converts (:meth:`RLOOConfig.__post_init__`): a JSON string to a read-only mapping, a
list to a tuple, one name to a list of one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a constructed config holds
    KeywordMapping = Mapping[str, Any]
    FloatList = Sequence[float]
    NameList = Sequence[str]
    FloatPair = tuple[float, float]
else:  # what the constructor accepts, and what HfArgumentParser makes flags of
    KeywordMapping = dict[str, Any] | str  # str: a JSON object, as from a command line
    FloatList = list[float]
    NameList = list[str] | str  # str: one name
    FloatPair = list[float]

CONTAINER_KINDS = {"KeywordMapping": "mapping", "FloatList": "list", "NameList": "list", "FloatPair": "list"}
_SHOWN = {
    "KeywordMapping": "a mapping (or a JSON object in a string)",
    "FloatList": "a list of numbers",
    "NameList": "a list of names (or one name)",
    "FloatPair": "a [min, max] pair of numbers",
}


def shown_type(annotation: str) -> str:
    """A declared annotation with its container alias in words, for an error message:
    ``FloatList | None`` -> ``a list of numbers | None``."""
    for alias, words in _SHOWN.items():
        annotation = annotation.replace(alias, words)
    return annotation


def parse_json_object(text: str) -> dict[str, Any]:
    """``'{"dtype": "bfloat16"}'`` -> ``{"dtype": "bfloat16"}``; a ``ValueError`` saying what was
    wrong for text that is no JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"expects a mapping, or a JSON object in a string such as '{{\"key\": 1}}' (not JSON: {err.msg} at "
            f"character {err.pos})"
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"expects a mapping, or a JSON object in a string, not a JSON {type(value).__name__}")
    return value


def declared_annotation(cls: type, name: str) -> str:
    """Field ``name``'s annotation as written in its class body. Not ``Field.type``: transformers'
    HfArgumentParser (TRL's TrlParser) rewrites that in place, to the resolved type without ``| None``."""
    for klass in cls.__mro__:
        annotation = vars(klass).get("__annotations__", {}).get(name)
        if annotation is not None:
            return annotation if isinstance(annotation, str) else str(annotation)
    raise KeyError(name)
