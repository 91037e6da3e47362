"""Named variants of one piece of math, each registered with its printed formula.

Every registry holds entries of one signature (advantage estimators, KL estimators and
placements, policy losses, loss aggregations), so callers look a variant up by name and
never branch on it. Registering a name twice is an error, and an unknown name lists the
valid ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T], Generic[T]):
    """``name -> entry``, with ``formula(name)``: the text the trainer prints at start-up."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._formulas: dict[str, str] = {}

    def add(self, name: str, entry: T, formula: str) -> T:
        """Register ``entry`` under ``name``; a name already taken raises ``ValueError``."""
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
        if not formula:
            raise ValueError(f"{self.kind} {name!r} needs a formula: it is printed at start-up")
        self._entries[name] = entry
        self._formulas[name] = formula
        return entry

    def register(self, name: str, formula: str) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""

        def decorate(entry: T) -> T:
            return self.add(name, entry, formula)

        return decorate

    def get_entry(self, name: str) -> T:
        """The entry for ``name``; an unknown name raises ``ValueError`` listing the valid ones."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {sorted(self._entries)}")
        return self._entries[name]

    def formula(self, name: str) -> str:
        self.get_entry(name)
        return self._formulas[name]

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
