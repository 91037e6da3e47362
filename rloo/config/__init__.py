"""``RLOOConfig``: one validated, frozen config object; algorithm presets."""

from typing import Any

from rloo.config.rloo_config import RLOOConfig

__all__ = ["RLOOConfig", "as_config"]


def as_config(args: Any) -> RLOOConfig:
    """``args`` as the trainer takes it: an ``RLOOConfig``, or None for the defaults."""
    if args is None:
        return RLOOConfig()
    if not isinstance(args, RLOOConfig):
        raise ValueError(
            f"args must be an RLOOConfig, got a {type(args).__name__}; build one with RLOOConfig(**values) "
            "(or RLOOConfig.from_dict(values))"
        )
    return args
