"""``RLOOConfig``: one validated, frozen config object; algorithm presets.

Its fields and their checks are grouped by feature in :mod:`rloo.config.fields`; the rules across groups
are in :mod:`rloo.config.validation`; TRL's names and classes in :mod:`rloo.config.trl`.
"""

from typing import Any

from rloo.config.rloo_config import RLOOConfig

__all__ = ["RLOOConfig", "as_config"]


def as_config(args: Any) -> RLOOConfig:
    """``args`` as the trainer takes it: an ``RLOOConfig``, or None for the defaults; read-only from
    now on, so the trainer and ``config.yaml`` see the values it has now."""
    config = RLOOConfig() if args is None else args
    if not isinstance(config, RLOOConfig):
        raise ValueError(
            f"args must be an RLOOConfig, got a {type(args).__name__}; build one with RLOOConfig(**values) "
            "(or RLOOConfig.from_dict(values))"
        )
    config.freeze()
    return config
