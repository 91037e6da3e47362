"""Shared-prefix attention for the decode: each prompt's keys and values read once per group, not once per row.

The K completions of a prompt share its prefill. The plain decode repeats the prompt's cache for
each row (:func:`rloo.generation.kv_cache.share_prefill`) and every decode step's attention reads
each row's copy: at 320-token prompts, 64 new tokens and K = 8, those reads are 25 MB a layer a step
on the benchmark's 36M-parameter model, more than the layer's weights. Here each attention layer keeps
the prompt's keys and values once per prompt (:class:`SharedPrefixLayer`) and each row's own tokens in
a buffer of its own, and a step's attention is eager attention's over both,

    out = softmax([q K_pre^T, q K_own^T] * scale) [V_pre; V_own]        (-inf where the prompt is padding)

with the two products that read the prompt's cache (``q K_pre^T`` and the weights times ``V_pre``) run
once per prompt and KV head over all its rows' queries (K x heads-per-KV-head rows against the prompt's
keys): the prompt's cache is read once per group and held once instead of K times. The outputs equal
the plain decode's to float rounding (a different summation order).

It runs as an attention implementation of transformers' registry (:data:`SHARED_PREFIX`, the mask
function SDPA's), switched on for the decode steps only (:func:`shared_prefix_decoding`), for models
whose every layer is full attention through SDPA with a plain cache (:func:`uses_shared_prefix`):
sliding windows, hybrid and linear-attention layers, other cache classes keep the plain decode. A
call whose keys are not a :class:`SharedPrefixLayer`'s (another forward of the same model), or that
asks for what this path does not compute (a soft cap, attention sinks, a position bias), gets SDPA
itself on the whole keys. ``RLOO_SHARED_PREFIX=0`` turns it off; ``=1`` turns it on on a GPU too (to measure it
there: ``benchmarks/shared_prefix.py --device cuda``).

It costs about ten more ops a layer a step than SDPA's one (the products' rearrangements, the softmax's
own ops), which a short prompt's saved reads do not pay for: prompts shorter than :data:`MIN_PREFIX_TOKENS`
keep the plain decode. And only on a CPU, where it was measured (BENCHMARKS.md): on a GPU a small model's
decode step is bound by its kernel launches, and a GQA model's prompt cache is small next to its weights.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import threading
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import Tensor, nn
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from rloo.generation.kv_cache import PreallocatedLayer

SHARED_PREFIX = "rloo_shared_prefix"
# a padded prompt shorter than this keeps the plain decode (the module docstring; measured in BENCHMARKS.md)
MIN_PREFIX_TOKENS = 64
# keyword arguments that ask for what :meth:`SharedPrefixLayer.attend` does not compute (None or absent: nothing)
_UNSUPPORTED = ("softcap", "sinks", "s_aux", "position_bias", "sliding_window")

_pending = threading.local()  # the SharedPrefixLayer whose update the next attention call reads
# a module class -> whether its forward writes no cache or attends through the registry (attends_through_registry)
_DISPATCHES: dict[type, bool] = {}
_WRITES_CACHE = re.compile(r"\.update\(\s*key")  # cache.update(key_states, ...), layer_past.update(key_layer, ...)


class SharedPrefixLayer(PreallocatedLayer):  # type: ignore[no-untyped-call]
    """A layer's cache for P prompts of K rows each: the prompts' keys and values once ``(P, Hkv, Lp, D)`` and
    their mask ``(P, Lp)``, each decoding row's own tokens in a buffer of ``capacity`` ``(B, Hkv, capacity, D)``.
    ``rows``: the rollout rows ``(B,)`` still in the batch (row ``r``'s prompt is ``r // K``); ``keys`` and
    ``values`` are the rows' own tokens so far (what :meth:`update` returns)."""

    def __init__(self, keys: Tensor, values: Tensor, prompt_mask: Tensor, k: int, capacity: int) -> None:
        prompts, heads, _, dim = keys.shape
        own = (prompts * k, heads, 0)
        super().__init__(keys.new_empty((*own, dim)), values.new_empty((*own, values.shape[-1])), capacity)
        self.prefix_keys, self.prefix_values, self.prefix_mask = keys, values, prompt_mask.bool()
        self.group_size, self.total = k, prompts * k
        self.rows = torch.arange(self.total, device=keys.device)
        self._padded = not bool(self.prefix_mask.all())  # read once: a compaction keeps the prompts
        self._own()
        self._set_row_prefix_mask()

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> Any:
        super().update(key_states, value_states)
        self._own()
        _pending.layer = self
        return self.own_keys, self.own_values

    def _own(self) -> None:
        """``own_keys`` / ``own_values``: the rows' own tokens so far (PreallocatedLayer's ``keys`` / ``values``)."""
        self.own_keys, self.own_values = cast(Tensor, self.keys), cast(Tensor, self.values)

    def get_seq_length(self) -> int:
        return int(self.prefix_keys.shape[-2]) + self._length

    def select_rows(self, indices: Tensor) -> None:
        """Keep batch rows ``indices``: their own tokens (PreallocatedLayer's), their prompts' masks."""
        super().select_rows(indices)
        self._own()
        self.rows = self.rows[indices]
        self._set_row_prefix_mask()

    def _set_row_prefix_mask(self) -> None:
        """Each row's prompt mask ``(B, 1, 1, Lp)``, or None where no prompt has padding."""
        self.row_prefix_mask = self.prefix_mask[self.rows // self.group_size][:, None, None] if self._padded else None

    def whole(self) -> tuple[Tensor, Tensor, Tensor]:
        """Each row's keys and values over its prompt and its own tokens ``(B, Hkv, Lp + t, D)``, and its mask
        ``(B, Lp + t)``: the plain cache's, for a call this layer's split does not serve."""
        group = self.rows // self.group_size
        own = torch.ones(len(self.rows), self._length, dtype=torch.bool, device=self.rows.device)
        return (
            torch.cat([self.prefix_keys[group], self.own_keys], dim=-2),
            torch.cat([self.prefix_values[group], self.own_values], dim=-2),
            torch.cat([self.prefix_mask[group], own], dim=-1),
        )

    def attend(self, query: Tensor, scale: float) -> Tensor:
        """The attention of the batch's queries ``(B, H, Q, D)`` (the last Q of each row's own tokens) over
        their prompt and own tokens, ``(B, Q, H, D)`` as SDPA's attention functions return it: eager attention's
        ``softmax(q [K_pre; K_own]^T * scale) [V_pre; V_own]`` (float32 softmax), whose two products with the
        prompt's keys and values run per prompt over its rows' queries (:meth:`_per_prompt`)."""
        rows, heads, steps, dim = query.shape
        kv_heads = self.prefix_keys.shape[1]
        grouped = query.reshape(rows, kv_heads, heads // kv_heads * steps, dim)  # GQA: a KV head's query heads
        prefix = self._per_row(torch.matmul(self._per_prompt(grouped), self.prefix_keys.transpose(-1, -2)))
        if self.row_prefix_mask is not None:
            prefix = prefix.masked_fill(~self.row_prefix_mask, float("-inf"))
        own = torch.matmul(grouped, self.own_keys.transpose(-1, -2))
        if steps > 1:  # query i of Q sees its row's own tokens up to its position
            positions = torch.arange(self._length, device=query.device)
            last = positions[-steps:].repeat(heads // kv_heads)
            own = own.masked_fill(positions[None, :] > last[:, None], float("-inf"))
        scores = torch.cat([prefix, own], dim=-1).float().mul_(scale)
        weights = torch.softmax(scores, dim=-1).to(self.own_values.dtype)
        length = self.prefix_keys.shape[-2]
        out = self._per_row(torch.matmul(self._per_prompt(weights[..., :length]), self.prefix_values))
        out = torch.baddbmm(out.flatten(0, 1), weights[..., length:].flatten(0, 1), self.own_values.flatten(0, 1))
        return out.reshape(rows, heads, steps, dim).transpose(1, 2).contiguous()

    def _per_prompt(self, values: Tensor) -> Tensor:
        """Rows' ``(B, Hkv, R, X)`` as each prompt's ``(P, Hkv, K * R, X)`` (compacted: the rows at their
        rollout rows, the finished ones zeros), for one product per prompt and KV head."""
        if len(self.rows) != self.total:
            values = values.new_zeros((self.total, *values.shape[1:])).index_copy_(0, self.rows, values)
        prompts, k = self.prefix_keys.shape[0], self.group_size
        return values.reshape(prompts, k, *values.shape[1:]).transpose(1, 2).flatten(2, 3)

    def _per_row(self, values: Tensor) -> Tensor:
        """:meth:`_per_prompt`'s inverse: ``(P, Hkv, K * R, X)`` as the batch's rows ``(B, Hkv, R, X)``."""
        prompts, heads, _, width = values.shape
        rows = (
            values.reshape(prompts, heads, self.group_size, -1, width)
            .transpose(1, 2)
            .reshape(self.total, heads, -1, width)
        )
        return rows if len(self.rows) == self.total else rows.index_select(0, self.rows)


def shared_prefix_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function contract: ``(attn_output (B, Q, H, D), None)``. The keys a
    :class:`SharedPrefixLayer` just returned are attended with its prompt's (:meth:`SharedPrefixLayer.attend`;
    ``attention_mask`` is the layer's: the prompt's padding, the row's own tokens); anything else is SDPA's."""
    layer: SharedPrefixLayer | None = getattr(_pending, "layer", None)
    _pending.layer = None
    if layer is None or key is not layer.keys:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if dropout or any(kwargs.get(name) is not None for name in _UNSUPPORTED):
        keys, values, mask = layer.whole()
        steps = query.shape[2]
        full = mask[:, None, None, :].expand(-1, 1, steps, -1).clone()
        full[..., -steps:] &= torch.ones(steps, steps, dtype=torch.bool, device=full.device).tril()
        return sdpa_attention_forward(module, query, keys, values, full, dropout, scale, **kwargs)
    return layer.attend(query, scale), None


ALL_ATTENTION_FUNCTIONS.register(SHARED_PREFIX, shared_prefix_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(SHARED_PREFIX, sdpa_mask)


def full_sdpa_attention(model: nn.Module) -> bool:
    """Whether every layer of ``model`` attends over all its past tokens through SDPA (no sliding window)."""
    config: Any = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = set(getattr(text, "layer_types", None) or ["full_attention"])
    return bool(
        getattr(config, "_attn_implementation", None) == "sdpa"
        and getattr(text, "_attn_implementation", "sdpa") == "sdpa"
        and layer_types == {"full_attention"}
        and not getattr(text, "sliding_window", None)
    )


def attends_through_registry(cls: type) -> bool:
    """Whether ``cls.forward`` (its source, read once per class) either writes no cache or, if it does, takes its
    attention from transformers' registry (``ALL_ATTENTION_FUNCTIONS``). Falcon's, for one, calls SDPA itself
    when its config says ``"sdpa"`` and its own eager code otherwise: it would attend over a row's own tokens only."""
    if cls not in _DISPATCHES:
        try:
            source = inspect.getsource(cls.forward)  # type: ignore[attr-defined]
        except (OSError, TypeError, AttributeError):
            source = ""
        _DISPATCHES[cls] = bool(source) and (not _WRITES_CACHE.search(source) or "ALL_ATTENTION_FUNCTIONS" in source)
    return _DISPATCHES[cls]


def uses_shared_prefix(model: nn.Module, cache: Any, k: int, prompt_length: int) -> bool:
    """Whether a decode of ``k`` rows a prompt from a prefill's ``cache`` (P rows, padded prompts of
    ``prompt_length`` tokens) takes the shared prefix: K >= 2, prompts of :data:`MIN_PREFIX_TOKENS` or more,
    :func:`full_sdpa_attention` in modules that :func:`attends_through_registry`, a plain ``DynamicCache`` of plain
    layers on a CPU (on any device with ``RLOO_SHARED_PREFIX=1``); never with ``RLOO_SHARED_PREFIX=0``."""
    setting = os.environ.get("RLOO_SHARED_PREFIX", "")
    if setting == "0" or k < 2 or prompt_length < MIN_PREFIX_TOKENS:
        return False
    layers = getattr(cache, "layers", None)
    return bool(
        type(cache) is DynamicCache
        and layers
        and all(type(layer) is DynamicLayer and layer.keys is not None and layer.keys.numel() for layer in layers)
        and (setting == "1" or all(layer.keys.device.type == "cpu" for layer in layers))
        and full_sdpa_attention(model)
        and all(attends_through_registry(type(module)) for module in model.modules())
    )


def share_prefix(cache: DynamicCache, prompt_mask: Tensor, k: int, capacity: int) -> DynamicCache:
    """``cache`` of a P-prompt prefill (:func:`uses_shared_prefix`) made the cache of its ``P*k`` rows, each
    layer a :class:`SharedPrefixLayer` with room for ``capacity`` new tokens a row, in place."""
    for index, layer in enumerate(cache.layers):
        plain: Any = layer  # a DynamicLayer (uses_shared_prefix)
        cache.layers[index] = SharedPrefixLayer(plain.keys, plain.values, prompt_mask, k, capacity)
    return cache


@contextlib.contextmanager
def shared_prefix_decoding(model: nn.Module, on: bool) -> Iterator[None]:
    """With ``on``, ``model``'s attention is :data:`SHARED_PREFIX` inside (its config's and the text config's,
    set back after, also on an error); without, nothing changes."""
    if not on:
        yield
        return
    # the attribute behind the configs' ``_attn_implementation``, whose setter also sets every sub-config's
    # (a vision tower's would come back as the text model's)
    config: Any = model.config
    configs = [config] + ([config.get_text_config()] if hasattr(config, "get_text_config") else [])
    saved = [(c, c._attn_implementation_internal) for c in {id(c): c for c in configs}.values()]
    try:
        for c, _ in saved:
            c._attn_implementation_internal = SHARED_PREFIX
        yield
    finally:
        for c, value in saved:
            c._attn_implementation_internal = value
