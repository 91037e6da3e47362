"""The config's one error format, shared by every check (:mod:`rloo.config.validation` and the field
groups' own checks in :mod:`rloo.config.fields`), so a bad value reads the same wherever it is caught."""

from __future__ import annotations

from typing import Any


def fail(name: str, value: Any, fix: str) -> ValueError:
    """The one error format: ``RLOOConfig.<name>=<value> is invalid: <fix>``."""
    return ValueError(f"RLOOConfig.{name}={value!r} is invalid: {fix}")
