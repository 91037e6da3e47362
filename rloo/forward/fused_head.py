"""The LM head fused with the log-softmax (and entropy): completion log-probs from the head's inputs over
``(tokens, vocabulary)`` tiles, never building a float32 ``(n, V)`` logits tensor.

``z = (h @ W^T + b) / T``, ``log p[y] = z[y] - logsumexp(z)``, ``H = logsumexp(z) - sum_v p_v z_v``, for
``hidden (n, D)``, ``weight (V, D)``, ``bias (V,)`` or None, ``ids (n,)``. Forward: for each tile, one GEMM
in the passes' precision (cuBLAS, bf16 under autocast) gives ``(tokens, vocab tile)`` logits, and a fold
(a Triton kernel on a GPU, :mod:`rloo.forward.fused_head_triton`; the same formula in torch ops,
:func:`fold_tile_torch`, elsewhere and as the tests' reference) adds the tile to per-token running
statistics in float32: the max, the sum of exponentials, their logit-weighted sum (entropy), the target
logit. Backward (:class:`_FusedHead`): each tile recomputed, overwritten by ``dL/dlogits``, and multiplied
into ``grad_h`` and ``grad_W`` accumulated in float32. The chunked head (:mod:`rloo.forward.lm_head`)
instead makes a float32 ``(n, V)`` copy of each chunk's logits, and again in its checkpoint's backward:
several GB of float32 traffic per training pass at a 151,936-token vocabulary.

Which head runs is :func:`head_kernel`'s choice (``RLOO_LM_HEAD_KERNEL``, else fused on a CPU and chunked on
CUDA); which is faster is measured by ``benchmarks/lm_head_kernels.py`` (on a GPU: not yet). On a CPU a tile
is the whole vocabulary by as many tokens as ``max_logits_memory_mb`` allows for its two buffers (the tile
and its exponentials), computed in place, allocated once per call: a fresh tensor of that size costs its
pages, faulted in and zeroed by the kernel, which on a CPU is more than the arithmetic over it. A training
pass's tiles are at most :data:`CPU_GRAD_TOKEN_TILE` tokens: its head runs on top of the whole forward's
saved activations (the step's peak), and from a few hundred tokens a tile its speed no longer depends on
the tile's size.

Why our own and not a library's. TRL 1.16's ``ChunkedLogProbFunction`` (``trl/kernels/chunked_logprob.py``)
is this design, and it was the model: but TRL is not a dependency of rloo (an extra for benchmarks and
the TRL-script tests), and its backward imports ``trl.trainer.utils`` (the trainer stack) for a
ZeRO-3 gather. Liger's fused linear cross-entropy returns a loss (per token with ``reduction="none"``:
``-log p[y]``), no entropy, and reads ``.item()`` on the host each call. Where we depart from TRL: the
entropy's sum is kept relative to the running max (``b = sum_v e^(z_v - m)(z_v - m)``, ``H = log s - b/s``),
so logits near 50 do not cancel (``logsumexp(z) - sum_v p_v z_v`` loses 1e-4 in float32 there, as
:func:`rloo.algo.stats.softmax_entropy` notes); only log-probs and entropy (no logit scale, no
soft-cap: a soft-capped head takes the chunked path); any head that is not a plain ``nn.Linear`` (a LoRA
or quantized head) takes the chunked path too.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

# the variable that picks the head kernel ("chunked" or "fused"); unset: :func:`head_kernel` chooses
KERNEL_VARIABLE = "RLOO_LM_HEAD_KERNEL"
KERNELS = ("chunked", "fused")
# a tile of logits: tokens x vocabulary columns (TRL's sizes; 256 MiB of bf16 logits, sized for a GPU)
TOKEN_TILE = 4096
VOCAB_TILE = 32768
# a CPU training pass's tile: at most this many tokens (by the whole vocabulary). At a 32k vocabulary over
# 4,096 tokens, a training pass's head took 3.44 s at 2,097-token tiles (256 MiB, the default budget) and
# 3.48 s at 524 (benchmarks/lm_head_kernels.py --token-tile); the forward's two tile buffers sit on the
# update's peak: there 2 x 64 MiB instead of 2 x 256 MiB
CPU_GRAD_TOKEN_TILE = 512
# a CPU forward's tile-sized float32 buffers, which share the logits budget: the tile and its exponentials
CPU_FORWARD_BUFFERS = 2
# ``torch.addmm(..., out_dtype=torch.float32)``: bf16 operands, a float32 product (CUDA, torch >= 2.8)
_ADDMM_OUT_DTYPE = hasattr(torch.ops.aten.addmm, "dtype_out")

Fold = Literal["triton", "torch"]


@dataclass(frozen=True)
class HeadScoring:
    """What a pass's chunk score computes, for the fused head to compute the same: log-probs under
    ``softmax(logits / temperature)``, entropies where ``with_entropy`` (with a gradient where
    ``entropy_requires_grad``). :class:`rloo.forward.logprobs.TokenScore` is one."""

    temperature: float
    with_entropy: bool
    entropy_requires_grad: bool


class FoldStats(NamedTuple):
    """The fold's per-token running statistics, float32 ``(n,)`` each, with ``z`` the scaled logits
    folded so far: ``maximum`` ``m = max_v z_v``; ``total`` ``s = sum_v e^(z_v - m)``; ``shifted``
    ``b = sum_v e^(z_v - m) (z_v - m)`` (None without entropy); ``target`` ``z[y]``."""

    maximum: Tensor
    total: Tensor
    shifted: Tensor | None
    target: Tensor

    @classmethod
    def empty(cls, n: int, device: torch.device, with_entropy: bool) -> FoldStats:
        def zeros() -> Tensor:
            return torch.zeros(n, dtype=torch.float32, device=device)

        minus_inf = torch.full((n,), float("-inf"), dtype=torch.float32, device=device)
        return cls(minus_inf, zeros(), zeros() if with_entropy else None, zeros())

    def rows(self, rows: slice) -> FoldStats:
        """The statistics of a token tile: views, so a fold writes through."""
        shifted = None if self.shifted is None else self.shifted[rows]
        return FoldStats(self.maximum[rows], self.total[rows], shifted, self.target[rows])

    def finish(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """``logsumexp(z) = m + log s``, ``log p[y] = z[y] - logsumexp(z)`` and ``H = log s - b / s``
        (``sum_v p_v z_v = m + b / s``)."""
        log_total = torch.log(self.total)
        lse = self.maximum + log_total
        entropy = None if self.shifted is None else log_total - self.shifted / self.total
        return lse, self.target - lse, entropy


class TileGradInputs(NamedTuple):
    """What one token tile's logits gradient needs, float32 ``(n,)`` each: ``lse`` and ``entropy`` from
    the forward, and the incoming gradients of the log-probs and entropies (None: no such term)."""

    lse: Tensor
    entropy: Tensor | None
    grad_logprobs: Tensor | None
    grad_entropy: Tensor | None


def fold_tile_torch(
    tile: Tensor, ids: Tensor, stats: FoldStats, vocab_start: int, temperature: float, scratch: Tensor | None = None
) -> None:
    """Fold a logits tile ``(n, v)`` (vocabulary columns from ``vocab_start``) into ``stats`` in place, with
    ``z = tile / T`` in float32 and ``r = e^(m - m')``::

        m' = max(m, max_v z_v)        s' = r s + sum_v e^(z_v - m')
        b' = r (b + (m - m') s) + sum_v e^(z_v - m') (z_v - m')        (entropy; 0 before the first tile)
        target = z[y] where ``ids`` ``y`` falls in the tile

    A float32 ``tile`` is overwritten (with ``z - m'``), and ``scratch`` (float32, at least ``n x v``
    elements; None: a new tensor) receives the exponentials: the fold allocates nothing of the tile's
    size, which on a CPU costs more than its arithmetic (fresh pages, faulted in and zeroed by the
    kernel). The reference of the Triton fold (``fused_head_triton._fold_kernel``: the same formula a
    block at a time).
    """
    z = tile if tile.dtype == torch.float32 else tile.float()
    if temperature != 1.0:
        z.div_(temperature)
    local = ids - vocab_start
    inside = (local >= 0) & (local < z.shape[1])
    picked = z.gather(1, local.clamp(0, z.shape[1] - 1).unsqueeze(1)).squeeze(1)
    stats.target.copy_(torch.where(inside, picked, stats.target))
    new_max = torch.maximum(stats.maximum, z.amax(dim=-1))
    rescale = torch.exp(stats.maximum - new_max)
    from_max = z.sub_(new_max.unsqueeze(-1))
    exp = torch.exp(from_max, out=_flat_view(scratch, from_max.shape))
    tile_total = exp.sum(dim=-1)
    if stats.shifted is not None:
        shift = torch.where(stats.total > 0, stats.maximum - new_max, 0.0)  # no -inf * 0 before the first tile
        stats.shifted.copy_(rescale * (stats.shifted + shift * stats.total) + exp.mul_(from_max).sum(dim=-1))
    stats.total.copy_(rescale * stats.total + tile_total)
    stats.maximum.copy_(new_max)


def tile_grad_torch(tile: Tensor, ids: Tensor, saved: TileGradInputs, vocab_start: int, temperature: float) -> None:
    """Overwrite a logits tile ``(n, v)`` with ``dL/dlogits``; with ``z = tile / T``, ``log p = z - lse``::

        dL/dz_v = g_logp (1[v = y] - p_v) - g_H p_v (log p_v + H),    dL/dlogits = dL/dz / T

    from ``d log p_y / dz_v = 1[v = y] - p_v`` and ``dH/dz_v = -p_v (z_v - sum_u p_u z_u) = -p_v (log p_v + H)``,
    computed in place (``-p (g_logp + g_H (log p + H))``, then ``g_logp`` at the targets): a float32 tile is the
    only ``(n, v)`` tensor but with an entropy gradient (one more, for ``p``). The reference of the Triton
    kernel (``fused_head_triton._grad_kernel``)."""
    z = tile if tile.dtype == torch.float32 else tile.float()
    if temperature != 1.0:
        z.div_(temperature)
    logp = z.sub_(saved.lse.unsqueeze(1))
    g = saved.grad_logprobs
    if saved.grad_entropy is not None and saved.entropy is not None:
        p = torch.exp(logp)
        factor = logp.add_(saved.entropy.unsqueeze(1)).mul_(saved.grad_entropy.unsqueeze(1))
        if g is not None:
            factor.add_(g.unsqueeze(1))
        dz = factor.mul_(p).neg_()
    elif g is not None:
        dz = logp.exp_().mul_(g.neg().unsqueeze(1))
    else:
        dz = logp.zero_()
    if g is not None:
        local = ids - vocab_start
        inside = (local >= 0) & (local < z.shape[1])
        dz.scatter_add_(1, local.clamp(0, z.shape[1] - 1).unsqueeze(1), torch.where(inside, g, 0.0).unsqueeze(1))
    if temperature != 1.0:
        dz.div_(temperature)
    if dz is not tile:
        tile.copy_(dz)


def _flat_view(buffer: Tensor | None, shape: torch.Size) -> Tensor | None:
    """A contiguous ``shape`` view of ``buffer``'s first elements (a tile narrower than the buffer), or None."""
    return None if buffer is None else buffer.view(-1)[: shape.numel()].view(shape)


def triton_kernels() -> ModuleType | None:
    """:mod:`rloo.forward.fused_head_triton`, or None where Triton does not import (it comes with CUDA
    builds of torch)."""
    try:
        return importlib.import_module("rloo.forward.fused_head_triton")
    except ImportError:
        return None


FoldFn = Callable[[Tensor, Tensor, FoldStats, int, float], None]
GradFn = Callable[[Tensor, Tensor, TileGradInputs, int, float], None]


def _folds(fold: Fold) -> tuple[FoldFn, GradFn]:
    """The fold and the tile gradient: Triton's kernels or their torch references."""
    if fold == "torch":
        return fold_tile_torch, tile_grad_torch
    kernels = triton_kernels()
    if kernels is None:
        raise RuntimeError("the fused LM head's Triton fold needs the triton package (it comes with CUDA torch)")
    return kernels.fold_tile, kernels.tile_grad


@dataclass(frozen=True)
class _Tiling:
    """The non-tensor settings of one fused head call."""

    temperature: float
    with_entropy: bool
    fold: Fold
    dtype: torch.dtype  # the GEMMs' dtype: the autocast dtype, else the weight's
    token_tile: int
    vocab_tile: int


def _token_tiles(hidden: Tensor, tiling: _Tiling) -> Iterator[tuple[slice, Tensor]]:
    """Each token tile's rows and its hidden states in the GEMMs' dtype."""
    for start in range(0, hidden.shape[0], tiling.token_tile):
        rows = slice(start, start + tiling.token_tile)
        yield rows, hidden[rows].to(tiling.dtype)


def _vocab_tiles(weight: Tensor, bias: Tensor | None, tiling: _Tiling) -> Iterator[tuple[int, Tensor, Tensor | None]]:
    """Each vocabulary tile's first column, its weight rows and bias in the GEMMs' dtype."""
    for start in range(0, weight.shape[0], tiling.vocab_tile):
        cols = slice(start, start + tiling.vocab_tile)
        yield start, weight[cols].to(tiling.dtype), None if bias is None else bias[cols].to(tiling.dtype)


def logits_tile(hidden: Tensor, weight: Tensor, bias: Tensor | None, buffer: Tensor | None = None) -> Tensor:
    """``hidden @ weight^T (+ bias)``: ``(n, D), (v, D), (v,) -> (n, v)``, one GEMM in their dtype, written
    into ``buffer``'s first ``n x v`` elements (None: a new tensor)."""
    out = _flat_view(buffer, torch.Size((hidden.shape[0], weight.shape[0])))
    if bias is None:
        return torch.mm(hidden, weight.t(), out=out)
    return torch.addmm(bias, hidden, weight.t(), out=out)


def _tile_buffers(hidden: Tensor, weight: Tensor, tiling: _Tiling, count: int) -> list[Tensor]:
    """``count`` tensors of one tile's size (the largest tile's, in the GEMMs' dtype; float32 after the
    first, for the torch fold's exponentials), allocated once per call and reused by every tile."""
    shape = (min(tiling.token_tile, hidden.shape[0]), min(tiling.vocab_tile, weight.shape[0]))
    dtypes = [tiling.dtype] + [torch.float32] * (count - 1)
    return [torch.empty(shape, dtype=dtype, device=hidden.device) for dtype in dtypes]


def accumulate(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """``acc += a @ b`` into a float32 ``acc``, the product never rounded to bf16 ``a``'s dtype first (TRL
    found that rounding each tile's product biases training): cuBLAS's float32 output on CUDA, else the
    operands upcast (one tile each)."""
    if acc.device.type == "cuda" and a.dtype != torch.float32 and _ADDMM_OUT_DTYPE:
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.addmm_(a.float(), b.float())


class _FusedHead(torch.autograd.Function):
    """``(hidden, weight, bias, ids) -> (log p[y], H or None)`` tile by tile; the backward recomputes each
    tile (nothing of ``(n, V)`` size is kept between them)."""

    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, ids: Tensor, tiling: _Tiling
    ) -> tuple[Tensor, Tensor | None]:
        ctx.set_materialize_grads(False)  # an entropy read as a metric sends no gradient: its term is skipped
        fold, _ = _folds(tiling.fold)
        stats = FoldStats.empty(hidden.shape[0], hidden.device, tiling.with_entropy)
        buffer, *scratch = _tile_buffers(hidden, weight, tiling, 2 if tiling.fold == "torch" else 1)
        if scratch:
            fold = functools.partial(fold_tile_torch, scratch=scratch[0])
        with torch.autocast(hidden.device.type, enabled=False):
            for rows, h in _token_tiles(hidden, tiling):
                for start, w, b in _vocab_tiles(weight, bias, tiling):
                    fold(logits_tile(h, w, b, buffer), ids[rows], stats.rows(rows), start, tiling.temperature)
        lse, logprobs, entropy = stats.finish()
        ctx.save_for_backward(hidden, weight, bias, ids, lse, entropy)
        ctx.tiling = tiling
        return logprobs, entropy

    @staticmethod
    def backward(ctx: Any, grad_logprobs: Tensor | None, grad_entropy: Tensor | None) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, ids, lse, entropy = ctx.saved_tensors
        tiling: _Tiling = ctx.tiling
        _, tile_grad = _folds(tiling.fold)

        def zeros_if(needed: bool, like: Tensor | None) -> Tensor | None:
            return torch.zeros_like(like, dtype=torch.float32) if needed and like is not None else None

        grad_h, grad_w, grad_b = map(zeros_if, ctx.needs_input_grad[:3], (hidden, weight, bias))
        incoming = [None if g is None else g.float().contiguous() for g in (grad_logprobs, grad_entropy)]
        (buffer,) = _tile_buffers(hidden, weight, tiling, 1)
        with torch.autocast(hidden.device.type, enabled=False):
            for rows, h in _token_tiles(hidden, tiling):
                saved = TileGradInputs(
                    lse[rows],
                    None if entropy is None else entropy[rows],
                    *(g if g is None else g[rows] for g in incoming),
                )
                for start, w, b in _vocab_tiles(weight, bias, tiling):
                    tile = logits_tile(h, w, b, buffer)
                    tile_grad(tile, ids[rows], saved, start, tiling.temperature)
                    cols = slice(start, start + tile.shape[1])
                    if grad_h is not None:
                        accumulate(grad_h[rows], tile, w)
                    if grad_w is not None:
                        accumulate(grad_w[cols], tile.t(), h)
                    if grad_b is not None:
                        grad_b[cols] += tile.sum(dim=0, dtype=torch.float32)
        cast = [None if g is None else g.to(x.dtype) for g, x in ((grad_h, hidden), (grad_w, weight), (grad_b, bias))]
        return (*cast, None, None)


def compute_dtype(weight: Tensor) -> torch.dtype:
    """The dtype the head's product is computed in: the autocast dtype where autocast is on for the weight's
    device (bf16 on a GPU, rloo's default), else the weight's own (as ``head(h)`` computes it)."""
    device = weight.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype


def fused_logprobs(
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    ids: Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_requires_grad: bool = False,
    fold: Fold | None = None,
    token_tile: int = TOKEN_TILE,
    vocab_tile: int = VOCAB_TILE,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs ``(n,)`` of ``ids`` ``(n,)`` and (``with_entropy``) entropies ``(n,)``, float32, under
    ``softmax(z)``, ``z = (hidden @ weight^T + bias) / temperature``, tile by tile (module docstring).

    Gradients reach ``hidden``, ``weight`` and ``bias`` through the log-probs, and through the entropies
    where ``entropy_requires_grad`` (an entropy bonus; else they are a metric, detached). ``fold``:
    ``"triton"`` (the default on CUDA where Triton imports) or ``"torch"`` (the reference; elsewhere).
    """
    if fold is None:
        fold = "triton" if hidden.device.type == "cuda" and triton_kernels() is not None else "torch"
    tiling = _Tiling(float(temperature), with_entropy, fold, compute_dtype(weight), token_tile, vocab_tile)
    logprobs, entropy = _FusedHead.apply(hidden, weight, bias, ids.contiguous(), tiling)  # type: ignore[no-untyped-call]
    if entropy is not None and not entropy_requires_grad:
        entropy = entropy.detach()
    return logprobs, entropy


def head_kernel(head: nn.Module, device: torch.device, softcap: float | None) -> str:
    """Which kernel turns ``head``'s inputs on ``device`` into log-probs: ``"chunked"`` or ``"fused"``.

    ``RLOO_LM_HEAD_KERNEL`` where set; else ``"fused"`` on a CPU (its torch fold in place over one tile
    buffer: at a 32k vocabulary over 4,096 tokens, a log-prob pass's head 2.8x and a training pass's 1.9x
    faster than the chunked head's, ``benchmarks/lm_head_kernels.py``) and ``"chunked"`` elsewhere: the
    fused head becomes the default on CUDA (where Triton imports) once a GPU run has compiled it and
    measured it faster than the chunked head (not yet). A soft-capped head, or one that is not a plain
    ``nn.Linear`` on ``device`` (LoRA on the head, a quantized or offloaded head), always takes
    ``"chunked"``."""
    asked = os.environ.get(KERNEL_VARIABLE, "").strip().lower()
    if asked and asked not in KERNELS:
        raise ValueError(
            f"{KERNEL_VARIABLE}={asked!r}: expected one of {list(KERNELS)}, or unset it (the device's default)"
        )
    weight = getattr(head, "weight", None)
    if softcap is not None or type(head) is not nn.Linear or weight is None or weight.device != device:
        return "chunked"
    if asked == "fused" and device.type == "cuda" and triton_kernels() is None:
        raise ValueError(f"{KERNEL_VARIABLE}=fused needs Triton on this CUDA machine: pip install triton")
    return default_kernel(device.type)


def default_kernel(device_type: str) -> str:
    """The kernel a plain ``nn.Linear`` head on a ``device_type`` device takes (:func:`head_kernel`), which
    the memory plan budgets for: ``RLOO_LM_HEAD_KERNEL`` where set, else fused on a CPU, chunked elsewhere."""
    asked = os.environ.get(KERNEL_VARIABLE, "").strip().lower()
    return asked if asked in KERNELS else ("fused" if device_type == "cpu" else "chunked")


def cpu_tiles(vocab_size: int, tile_elements: int, grad: bool = False) -> tuple[int, int]:
    """``(token_tile, vocab_tile)`` on a CPU: the whole vocabulary in one tile (no running rescale), and as
    many tokens as ``tile_elements`` logits allow for the forward's :data:`CPU_FORWARD_BUFFERS` (at least 16:
    the head's GEMM stays efficient); with a gradient (``grad``), at most :data:`CPU_GRAD_TOKEN_TILE`."""
    tokens = max(16, tile_elements // (CPU_FORWARD_BUFFERS * vocab_size))
    return (min(tokens, CPU_GRAD_TOKEN_TILE) if grad else tokens), vocab_size


def fused_head_logprobs(
    head: nn.Module, hidden: Tensor, ids: Tensor, score: object, softcap: float | None, tile_elements: int
) -> tuple[Tensor, Tensor | None] | None:
    """The chunked head's seam: log-probs and entropies ``(n,)`` of ``ids`` ``(n,)`` from the head's inputs
    ``hidden`` ``(n, D)`` by :func:`fused_logprobs`, or None where the chunked head runs (:func:`head_kernel`
    says so, or ``score`` is not a :class:`HeadScoring` whose formula the fused head knows). On a CPU a tile
    holds ``tile_elements`` logits (the chunked head's chunk; with a gradient, at most
    :data:`CPU_GRAD_TOKEN_TILE` tokens of them: :func:`cpu_tiles`); on a GPU, :data:`TOKEN_TILE` x
    :data:`VOCAB_TILE`."""
    if not isinstance(score, HeadScoring) or head_kernel(head, hidden.device, softcap) == "chunked":
        return None
    weight: Tensor = getattr(head, "weight")  # noqa: B009 (typed as a Tensor here)
    bias: Tensor | None = getattr(head, "bias")  # noqa: B009
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    tiles = cpu_tiles(weight.shape[0], tile_elements, grad) if hidden.device.type == "cpu" else (TOKEN_TILE, VOCAB_TILE)
    return fused_logprobs(
        hidden,
        weight,
        bias,
        ids,
        score.temperature,
        score.with_entropy,
        score.entropy_requires_grad and torch.is_grad_enabled(),
        None,
        *tiles,
    )
