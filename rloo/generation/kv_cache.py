"""Prefix sharing and a KV cache that grows in place, for the sampler.

Prefix sharing: each prompt is prefilled once and every state its cache holds is repeated
for the prompt's K samples (:func:`share_prefill`). Hybrid linear-attention / state-space
models hold more than keys and values per layer (convolution and recurrent states, in
``LinearAttention*`` layers), and ``transformers``' own ``batch_repeat_interleave`` misses
them (Falcon-H1's hybrid layers repeat the keys only) or is missing (``LinearAttentionLayer``),
so the repetition is ours: a table of the per-row states each known layer type holds. A
cache class or layer type not in the table, or a known layer holding a tensor the table
does not name, is not shared: the sampler prefills the prompt K times instead (exact, slower).

Preallocation: ``transformers``' ``DynamicCache`` appends every new token with ``torch.cat``,
which copies the whole cache each step: O(T^2) memory traffic, 29% of CPU sampling time at
128 new tokens on a 36M-parameter model. After the prompt prefill we swap each plain
``DynamicLayer`` for one that owns a buffer sized for the whole rollout and hands attention
views of its filled part, so attention still sees exactly the tokens so far. Layers of
another kind (sliding windows, linear attention and hybrid layers, other cache classes)
are left as they are.

Row selection (:func:`select_rows`): the sampler drops finished rows from its decode batch
(compaction), keeping only the rows of every per-row state that are still decoding; the same
table says which states those are, and a cache it does not know is never compacted.

Which cache a forward returned (:func:`returned_cache`) is read off the output's set fields, and
whether it holds attention over past tokens (:func:`is_recurrent`) off its layers' types: never by
which attribute answers first. transformers 5.24 renamed both ``past_key_values`` (attention
models) and ``cache_params`` (Mamba-style) to ``cache`` and answers the old names as aliases
until 5.40, so the old attribute test filed Mamba as an attention model and decoded it with the
whole attention mask: the wrong distribution from the second token on.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import cache_utils
from transformers.cache_utils import (
    CacheLayerMixin,
    DynamicCache,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionAndSlidingWindowAttentionLayer,
    LinearAttentionCacheLayerMixin,
    LinearAttentionLayer,
)

# a layer that holds nothing (MLP-only layers, layers reading another layer's cache); transformers >= 5.23
DummyLayer: type | None = getattr(cache_utils, "DummyLayer", None)

_KEY_VALUE = ("keys", "values")
_LINEAR = ("conv_states", "recurrent_states")  # dicts: state index -> (B, ...) tensor or None
# every per-row state (batch first) each known layer type holds
ROW_STATES: dict[type, tuple[str, ...]] = {
    DynamicLayer: _KEY_VALUE,
    DynamicSlidingWindowLayer: _KEY_VALUE,
    LinearAttentionLayer: _LINEAR,
    LinearAttentionAndFullAttentionLayer: _KEY_VALUE + _LINEAR,
    LinearAttentionAndSlidingWindowAttentionLayer: _KEY_VALUE + _LINEAR,
}
if DummyLayer is not None:
    ROW_STATES[DummyLayer] = ()
# tensors a known layer holds that are the same for every row
_SHARED_TENSORS = frozenset({"_sliding_window_tensor"})


# the names a forward's output holds its cache under, newest first (see the module docstring); a
# model takes its cache back under the name it returned it by
CACHE_FIELDS = ("cache", "past_key_values", "cache_params")


def cache_of(out: Any) -> tuple[str, Any] | None:
    """``(name, cache)``: the cache a forward's output holds, under the name the model takes it back
    by (read off the output's set fields, not its attribute aliases); None when it holds none."""
    fields = out.keys() if hasattr(out, "keys") else ()
    return next(((name, out[name]) for name in CACHE_FIELDS if name in fields and out[name] is not None), None)


def returned_cache(model: nn.Module, out: Any) -> tuple[str, Any]:
    """:func:`cache_of` a ``use_cache=True`` forward's output; a ``ValueError`` naming the model
    class when it returned none."""
    found = cache_of(out)
    if found is not None:
        return found
    raise ValueError(
        f"{type(model).__name__} returned no cache ({' or '.join(CACHE_FIELDS)}) from a forward with "
        "use_cache=True, so rloo's sampler cannot decode with it; use a model that returns its cache"
    )


def is_recurrent(cache: Any) -> bool:
    """Whether every layer of ``cache`` holds only recurrent states (Mamba-style state-space layers:
    a convolution window and an SSM state, no keys/values of past tokens; transformers' own
    ``Cache.is_linear`` test). Such a model's decoding step takes no attention mask, as its own
    ``generate`` passes none; an attention or hybrid cache takes the whole mask. A cache of another
    class (no ``layers``) counts as attention."""
    layers = [layer for layer in getattr(cache, "layers", ()) if DummyLayer is None or type(layer) is not DummyLayer]
    return bool(layers) and all(
        isinstance(layer, LinearAttentionCacheLayerMixin) and not isinstance(layer, CacheLayerMixin) for layer in layers
    )


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        value = list(value.values())
    return isinstance(value, list | tuple) and any(_holds_tensor(item) for item in value)


def _tensor_attributes(obj: Any) -> set[str]:
    return {name for name, value in vars(obj).items() if _holds_tensor(value)}


def _repeat_rows(value: Any, repeats: int) -> Any:
    """Row ``i`` of every tensor in ``value`` becomes rows ``i*repeats .. i*repeats + repeats - 1``."""
    if isinstance(value, torch.Tensor):
        return value.repeat_interleave(repeats, dim=0)
    if isinstance(value, dict):
        return {key: _repeat_rows(item, repeats) for key, item in value.items()}
    return value  # None: a state this prefill did not fill


def _select(value: Any, indices: torch.Tensor) -> Any:
    """Rows ``indices`` of every tensor in ``value`` (a tensor, or a dict of tensors and Nones)."""
    if isinstance(value, torch.Tensor):  # an unfilled layer's keys are an empty 1-D tensor
        return value if value.dim() <= 1 and value.numel() == 0 else value.index_select(0, indices)
    if isinstance(value, dict):
        return {key: _select(item, indices) for key, item in value.items()}
    return value


def unshareable_layers(cache: Any) -> list[str]:
    """The layer types of ``cache`` :func:`share_prefill` cannot repeat (the cache's class if it is
    not a plain ``DynamicCache``); empty when it can repeat every state the cache holds."""
    if type(cache) is not DynamicCache or _tensor_attributes(cache) - {"layers"}:
        return [type(cache).__name__]
    unknown = []
    for layer in cache.layers:
        states = ROW_STATES.get(type(layer))
        if states is None or _tensor_attributes(layer) - set(states) - _SHARED_TENSORS:
            unknown.append(type(layer).__name__)
    return unknown


def share_prefill(cache: Any, repeats: int) -> bool:
    """Repeat every per-row state of ``cache`` ``repeats`` times along the batch, in place:
    the cache of a prefill over P prompts becomes that of P*``repeats`` rows, the samples of a
    prompt consecutive. Returns False, leaving ``cache`` untouched, when :func:`unshareable_layers`
    names any type (the caller then prefills each row itself)."""
    if unshareable_layers(cache):
        return False
    for layer in cache.layers:
        for name in ROW_STATES[type(layer)]:
            setattr(layer, name, _repeat_rows(getattr(layer, name), repeats))
    return True


class PreallocatedLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A ``DynamicLayer`` whose keys/values are views into a buffer of ``capacity`` tokens."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        batch, heads, length, _ = keys.shape
        self.dtype, self.device = keys.dtype, keys.device
        self._key_buffer = keys.new_empty((batch, heads, capacity, keys.shape[-1]))
        self._value_buffer = values.new_empty((batch, heads, capacity, values.shape[-1]))
        self._key_buffer[:, :, :length] = keys
        self._value_buffer[:, :, :length] = values
        self._length = length
        self.keys, self.values = self._key_buffer[:, :, :length], self._value_buffer[:, :, :length]
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        end = self._length + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:  # past the planned length: fall back to growing
            self._key_buffer = torch.cat([self._key_buffer[:, :, : self._length], key_states], dim=-2)
            self._value_buffer = torch.cat([self._value_buffer[:, :, : self._length], value_states], dim=-2)
        else:
            self._key_buffer[:, :, self._length : end] = key_states
            self._value_buffer[:, :, self._length : end] = value_states
        self._length = end
        self.keys, self.values = self._key_buffer[:, :, :end], self._value_buffer[:, :, :end]
        return self.keys, self.values

    def select_rows(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` (their filled part copied into a new buffer of the same capacity)."""
        capacity, length = self._key_buffer.shape[-2], self._length
        keys, values = self._key_buffer[:, :, :length], self._value_buffer[:, :, :length]
        self._key_buffer = keys.new_empty((len(indices), keys.shape[1], capacity, keys.shape[-1]))
        self._value_buffer = values.new_empty((len(indices), values.shape[1], capacity, values.shape[-1]))
        self._key_buffer[:, :, :length] = keys.index_select(0, indices)
        self._value_buffer[:, :, :length] = values.index_select(0, indices)
        self.keys, self.values = self._key_buffer[:, :, :length], self._value_buffer[:, :, :length]


def can_select_rows(cache: Any) -> bool:
    """Whether :func:`select_rows` keeps every per-row state of ``cache``: a plain ``DynamicCache`` whose
    layers are preallocated or of a type :func:`unshareable_layers` knows, holding no other tensor."""
    if type(cache) is not DynamicCache or _tensor_attributes(cache) - {"layers"}:
        return False
    buffers = {"_key_buffer", "_value_buffer", "keys", "values"}
    for layer in cache.layers:
        if isinstance(layer, PreallocatedLayer):  # a subclass's select_rows keeps the per-row states it adds
            if type(layer) is PreallocatedLayer and _tensor_attributes(layer) - buffers:
                return False
            continue
        states = ROW_STATES.get(type(layer))
        if states is None or _tensor_attributes(layer) - set(states) - _SHARED_TENSORS:
            return False
    return True


def select_rows(cache: Any, indices: torch.Tensor) -> None:
    """Keep rows ``indices`` (a long tensor, in order) of every per-row state of ``cache``, in place.
    Only for a cache :func:`can_select_rows` accepts."""
    for layer in cache.layers:
        if isinstance(layer, PreallocatedLayer):
            layer.select_rows(indices)
            continue
        for name in ROW_STATES[type(layer)]:
            setattr(layer, name, _select(getattr(layer, name), indices))


def preallocate(cache: Any, extra_tokens: int) -> Any:
    """Give every plain dynamic layer of a plain ``DynamicCache`` room for ``extra_tokens`` more
    tokens. Other cache classes are left as they are: they may hold their layers' states elsewhere."""
    if type(cache) is not DynamicCache:
        return cache
    for index, layer in enumerate(cache.layers):
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if type(layer) is DynamicLayer and keys is not None and values is not None and keys.numel() > 0:
            cache.layers[index] = PreallocatedLayer(keys, values, keys.shape[-2] + extra_tokens)
    return cache
