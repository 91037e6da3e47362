"""Which arguments a reward function takes: TRL's ``f(prompts, completions, **kwargs)`` gets every
argument; a tutorial's ``f(completions, prompts=None)`` gets only the ones it names.

Each function's signature is inspected once (cached per function object). A function that
*requires* an argument nobody provides (not a standard argument, not a dataset column; or a
column it lists in a ``required_columns`` attribute, where a tuple means "one of these") is
refused when the trainer is built,
naming the function, the argument and the columns there are, instead of failing at the first
step.

How they receive a completion: a string, or a conversation whose scored text :func:`completion_text` reads.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# what every reward function may ask for, besides the dataset columns
STANDARD_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_cache: weakref.WeakKeyDictionary[Any, tuple[frozenset[str] | None, frozenset[str]]] = weakref.WeakKeyDictionary()


def _inspect(func: Any) -> tuple[frozenset[str] | None, frozenset[str]]:
    """``(accepted, required)`` keyword names; ``accepted`` is None for ``**kwargs`` (takes all)."""
    try:
        return _cache[func]
    except (KeyError, TypeError):  # not seen yet, or not weakly referenceable
        pass
    try:
        parameters = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: pass everything
        return None, frozenset()
    named = [p for p in parameters if p.kind in _KEYWORD_KINDS]
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    accepted = None if takes_all else frozenset(p.name for p in named)
    # a positional-only parameter cannot be passed by keyword: reported as required and never given
    required = frozenset(
        ("/" if p.kind is inspect.Parameter.POSITIONAL_ONLY else "") + p.name
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind is not inspect.Parameter.VAR_POSITIONAL
        and p.kind is not inspect.Parameter.VAR_KEYWORD
    )
    with contextlib.suppress(TypeError):  # not weakly referenceable: inspected again next time
        _cache[func] = (accepted, required)
    return accepted, required


def arguments_for(func: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``kwargs`` that ``func`` accepts (all of it when it takes ``**kwargs``)."""
    accepted, _ = _inspect(func)
    return dict(kwargs) if accepted is None else {k: v for k, v in kwargs.items() if k in accepted}


def check_reward_arguments(funcs: Iterable[Any], names: Iterable[str], columns: Iterable[str]) -> None:
    """Raise ``ValueError`` when a function requires an argument that no one will pass."""
    available = set(STANDARD_ARGUMENTS) | set(columns)
    for func, name in zip(funcs, names, strict=True):
        required = _inspect(func)[1]
        positional = sorted(name[1:] for name in required if name.startswith("/"))
        if positional:
            raise ValueError(
                f"reward function `{name}` takes {', '.join(positional)} positionally only (before `/`), but reward "
                "functions are called with keyword arguments; drop the `/` from its signature"
            )
        # a function reading a column through **kwargs can name it in `required_columns`; a tuple
        # there is a choice (any one of its columns will do)
        listed = getattr(func, "required_columns", ())
        choices = [" or ".join(c) for c in listed if isinstance(c, tuple) and not set(c) & available]
        columns_listed = {c for c in listed if isinstance(c, str)}
        missing = sorted((required | columns_listed) - available) + choices
        if missing:
            raise ValueError(
                f"reward function `{name}` requires argument(s) {', '.join(missing)}, but the dataset has no such "
                f"column (columns: {', '.join(sorted(columns)) or 'none'}; every function may also take "
                f"{', '.join(STANDARD_ARGUMENTS)}). Add the column, rename the argument, or give it a default"
            )


def completion_text(completion: Any) -> str:
    """The text of one completion: a string as is; a conversation -> the content of its last
    ``assistant`` message (the last message if none has that role); a single message dict ->
    its content. ``None`` content is ``""``; a list of content parts joins their ``text``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return _content_text(completion.get("content"))
    if isinstance(completion, Sequence):
        if not completion:
            return ""
        assistant = [m for m in completion if isinstance(m, Mapping) and m.get("role") == "assistant"]
        last = assistant[-1] if assistant else completion[-1]
        return completion_text(last)
    raise TypeError(
        f"a completion is a string or a list of {{'role', 'content'}} messages, got {type(completion).__name__}"
    )


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # multimodal parts: [{"type": "text", "text": ...}, ...]
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return str(content)
