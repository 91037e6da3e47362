"""The fixed cost of one forward, in token-rows, measured once on the device the model runs on.

The pass layouts (:mod:`rloo.forward.packing`: plain, shared prompts, packed rows; the length buckets
of :mod:`rloo.forward.shared_prompt`) trade padding against extra forwards. What a forward costs
beyond its tokens depends on the device: on a CPU it is little (a few dozen token-rows of a small model:
:data:`CPU_OVERHEAD`), on a GPU a forward of a 0.5B model launches ~500-1,300 kernels whatever its size,
~15-25 ms of host time, while a token-row costs ~1-2 µs of compute: ~10^4 token-rows. With the CPU's
constant a GPU pass split into dozens of launch-bound forwards (the shared-prompt layout, 1.18x the
minimum FLOPs, ran 4.5x slower than one plain padded forward on an H200).

On CUDA the cost is measured once per model: a warmed-up forward of :data:`SMALL` tokens and one of
:data:`LARGE` tokens, no gradient, the LM head given one position per row (no full logits), synchronized.
``overhead = t_small / ((t_large - t_small) / (LARGE - SMALL))`` token-rows, clamped to
``[CPU_OVERHEAD, MAX_OVERHEAD]`` and rounded to a power of two, so that two runs on one machine choose
the same layouts (a layout changes a pass's floating-point rounding, not its values). Anywhere else the
CPU constant holds, so CPU runs and tests are deterministic.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable

import torch
from torch import nn

from rloo.forward.lm_head import HeadInputs, chunkable_head
from rloo.generation.device import model_device

# a forward's fixed cost on a CPU, in token-rows of the model's own work (an estimate; the partition
# depends little on it where buckets pay: the padding they save is thousands of token-rows)
CPU_OVERHEAD = 32.0
MAX_OVERHEAD = 2.0**16  # a bound for a measurement the large forward could not resolve (launch-bound too)
SMALL = (1, 16)  # rows, tokens
LARGE = (16, 512)
_MEASURED: weakref.WeakKeyDictionary[nn.Module, float] = weakref.WeakKeyDictionary()

Clock = Callable[[], float]


def overhead_from_timings(small_seconds: float, small_tokens: int, large_seconds: float, large_tokens: int) -> float:
    """Token-rows one forward's fixed cost is worth: ``t_small / per_token`` with
    ``per_token = (t_large - t_small) / (large_tokens - small_tokens)``; clamped to
    ``[CPU_OVERHEAD, MAX_OVERHEAD]`` (MAX where the large forward took no longer), rounded to a power of 2."""
    per_token = (large_seconds - small_seconds) / max(1, large_tokens - small_tokens)
    raw = MAX_OVERHEAD if per_token <= 0 else small_seconds / per_token
    clamped = min(MAX_OVERHEAD, max(CPU_OVERHEAD, raw))
    return float(2.0 ** round(math.log2(clamped)))


def forward_overhead(model: nn.Module) -> float:
    """One forward's fixed cost in token-rows for ``model`` where it runs: measured once on CUDA
    (:func:`measure_overhead`), :data:`CPU_OVERHEAD` elsewhere or where the measurement cannot run."""
    if model_device(model).type != "cuda":
        return CPU_OVERHEAD
    if model not in _MEASURED:
        measured = measure_overhead(model)
        _MEASURED[model] = CPU_OVERHEAD if measured is None else measured
    return _MEASURED[model]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_overhead(model: nn.Module, clock: Clock = time.perf_counter) -> float | None:
    """:func:`overhead_from_timings` of ``model``'s forwards of :data:`SMALL` and :data:`LARGE` tokens
    (each run once to warm up, then timed), in the precision active at the call (the passes' autocast);
    None where a forward needs more than token ids or the model has no head the chunked path applies."""
    head = chunkable_head(model)
    if head is None:
        return None
    device = model_device(model)

    def timed(rows: int, tokens: int) -> float:
        ids = torch.zeros((rows, tokens), dtype=torch.long, device=device)
        with torch.no_grad(), HeadInputs(head):  # the head sees one position a row: no (rows, T, V) logits
            model(input_ids=ids, use_cache=False)  # warm-up: kernels chosen, graphs built
            _synchronize(device)
            start = clock()
            model(input_ids=ids, use_cache=False)
            _synchronize(device)
            return clock() - start

    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # dropout (if any) draws nothing from the run's streams
        try:
            small, large = timed(*SMALL), timed(*LARGE)
        except (ValueError, TypeError, RuntimeError):
            return None
    return overhead_from_timings(small, SMALL[0] * SMALL[1], large, LARGE[0] * LARGE[1])
