"""The Triton kernels of the fused LM head (:mod:`rloo.forward.fused_head`): the fold of one logits
tile into per-token statistics, and one tile's logits gradient, each the same formula as the torch
reference there (``fold_tile_torch``, ``tile_grad_torch``).

Imported only where it is used (``import triton`` takes a second and needs the package, which CUDA
builds of torch bring): :func:`rloo.forward.fused_head.triton_kernels` imports it on demand.
``triton.jit`` decides at import whether the kernels are compiled for a GPU or run by Triton's
interpreter (``TRITON_INTERPRET=1``, which runs them on CPU tensors: the tests do).
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl
from torch import Tensor

from rloo.forward.fused_head import FoldStats, TileGradInputs

# vocabulary columns one program reads at a time (TRL's figure for its fold)
BLOCK_V = 1024
# the kernels' pointer arguments are typed Any: Triton reads annotations (``int`` as i32, ``float`` as fp32)


@triton.jit
def _fold_kernel(
    tile_ptr: Any,
    tile_stride: int,
    ids_ptr: Any,
    max_ptr: Any,
    total_ptr: Any,
    shifted_ptr: Any,
    target_ptr: Any,
    vocab_start: int,
    n_cols: int,
    temperature: float,
    WITH_ENTROPY: tl.constexpr,
    BLOCK: tl.constexpr,
) -> None:
    # one program per token: its row of the tile, BLOCK columns at a time, into its running statistics
    row = tl.program_id(0).to(tl.int64)
    row_ptr = tile_ptr + row * tile_stride
    m = tl.load(max_ptr + row)
    s = tl.load(total_ptr + row)
    b = tl.load(shifted_ptr + row)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n_cols
        z = tl.load(row_ptr + cols, mask=inside, other=float("-inf")).to(tl.float32) / temperature
        new_m = tl.maximum(m, tl.max(z, axis=0))
        rescale = tl.exp(m - new_m)
        e = tl.exp(z - new_m)  # 0 outside the tile
        if WITH_ENTROPY:
            shift = tl.where(s > 0, m - new_m, 0.0)  # the first block: no earlier terms to shift (and no -inf * 0)
            b = rescale * (b + shift * s) + tl.sum(e * tl.where(inside, z - new_m, 0.0), axis=0)
        s = s * rescale + tl.sum(e, axis=0)
        m = new_m
    tl.store(max_ptr + row, m)
    tl.store(total_ptr + row, s)
    if WITH_ENTROPY:
        tl.store(shifted_ptr + row, b)
    local = tl.load(ids_ptr + row) - vocab_start
    if (local >= 0) & (local < n_cols):
        tl.store(target_ptr + row, tl.load(row_ptr + local).to(tl.float32) / temperature)


@triton.jit
def _grad_kernel(
    tile_ptr: Any,
    tile_stride: int,
    ids_ptr: Any,
    lse_ptr: Any,
    entropy_ptr: Any,
    grad_logprobs_ptr: Any,
    grad_entropy_ptr: Any,
    vocab_start: int,
    n_cols: int,
    temperature: float,
    LOGPROB_GRAD: tl.constexpr,
    ENTROPY_GRAD: tl.constexpr,
    BLOCK: tl.constexpr,
) -> None:
    # one program per (token, BLOCK columns): the tile's logits overwritten by the loss's gradient
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    ptrs = tile_ptr + row * tile_stride + cols
    z = tl.load(ptrs, mask=inside, other=0.0).to(tl.float32) / temperature
    logp = z - tl.load(lse_ptr + row)
    p = tl.exp(logp)
    dz = tl.zeros((BLOCK,), dtype=tl.float32)
    if LOGPROB_GRAD:
        is_target = (cols + vocab_start) == tl.load(ids_ptr + row)
        dz += tl.load(grad_logprobs_ptr + row) * (is_target.to(tl.float32) - p)
    if ENTROPY_GRAD:
        dz -= tl.load(grad_entropy_ptr + row) * p * (logp + tl.load(entropy_ptr + row))
    tl.store(ptrs, (dz / temperature).to(tile_ptr.dtype.element_ty), mask=inside)


def fold_tile(tile: Tensor, ids: Tensor, stats: FoldStats, vocab_start: int, temperature: float) -> None:
    """:func:`rloo.forward.fused_head.fold_tile_torch` by :func:`_fold_kernel`: ``stats`` updated in place."""
    _fold_kernel[(tile.shape[0],)](
        tile,
        tile.stride(0),
        ids,
        stats.maximum,
        stats.total,
        stats.total if stats.shifted is None else stats.shifted,  # a placeholder the kernel never touches
        stats.target,
        vocab_start,
        tile.shape[1],
        temperature,
        WITH_ENTROPY=stats.shifted is not None,
        BLOCK=BLOCK_V,
    )


def tile_grad(tile: Tensor, ids: Tensor, saved: TileGradInputs, vocab_start: int, temperature: float) -> None:
    """:func:`rloo.forward.fused_head.tile_grad_torch` by :func:`_grad_kernel`: ``tile`` overwritten by
    ``dL/dlogits``."""
    n, cols = tile.shape
    lse = saved.lse
    _grad_kernel[(n, triton.cdiv(cols, BLOCK_V))](
        tile,
        tile.stride(0),
        ids,
        lse,
        lse if saved.entropy is None else saved.entropy,  # placeholders the kernel never reads
        lse if saved.grad_logprobs is None else saved.grad_logprobs,
        lse if saved.grad_entropy is None else saved.grad_entropy,
        vocab_start,
        cols,
        temperature,
        LOGPROB_GRAD=saved.grad_logprobs is not None,
        ENTROPY_GRAD=saved.grad_entropy is not None,
        BLOCK=BLOCK_V,
    )
