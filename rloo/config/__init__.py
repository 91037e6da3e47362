"""``RLOOConfig``: one validated, frozen config object; algorithm presets."""

from rloo.config.rloo_config import RLOOConfig

__all__ = ["RLOOConfig"]
