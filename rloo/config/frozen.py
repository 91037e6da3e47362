"""``FrozenAfterInit``: a dataclass base that rejects unknown keywords with the closest field name
and becomes read-only once ``__post_init__`` calls ``_freeze()``. A subclass may rewrite its
constructor keywords first (``_translate_keywords``: older names -> today's).

Not ``@dataclass(frozen=True)``: ``__post_init__`` must normalize and resolve fields (presets,
tuples, mappings) before the object is frozen, and the errors name the fix
(``args.replace(field=...)``), not dataclasses' generic message.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rloo.suggest import unknown_name_error


class _TranslatesKeywords(type):
    """Passes the constructor keywords through ``cls._translate_keywords`` before ``__new__`` and the
    dataclass ``__init__`` see them (both take the same keywords, so only the metaclass can rewrite them)."""

    _translate_keywords: Callable[[dict[str, Any]], dict[str, Any]]

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return super().__call__(*args, **cls._translate_keywords(kwargs))


class FrozenAfterInit(metaclass=_TranslatesKeywords):
    _frozen: bool

    @staticmethod
    def _translate_keywords(kwargs: dict[str, Any]) -> dict[str, Any]:
        return kwargs

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # an unknown keyword gets the closest field name, not Python's bare TypeError
        names = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
        for key in kwargs:
            if key not in names:
                raise unknown_name_error(f"{cls.__name__} field", key, names)
        return super().__new__(cls)

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _freeze(self) -> None:
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen", False):
            raise dataclasses.FrozenInstanceError(
                f"{type(self).__name__} is frozen once validated (the trainer and config.yaml must see the same "
                f"values); cannot set `{name}`. Build a changed copy with `args.replace({name}=...)`"
            )
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"{type(self).__name__} is frozen once validated; cannot delete `{name}`")
