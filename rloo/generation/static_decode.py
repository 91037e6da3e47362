"""The sampler's decode step at static shapes: what :mod:`rloo.generation.graph_decode` runs, eagerly
on a CPU and as one CUDA graph per batch-size bucket on a GPU.

Every tensor the step reads or writes is allocated once, for N rows and a cache of L positions, and
updated in place, so the step launches the same kernels on the same addresses every time (what a
CUDA graph replays):

- keys and values ``(N, H_kv, L, D)`` per layer (:class:`RowBufferLayer`), the prompt's states
  copied in after the prefill, each step's written by ``index_copy_`` at ``write_at``;
- the step's inputs: the token ``(N, 1)``, its position ``(N, 1)`` and a 4-D attention mask
  ``(N, 1, 1, L)``, which transformers passes to attention as it is (no mask building, and none of
  the host syncs that come with it);
- sampling inside the step (:func:`rloo.generation.sampling.sample_next_token`) from each completion's
  own uniforms ``(N, Tc)`` at a device step counter, writing the token, its log-prob and whether the
  row finished into ``(N, Tc)`` / ``(N,)`` outputs. Nothing in the step reads a value on the host.

A batch-size bucket B (N, N/2, N/4, ...) runs the step on the first B rows of each buffer: its
slots. Compaction (:meth:`StaticDecoder.compact`) gathers the rows still decoding into the first
slots of a smaller bucket, as :mod:`rloo.generation.decoding` drops finished rows; the rest of that
bucket's slots hold finished rows, which decode padding as they would without compaction. A slot's
output cells are found through ``rows``, its rollout row, so the outputs never move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache, CacheLayerMixin

from rloo.generation.sampling import SamplingParams, sample_next_token


class RowBufferLayer(CacheLayerMixin):  # type: ignore[no-untyped-call]
    """A cache layer over preallocated ``(B, H_kv, L, D)`` keys and values: a decoding step writes its
    key and value at cache index ``write_at`` ``(1,)`` and attends over all L positions (the 4-D mask
    hides those not yet written), so its shapes never change."""

    is_compileable = True

    def __init__(self, keys: Tensor, values: Tensor, write_at: Tensor) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.buffers, self.write_at = (keys, values), write_at
        self.keys, self.values = keys, values
        self.device, self.dtype = keys.device, keys.dtype
        self.is_initialized = True

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        raise RuntimeError("a RowBufferLayer is built over its buffers")

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        keys, values = self.buffers
        keys.index_copy_(2, self.write_at, key_states)
        values.index_copy_(2, self.write_at, value_states)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.buffers[0].shape[-2], 0

    def get_seq_length(self) -> int:
        # the capacity: the step passes its positions and mask, so the model never asks how full it is
        return self.buffers[0].shape[-2]

    def get_max_length(self) -> int:
        return self.buffers[0].shape[-2]


@dataclass(frozen=True)
class DecodeSpec:
    """Everything a :class:`StaticDecoder`'s buffers and captured graphs are built for; a rollout that
    needs anything else gets a new decoder. ``kv``: each layer's ``(H_kv, D_k, D_v, key dtype, value
    dtype)``; ``weights``: the sampling model's parameter addresses (a graph reads them by address);
    ``boolean_mask``: SDPA's mask (True attends), else an additive one in ``mask_dtype`` (eager attention)."""

    rows: int
    length: int
    new_tokens: int
    vocab: int
    kv: tuple[tuple[int, int, int, torch.dtype, torch.dtype], ...]
    params: SamplingParams
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    keyword: str
    boolean_mask: bool
    mask_dtype: torch.dtype
    device: torch.device
    buckets: tuple[int, ...]
    weights: tuple[int, ...]


def buckets_for(rows: int, compact: bool) -> tuple[int, ...]:
    """The batch sizes a decode of ``rows`` rows runs at: ``rows``, then (with compaction) half of it,
    rounded up, down to 1, e.g. 64, 32, ..., 1 or 12, 6, 3, 2, 1."""
    sizes = [rows]
    while compact and sizes[-1] > 1:
        sizes.append(-(-sizes[-1] // 2))
    return tuple(sizes)


class StaticDecoder:
    """The static buffers of :class:`DecodeSpec` and the step over a bucket of them (module docstring).

    Per rollout: :meth:`start` fills the buffers from a prefill, :meth:`run` takes a step (a captured
    graph's replay once :meth:`capture` ran, else the eager step), :meth:`live_rows` counts the rows
    still decoding (the one read on the host), :meth:`compact` moves to a smaller bucket.
    """

    def __init__(self, spec: DecodeSpec) -> None:
        self.spec = spec
        n, length, device = spec.rows, spec.length, spec.device

        def empty(*shape: int, dtype: torch.dtype) -> Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        long = torch.long
        self.keys = [empty(n, heads, length, dk, dtype=kt) for heads, dk, _, kt, _ in spec.kv]
        self.values = [empty(n, heads, length, dv, dtype=vt) for heads, _, dv, _, vt in spec.kv]
        # per slot (moved by compaction)
        self.rows, self.token, self.position = empty(n, dtype=long), empty(n, 1, dtype=long), empty(n, 1, dtype=long)
        self.mask = empty(n, 1, 1, length, dtype=torch.bool if spec.boolean_mask else spec.mask_dtype)
        self.history = empty(n, length, dtype=long)  # the ids seen, for the repetition penalty
        self.logits = empty(n, spec.vocab, dtype=torch.float32)
        # per rollout row (never moved)
        self.uniforms = empty(n, spec.new_tokens, dtype=torch.float32)
        self.tokens_out, self.logprobs_out = empty(n, spec.new_tokens, dtype=long), self.uniforms.clone()
        self.lengths, self.finished = empty(n, dtype=long), empty(n, dtype=torch.bool)
        # the step counter and the cache index it writes at
        self.step_index, self.write_at = empty(dtype=long), empty(1, dtype=long)
        self.eos = torch.tensor(spec.eos_token_ids, dtype=long, device=device)
        self.attend: bool | float = True if spec.boolean_mask else 0.0
        self.hidden: bool | float = False if spec.boolean_mask else torch.finfo(spec.mask_dtype).min
        self.caches = {size: self._cache(size) for size in spec.buckets}
        self.graphs: dict[int, Any] = {}

    def _cache(self, size: int) -> Cache:
        layers: list[Any] = [
            RowBufferLayer(k[:size], v[:size], self.write_at) for k, v in zip(self.keys, self.values, strict=True)
        ]
        return Cache(layers=layers)

    def _slot_buffers(self) -> list[Tensor]:
        return [self.rows, self.token, self.position, self.mask, self.history, self.logits, *self.keys, *self.values]

    def start(self, cache: Any, logits: Tensor, ids: Tensor, mask: Tensor, k: int, uniforms: Tensor | None) -> None:
        """Fill every buffer for a new rollout from the prefill of P prompts ``ids``/``mask`` ``(P, Tp)``
        (left-padded): its ``cache`` (P rows of full-attention keys and values) and last logits ``(P, V)``,
        each prompt's state copied to its ``k`` consecutive rows; ``uniforms`` ``(N, Tc)``, or None (greedy)."""
        spec, tp = self.spec, ids.shape[1]
        for layer, keys, values in zip(cache.layers, self.keys, self.values, strict=True):
            keys.view(-1, k, *keys.shape[1:])[:, :, :, :tp].copy_(layer.keys.unsqueeze(1))
            values.view(-1, k, *values.shape[1:])[:, :, :, :tp].copy_(layer.values.unsqueeze(1))
        ids, mask = ids.repeat_interleave(k, dim=0), mask.repeat_interleave(k, dim=0).bool()
        self.rows.copy_(torch.arange(spec.rows, device=spec.device))
        self.position.copy_(mask.sum(dim=1, keepdim=True))
        self.mask.fill_(self.hidden)
        self.mask[:, 0, 0, :tp].masked_fill_(mask, self.attend)
        # the repetition penalty's history skips left padding, as the eager loop's: the row's last prompt
        # token stands in for the padding and for the positions not decoded yet (penalized once either way)
        self.history.copy_(ids[:, -1:].expand_as(self.history))
        self.history[:, :tp].copy_(torch.where(mask, ids, ids[:, -1:]))
        self.logits.copy_(logits.repeat_interleave(k, dim=0))
        if uniforms is None:
            self.uniforms.zero_()
        else:
            self.uniforms.copy_(uniforms)
        self.tokens_out.fill_(spec.pad_token_id)
        self.logprobs_out.zero_()
        self.lengths.fill_(spec.new_tokens)
        self.finished.zero_()
        self.step_index.zero_()
        self.write_at.fill_(tp)

    def step(self, model: nn.Module, size: int) -> None:
        """One decoding step of the first ``size`` slots: sample each slot's token from its logits and
        its uniform at the step counter, record it at its row, feed it, keep the next logits. A row
        already finished samples padding (as the eager loop's)."""
        spec, rows = self.spec, self.rows[:size]
        cells = rows * spec.new_tokens + self.step_index  # each slot's output cell at this step
        draws = self.uniforms.view(-1).index_select(0, cells)
        token, logprob = sample_next_token(self.logits[:size], self.history[:size], spec.params, None, draws)
        done = self.finished.index_select(0, rows)
        token = torch.where(done, spec.pad_token_id, token)
        # torch.isin sorts (and syncs) past a few ids per token: an explicit comparison never does
        ends = ~done & (token.unsqueeze(1) == self.eos).any(dim=1)
        self.tokens_out.view(-1).index_copy_(0, cells, token)
        self.logprobs_out.view(-1).index_copy_(0, cells, logprob)
        lengths = torch.where(ends, self.step_index + 1, self.lengths.index_select(0, rows))
        self.lengths.index_copy_(0, rows, lengths)
        self.finished.index_copy_(0, rows, done | ends)
        self.history[:size].index_copy_(1, self.write_at, token.unsqueeze(1))
        self.mask[:size, 0, 0].index_fill_(1, self.write_at, self.attend)
        self.token[:size].copy_(token.unsqueeze(1))
        out = model(
            input_ids=self.token[:size],
            attention_mask=self.mask[:size],
            position_ids=self.position[:size],
            use_cache=True,
            **{spec.keyword: self.caches[size]},
        )
        self.logits[:size].copy_(out.logits[:, -1])
        self.position[:size].add_(1)
        self.write_at.add_(1)
        self.step_index.add_(1)

    def run(self, model: nn.Module, size: int) -> None:
        """:meth:`step` on bucket ``size``: its captured graph's replay when there is one."""
        graph = self.graphs.get(size)
        if graph is None:
            self.step(model, size)
        else:
            graph.replay()

    def live_rows(self) -> int:
        """How many rows are still decoding: one copy to the host."""
        return int((~self.finished).sum())

    def compact(self, size: int, target: int) -> None:
        """Move from bucket ``size`` to the smaller ``target``, its first slots taking the rows still decoding
        (in order), the rest finished rows: every per-slot buffer's rows gathered into its first ``target``.
        No host sync: the live rows are sorted first, not selected by count."""
        done = self.finished.index_select(0, self.rows[:size]).to(torch.uint8)
        keep = torch.argsort(done, stable=True)[:target]
        for buffer in self._slot_buffers():
            buffer[:target].copy_(buffer[:size].index_select(0, keep))

    def capture(self, model: nn.Module) -> None:
        """Capture each bucket's step as a CUDA graph (after a warm-up on a side stream, which picks the
        kernels and allocates their workspaces outside the capture). It runs steps on placeholder
        values: :meth:`start` overwrites every buffer they touch."""
        self.mask.fill_(self.attend)  # the placeholders attend everywhere: no all-masked row, no NaN
        side = torch.cuda.Stream(self.spec.device)  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream(self.spec.device))
        with torch.cuda.stream(side):
            for size in self.spec.buckets:
                for _ in range(2):
                    self._rewind()
                    self.step(model, size)
        torch.cuda.current_stream(self.spec.device).wait_stream(side)
        pool = None
        for size in self.spec.buckets:
            self._rewind()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                self.step(model, size)
            pool = graph.pool()  # buckets run one after another: their graphs share one memory pool
            self.graphs[size] = graph

    def _rewind(self) -> None:
        # placeholder steps stay within the buffers: the counter and the write index back at the start
        self.step_index.zero_()
        self.write_at.zero_()
