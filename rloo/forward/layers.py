"""Per-layer attributes of a model's text config.

transformers' heterogeneous configs (Gemma 4: full-attention layers with a larger ``head_dim`` and other
key/value heads than the sliding ones) keep such attributes per layer, and reading one off the global
config raises ``AmbiguousGlobalPerLayerAttributeError``; a plain config holds one value for every layer.
"""

from __future__ import annotations

from typing import Any


def text_config(model_or_config: Any) -> Any:
    """The (text) config of a model or a config: a vision-language model's ``text_config``."""
    config = getattr(model_or_config, "config", model_or_config)
    return getattr(config, "text_config", None) or config


def per_layer(config: Any, name: str, default: Any = None) -> list[Any]:
    """``name`` of each of the config's ``num_hidden_layers`` layers (``default`` where unset or None)."""
    layers = int(getattr(config, "num_hidden_layers", 1) or 1)
    if getattr(config, "is_heterogeneous", False):
        return [_value(layer, name, default) for layer in config.per_layer_config][:layers]
    return [_value(config, name, default)] * layers


def _value(config: Any, name: str, default: Any) -> Any:
    value = getattr(config, name, None)
    return default if value is None else value
