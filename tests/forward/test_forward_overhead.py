"""A forward's fixed cost in token-rows: by hand from timings, measured once per model on a GPU (a fake
clock here), the CPU constant elsewhere, and what it does to the length buckets."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import rloo.forward.forward_overhead as overhead_module
from rloo.forward.forward_overhead import (
    CPU_OVERHEAD,
    MAX_OVERHEAD,
    forward_overhead,
    measure_overhead,
    overhead_from_timings,
)
from rloo.forward.shared_prompt import length_buckets
from tests.helpers.models import make_model, make_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_overhead_by_hand() -> None:
    # 20 ms for 16 tokens, 30 ms for 8,192: 10 ms / 8,176 tokens = 1.223 us a token; 20 ms = 16,352 tokens -> 2^14
    assert overhead_from_timings(0.020, 16, 0.030, 8192) == 2.0**14
    # a CPU: 1 ms for 16 tokens, 200 ms for 8,192 -> 41 token-rows -> 2^5
    assert overhead_from_timings(0.001, 16, 0.200, 8192) == 32.0
    assert overhead_from_timings(0.020, 16, 0.020, 8192) == MAX_OVERHEAD  # the large forward no slower: the bound
    assert overhead_from_timings(1e-9, 16, 1.0, 8192) == CPU_OVERHEAD  # never below the CPU's


class FakeClock:
    def __init__(self, readings: list[float]) -> None:
        self.readings = readings

    def __call__(self) -> float:
        return self.readings.pop(0)


def test_a_measurement_times_a_small_and_a_large_forward_without_full_logits() -> None:
    tokenizer = make_tokenizer()
    model = make_model(tokenizer).eval()
    shapes: list[tuple[int, ...]] = []
    head = model.get_output_embeddings()
    handle = head.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape)))
    try:
        overhead = measure_overhead(model, FakeClock([0.0, 0.020, 1.0, 1.030]))
    finally:
        handle.remove()
    assert overhead == 2.0**14
    # each forward warmed up then timed; the head sees one position per row
    assert shapes == [(1, 1, len(tokenizer))] * 2 + [(16, 1, len(tokenizer))] * 2


def test_the_cpu_constant_without_a_forward_and_one_measurement_per_model_on_a_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tokenizer = make_tokenizer()
    model = make_model(tokenizer)
    calls: list[Any] = []
    monkeypatch.setattr(overhead_module, "measure_overhead", lambda m: calls.append(m) or 4096.0)
    assert forward_overhead(model) == CPU_OVERHEAD and not calls
    monkeypatch.setattr(overhead_module, "model_device", lambda m: torch.device("cuda"))
    assert forward_overhead(model) == forward_overhead(model) == 4096.0
    assert calls == [model]


def test_a_gpu_overhead_keeps_a_varied_pass_in_one_forward() -> None:
    lengths = [12, 40, 75, 90, 130, 160, 200, 255] * 2  # a varied-length pass of 16 rows
    assert len(length_buckets(lengths, CPU_OVERHEAD)) > 2  # the CPU constant: a forward per few lengths
    assert len(length_buckets(lengths, 2.0**14)) == 1
