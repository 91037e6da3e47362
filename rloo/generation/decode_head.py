"""The LM head of a CPU decode step, computed as ``(W @ h^T)^T``: the same product, a faster kernel.

A decode step feeds the head one position a row, ``logits = h @ W^T`` with ``h`` ``(B, H)``, B from a
few rows to a few dozen (rows leave the batch as they finish: :mod:`rloo.generation.decoding`), and
``W`` ``(V, H)`` with a vocabulary of 30k-250k. For that shape (few rows, many columns, the weight
transposed) MKL's fp32 GEMM picks a kernel far below the memory bandwidth; given the weight as the
left operand, ``W @ h^T`` (a tall matrix times a few columns), it streams the weight once. Measured on
this project's 2-core CPU (AMD EPYC, MKL 2024.2, torch 2.13), nothing else running, median of 41 calls:

    rows                        2     4     8    16    32    64   128
    32,000 x 512  h @ W^T (ms)  16    12    11    14    19    25    41
                  W @ h^T (ms)  1.9   3.7   4.5   11    15    23    37
     8,192 x 512  h @ W^T (ms)  1.1   1.9   2.3   3.0   4.3   6.3   10
                  W @ h^T (ms)  0.4   0.6   1.1   1.5   2.8   5.0   9.0

The product runs in blocks of :data:`VOCAB_BLOCK` vocabulary rows, each block's ``(block, B)`` result
transposed into the logits while it is still in cache (the whole ``(V, B)`` result transposed at once misses
it from 16 rows on). ``benchmarks/decode_head.py``, the same machine, 2026-11-29 (median of 21 calls, ms):

    rows                               2     4     8    16    32    64   128
    32,000 x 512  nn.Linear          7.8   6.2   6.5   6.9   9.3  14.3  25.4
                  W @ h^T, whole     1.5   1.7   3.7   6.8  10.3  16.8  25.4
                  W @ h^T, blocks    1.5   1.6   3.3   6.1   9.0  14.6  25.4

A varied-length rollout spends most of its decode steps at 1-13 rows (the long tail of a few
completions), where the head is most of a step. From a few hundred rows (prefill, the log-prob and
training passes) the two kernels are even, so only a decode-sized call takes this path
(:data:`MAX_ROWS`), and only for a head of at least :data:`MIN_VOCAB` columns: a small head costs
microseconds either way, and there the extra transposes would be a step's only extra ops. The two
orders sum each logit's H products in different orders, so logits may differ in the last bit (4e-5
at logits of ~10 here), as a batched forward's already do from a decode step's; the sampler's
log-probs are those of the logits it samples from either way.

Only a plain ``nn.Linear`` head on a CPU in float32 outside autocast is changed, for the duration
of a rollout (:func:`weight_left_head`); a GPU's GEMMs have no such gap.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator

import torch
from torch import Tensor, nn

# above this many rows a call takes nn.Linear's own kernel (the two are even from a few hundred)
MAX_ROWS = 64
# a head with fewer output columns (vocabulary) keeps nn.Linear's kernel (measured: 8k columns gain 0.3-0.8x)
MIN_VOCAB = 8_192
# the vocabulary rows of one product: its (block, B) result is transposed into the logits while in cache
VOCAB_BLOCK = 4_096


def weight_left_linear(head: nn.Linear, hidden: Tensor) -> Tensor:
    """``head(hidden)`` for ``hidden`` ``(..., H)``: ``(W @ h^T)^T + b`` where at most :data:`MAX_ROWS`
    rows, :data:`VOCAB_BLOCK` rows of ``W`` at a time, a contiguous ``(..., V)`` tensor either way."""
    rows = hidden.reshape(-1, hidden.shape[-1])
    if rows.shape[0] > MAX_ROWS:
        return nn.functional.linear(hidden, head.weight, head.bias)
    weight, columns = head.weight, rows.t()
    logits = rows.new_empty((rows.shape[0], weight.shape[0]))
    for start in range(0, weight.shape[0], VOCAB_BLOCK):  # each block's (block, B) product transposed in cache
        end = start + VOCAB_BLOCK
        logits[:, start:end].copy_(torch.mm(weight[start:end], columns).t())
    if head.bias is not None:
        logits += head.bias
    return logits.reshape(*hidden.shape[:-1], logits.shape[-1])


def takes_weight_left(head: object) -> bool:
    """Whether ``head`` is a plain float32 ``nn.Linear`` of at least :data:`MIN_VOCAB` outputs on a CPU whose
    forward nothing has replaced (accelerate's offload hooks, a PEFT layer, a quantized linear are left alone)."""
    return (
        type(head) is nn.Linear
        and head.out_features >= MIN_VOCAB
        and "forward" not in vars(head)
        and head.weight.device.type == "cpu"
        and head.weight.dtype == torch.float32
    )


@contextlib.contextmanager
def weight_left_head(model: nn.Module) -> Iterator[None]:
    """Within the block, ``model``'s output embedding computes decode-sized calls with
    :func:`weight_left_linear` (outside CPU autocast, which would change its precision); nothing changes for
    a head :func:`takes_weight_left` refuses."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not takes_weight_left(head) or torch.is_autocast_enabled("cpu"):
        yield
        return
    assert isinstance(head, nn.Linear)
    head.forward = types.MethodType(weight_left_linear, head)  # type: ignore[method-assign]
    try:
        yield
    finally:
        del head.forward
