"""``FrozenAfterInit``: a dataclass base that rejects unknown keywords with the closest field name,
validates on construction, validates again on every assignment, and becomes read-only once its
consumer calls ``freeze()`` (``RLOOTrainer`` does when it takes the config). A subclass may rewrite
its constructor keywords first (``_translate_keywords``: older names -> today's).

An assignment between construction and ``freeze()`` builds the object anew with the change
(``_assign``), so a script may set a field after parsing (as TRL's own scripts do) and what the
trainer reads is still one validated, resolved whole, the values ``config.yaml`` records.

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
        try:
            return super().__call__(*args, **cls._translate_keywords(kwargs))
        except ValueError as err:  # a subclass (GRPOConfig) is named as the user wrote it
            if cls.__name__ != "RLOOConfig" and err.args and isinstance(err.args[0], str):
                message = err.args[0]
                for form in ("RLOOConfig(", "RLOOConfig.", "RLOOConfig got"):
                    message = message.replace(form, cls.__name__ + form.removeprefix("RLOOConfig"))
                err.args = (message, *err.args[1:])
            raise


class FrozenAfterInit(metaclass=_TranslatesKeywords):
    _validated: bool
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

    def _validated_now(self) -> None:
        """Called at the end of ``__post_init__``: assignments from now on re-validate."""
        object.__setattr__(self, "_validated", True)

    def _assign(self, name: str, value: Any) -> None:
        """``self.name = value`` after construction: the subclass rebuilds itself validated."""
        raise NotImplementedError

    def freeze(self) -> None:
        """Read-only from now on (the consumer took the values)."""
        object.__setattr__(self, "_frozen", True)

    @property
    def frozen(self) -> bool:
        return bool(self.__dict__.get("_frozen", False))

    def __setattr__(self, name: str, value: Any) -> None:
        if self.frozen:
            raise dataclasses.FrozenInstanceError(
                f"{type(self).__name__} is read-only once a trainer took it (the trainer and config.yaml must see "
                f"the same values); cannot set `{name}`. Set it before creating the trainer, or give a new trainer a "
                f"changed copy: `args.replace({name}=...)`"
            )
        if self.__dict__.get("_validated", False):
            self._assign(name, value)
        else:  # the dataclass __init__
            object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(
            f"{type(self).__name__} fields cannot be deleted; set `{name}` to a value, or None for its default"
        )
