"""Phase-by-phase measurements of a training run for ``benchmarks/gpu_vs_trl.py``, the same for rloo and TRL.

A :class:`Recorder` is told where phases begin and end (each implementation's runner wraps its own methods) and
keeps, per generation batch:

- seconds per phase, with ``torch.cuda.synchronize()`` at every boundary on CUDA (queued kernels are charged to the
  phase that launched them);
- forwards per phase: a pre-hook on each model's backbone counts calls, rows and tokens, and the rows per call
  (``rows``: ``{"1": 68}`` is 68 one-row forwards); ``decode`` counts the one-token forwards of sampling;
- peak memory per phase (``torch.cuda.max_memory_allocated``, reset at each boundary; None on a CPU);
- in a profiled batch, per phase (the innermost one running): a ``torch.profiler`` session per stretch between two
  boundaries, reduced at once from its raw events (no trace kept): kernels, launches, host-sync and copy API calls,
  which attention op ran, device-busy time; on CUDA also the exact host syncs from
  ``torch.cuda.set_sync_debug_mode("warn")`` and the source lines that made the most.

A decode window of ``trace_steps`` one-token forwards can be exported as a gzipped Chrome trace instead.
"""

from __future__ import annotations

import contextlib
import gzip
import re
import shutil
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

RUNTIME_CALLS = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaGraphLaunch",
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpyAsync",
)
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
ATEN_COUNTED = ("aten::_local_scalar_dense", "aten::nonzero", "aten::repeat_interleave", "aten::item")
ATTENTION_MARKS = ("scaled_dot_product", "attention_forward", "attention_backward", "_efficient_attention")


@dataclass
class Frame:
    name: str
    start: float
    children: float = 0.0  # seconds spent in nested phases
    peak: int = 0


@dataclass
class ProfileCounts:
    """One phase's reduced profile (summed over its stretches)."""

    seconds: float = 0.0  # wall time of the phase's own stretches (nested phases excluded)
    device_busy_ns: int = 0
    kernels: int = 0
    memcpy_dtoh: int = 0
    calls: Counter[str] = field(default_factory=Counter)  # runtime API calls and counted aten ops
    attention: Counter[str] = field(default_factory=Counter)
    aten_ops: int = 0
    kernel_ns: Counter[str] = field(default_factory=Counter)
    kernel_count: Counter[str] = field(default_factory=Counter)
    syncs: int | None = None
    sync_sites: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        return {
            "wall_s": round(self.seconds, 4),
            "device_busy_s": round(self.device_busy_ns / 1e9, 4),
            "kernels": self.kernels,
            "kernel_launches": sum(self.calls[name] for name in LAUNCHES),
            "memcpy_dtoh": self.memcpy_dtoh,
            "calls": dict(self.calls),
            "attention_ops": dict(self.attention),
            "aten_ops": self.aten_ops,
            "host_syncs": self.syncs,
            "host_sync_sites": dict(self.sync_sites.most_common(8)),
        }


def reduce_events(events: Any, into: ProfileCounts) -> None:
    """Add a profiler session's raw events (``prof.profiler.kineto_results.events()``) to ``into``."""
    for event in events:
        name = event.name()
        if event.device_type() != torch.autograd.DeviceType.CPU:  # a kernel, a copy or a memset on the device
            duration = event.duration_ns()
            into.device_busy_ns += duration
            if "Memcpy DtoH" in name:
                into.memcpy_dtoh += 1
            elif "Memcpy" not in name and "Memset" not in name:
                into.kernels += 1
                into.kernel_ns[name[:160]] += duration
                into.kernel_count[name[:160]] += 1
        elif name.startswith("cu") and (call := re.sub(r"_v\d+$", "", name)) in RUNTIME_CALLS:  # CUPTI's _v7000
            into.calls[call] += 1
        elif name in ATEN_COUNTED:
            into.calls[name] += 1
        elif name.startswith("aten::"):
            into.aten_ops += 1
            if any(mark in name for mark in ATTENTION_MARKS):
                into.attention[name] += 1


class Recorder:
    """Phases, forwards, peaks and (in a profiled batch) reduced profiles of a run (module docstring)."""

    def __init__(self, device: torch.device, trace_path: Path | None = None, trace_steps: tuple[int, int] = (0, 0)):
        self.cuda = device.type == "cuda"
        self.stack: list[Frame] = []
        self.batches: list[dict[str, Any]] = []
        self.batch: dict[str, Any] | None = None
        self.profile: dict[str, ProfileCounts] | None = None  # while a profiled batch runs
        self.profiled: dict[str, ProfileCounts] | None = None  # the profiled batch's, once it is over
        self._session: Any = None
        self._segment_start = 0.0
        self._warnings: list[warnings.WarningMessage] | None = None
        self._warning_context: Any = None
        self._seen_warnings = 0
        self.trace_path, self.trace_steps = trace_path, trace_steps
        self._trace: Any = None
        self._decodes = 0

    # ------------------------------------------------------------------ boundaries
    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """No sync counting inside: the recorder's own syncs, reads of lengths and profiler calls."""
        mode = torch.cuda.get_sync_debug_mode() if self.cuda else 0
        if self.cuda:
            torch.cuda.set_sync_debug_mode(0)
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.set_sync_debug_mode(mode)

    def _boundary(self) -> None:
        """Sync, and charge what happened since the last boundary (syncs, the profile) to the innermost phase."""
        with self.quiet():
            if self.cuda:
                torch.cuda.synchronize()
            if self.profile is None or not self.stack:
                return
            counts = self.profile.setdefault(self.stack[-1].name, ProfileCounts())
            counts.seconds += time.perf_counter() - self._segment_start
            if self._warnings is not None:
                new = [w for w in self._warnings[self._seen_warnings :] if "synchroniz" in str(w.message)]
                counts.syncs = (counts.syncs or 0) + len(new)
                counts.sync_sites.update(f"{Path(w.filename).name}:{w.lineno}" for w in new)
            if self._session is not None:
                self._session.stop()
                reduce_events(self._session.profiler.kineto_results.events(), counts)
                self._session = self._new_session()
                self._session.start()
            if self._warnings is not None:  # the profiler's own, if any, are nobody's
                self._seen_warnings = len(self._warnings)
        self._segment_start = time.perf_counter()

    def _new_session(self) -> Any:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        return torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False)

    def _peak(self) -> int:
        return torch.cuda.max_memory_allocated() if self.cuda else 0

    def push(self, name: str) -> None:
        self._boundary()
        if self.stack:
            self.stack[-1].peak = max(self.stack[-1].peak, self._peak())
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        self.stack.append(Frame(name, time.perf_counter()))

    def pop(self, name: str) -> float:
        """End phase ``name`` (the innermost); returns its seconds without nested phases."""
        self._boundary()
        frame = self.stack.pop()
        assert frame.name == name, f"phase {name} ended inside {frame.name}"
        seconds = time.perf_counter() - frame.start
        frame.peak = max(frame.peak, self._peak())
        if self.stack:
            self.stack[-1].children += seconds
            self.stack[-1].peak = max(self.stack[-1].peak, frame.peak)
        if self.batch is not None:
            self.batch["phases"].setdefault(name, []).append(round(seconds, 5))
            self.batch["own"].setdefault(name, []).append(round(seconds - frame.children, 5))
            peaks = self.batch["peak_bytes"]
            if self.cuda:
                peaks[name] = max(peaks.get(name) or 0, frame.peak)
            else:
                peaks[name] = None
        return seconds - frame.children

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.push(name)
        try:
            yield
        finally:
            self.pop(name)

    # ------------------------------------------------------------------ batches
    def begin_batch(self, profiled: bool = False) -> None:
        self.batch = {"index": len(self.batches), "profiled": profiled, "phases": {}, "own": {}, "peak_bytes": {}}
        self.batch["forwards"] = {}
        if profiled:
            self.profile = {}
            if self.cuda:
                self._warning_context = warnings.catch_warnings(record=True)
                self._warnings = self._warning_context.__enter__()
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
            self._session = self._new_session()
            self._session.start()
            self._segment_start = time.perf_counter()
        self.push("batch")

    def end_batch(self) -> dict[str, Any]:
        self.pop("batch")
        batch = self.batch
        assert batch is not None
        if self.profile is not None:
            if self._session is not None:
                with self.quiet():
                    self._session.stop()
                self._session = None
            if self._warning_context is not None:
                torch.cuda.set_sync_debug_mode(0)
                self._warning_context.__exit__(None, None, None)
                self._warning_context = self._warnings = None
            self.profiled, self.profile = self.profile, None
        batch["seconds"] = batch["phases"]["batch"][0]
        self.batches.append(batch)
        self.batch = None
        return batch

    def note(self, **values: Any) -> None:
        """Add ``values`` to the batch in progress (lengths read by a runner)."""
        if self.batch is not None:
            self.batch.update(values)

    # ------------------------------------------------------------------ forwards
    def watch(self, model: Any) -> None:
        """Count the forwards of ``model``'s backbone (a policy or a reference; None is skipped)."""
        if model is not None:
            model.base_model.register_forward_pre_hook(self._forward, with_kwargs=True)

    def _forward(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        if ids is None or self.batch is None or not self.stack:
            return
        rows, tokens = int(ids.shape[0]), int(ids.shape[0] * ids.shape[1])
        phase = self.stack[-1].name
        empty = {"calls": 0, "rows": 0, "tokens": 0, "decode": 0, "per_call": {}}
        seen = self.batch["forwards"].setdefault(phase, empty)
        seen["calls"] += 1
        seen["rows"] += rows
        seen["tokens"] += tokens
        seen["per_call"][str(rows)] = seen["per_call"].get(str(rows), 0) + 1
        if ids.shape[1] == 1 and phase == "sampling":
            seen["decode"] += 1
            self._decode_step()

    def _decode_step(self) -> None:
        """Start or stop the decode trace at the asked one-token forwards (the first batch only)."""
        if self.trace_path is None or self.batches or self.profile is not None:
            return
        self._decodes += 1
        first, count = self.trace_steps
        if self._decodes == first:
            self._trace = self._new_session()
            self._trace.start()
        elif self._decodes == first + count:
            self.finish_trace()

    def finish_trace(self) -> None:
        """Write the decode trace, if one is running (also called when sampling ends before its last step)."""
        if self._trace is None or self.trace_path is None:
            return
        with self.quiet():
            if self.cuda:
                torch.cuda.synchronize()
            self._trace.stop()
        plain = self.trace_path.with_suffix("")  # trace_decode.json.gz -> trace_decode.json
        self._trace.export_chrome_trace(str(plain))
        with plain.open("rb") as source, gzip.open(self.trace_path, "wb") as target:
            shutil.copyfileobj(source, target)
        plain.unlink()
        self._trace, self.trace_path = None, None

    # ------------------------------------------------------------------ the profiled batch
    def profile_summary(self, decode_steps: int) -> dict[str, Any] | None:
        """The profiled batch, reduced: per phase (own stretches), the top 15 kernels, launches per decode step."""
        if self.profiled is None:
            return None
        total = ProfileCounts()
        for counts in self.profiled.values():
            total.kernel_ns.update(counts.kernel_ns)
            total.kernel_count.update(counts.kernel_count)
        top = [
            {"kernel": name, "ms": round(ns / 1e6, 3), "count": total.kernel_count[name]}
            for name, ns in total.kernel_ns.most_common(15)
        ]
        sampling = self.profiled.get("sampling", ProfileCounts())
        launches = sum(sampling.calls[name] for name in LAUNCHES) or sampling.kernels  # a kernel, a launch
        return {
            "phases": {name: counts.summary() for name, counts in self.profiled.items()},
            "top_kernels": top,
            "kernel_launches_per_decode_step": round(launches / decode_steps, 1) if decode_steps else None,
            "aten_ops_per_decode_step": round(sampling.aten_ops / decode_steps, 1) if decode_steps else None,
            "decode_steps": decode_steps,
        }
