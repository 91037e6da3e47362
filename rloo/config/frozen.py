"""``FrozenAfterInit``: a dataclass base that rejects unknown keywords with the closest field name
and becomes read-only once ``__post_init__`` calls ``_freeze()``.

Not ``@dataclass(frozen=True)``: ``__post_init__`` must normalize and resolve fields (presets,
tuples, mappings) before the object is frozen, and the errors name the fix
(``args.replace(field=...)``), not dataclasses' generic message.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rloo.suggest import unknown_name_error


class FrozenAfterInit:
    _frozen: bool

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
