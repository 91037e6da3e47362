"""The tables of ``benchmarks/gpu_vs_trl.sh``: rloo and TRL phase by phase, against each other and the floors.

    python3 benchmarks/gpu_report.py OUT   # reads OUT/{rloo,trl,ab,repro}.json, writes OUT/gpu-vs-trl-<device>.json

Standard library only (it runs last, whatever state the runs left). Figures are medians over the timed batches:
every batch after the first (the warm-up) except the profiled one, which is timed apart (or it alone, when no other
is left). ``update`` is one optimizer step's time less any sampling and log-prob passes inside it (TRL samples
inside its first step of a batch).

The floors (``../shared/design/gpu_step.md`` section 1) come from the device's peak numbers (:data:`PEAKS`; none on
a CPU) and the batch's real token counts, so each implementation is held to the floor of what it sampled:

- a decode step reads the bf16 weights once and every active row's KV cache: ``(2 B x parameters + KV) / bandwidth``;
- sampling: all decode steps' reads, plus the prefill of the distinct prompts at peak FLOP/s;
- log-prob passes (reference and old): ``2 x (2 x body x tokens + 2 x head x completion tokens) / peak``;
- an update (a quarter of the batch's rows): ``(6 x body x tokens + 6 x head x completion tokens) / peak`` plus
  AdamW's 32 bytes per parameter at the bandwidth;
- a generation batch: sampling, the log-prob passes and the updates.

MFU is those FLOPs over the measured seconds and the peak; the decode step's share of the bandwidth limit is its
floor over its measured time. ``body``: parameters without the embedding; ``head``: the (tied) output embedding.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

# name fragment -> (memory bandwidth B/s, dense bf16 FLOP/s): the design's H100 figures; the H200's bandwidth
PEAKS = {"H200": (4.0e12, 800e12), "H100": (3.0e12, 800e12)}
ADAM_BYTES_PER_PARAMETER = 32  # read weight, gradient and two moments, write three, zero the gradient (fp32)
GiB = 2**30


def load(out: Path, name: str) -> dict[str, Any]:
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def timed_batches(run: dict[str, Any]) -> list[dict[str, Any]]:
    batches = run.get("batches", [])
    after = batches[1:] or batches
    return [b for b in after if not b["profiled"]] or after


def numbers(run: dict[str, Any]) -> dict[str, Any] | None:
    """A run's medians per phase (module docstring); None when it measured no batch."""
    batches = timed_batches(run)
    if not batches:
        return None
    sampling = [sum(b["phases"].get("sampling", [0.0])) for b in batches]
    steps = [b.get("decode_steps") or 0 for b in batches]
    updates = [u for b in batches for u in b["own"].get("update", [])]
    peaks = [b["peak_bytes"].get("batch") for b in batches]
    forwards = batches[-1]["forwards"]
    per_step = [1000 * s / n for s, n in zip(sampling, steps, strict=True) if n]
    return {
        "sampling": statistics.median(sampling),
        "decode_ms": statistics.median(per_step) if per_step else None,
        "decode_steps": statistics.median(steps),
        "mean_completion_length": statistics.median(b.get("mean_completion_length", 0.0) for b in batches),
        "logprobs": statistics.median(sum(b["phases"].get("logprobs", [0.0])) for b in batches),
        "update": statistics.median(updates) if updates else None,
        "update_slowest_over_median": max(updates) / statistics.median(updates) if updates else None,
        "batch": statistics.median(b["seconds"] for b in batches),
        "batch_seconds": [round(b["seconds"], 3) for b in run.get("batches", [])],
        "peak_gib": max(peaks) / GiB if all(p is not None for p in peaks) else None,
        "logprob_forwards": forwards.get("logprobs", {}).get("calls", 0),
        "update_forwards": forwards.get("update", {}).get("calls", 0),
        "rows_per_forward": {phase: seen["per_call"] for phase, seen in forwards.items()},
        "timed_batches": [b["index"] for b in batches],
    }


def peaks_for(device: str) -> tuple[float, float] | None:
    return next((peak for key, peak in PEAKS.items() if key in device.upper()), None)


def floors(run: dict[str, Any], peaks: tuple[float, float]) -> dict[str, float] | None:
    """The run's floors per phase and the FLOPs they stand for (module docstring), from a timed batch's lengths."""
    batches = timed_batches(run)
    model = run.get("model")
    if not batches or model is None or "completion_lengths" not in batches[-1]:
        return None
    bandwidth, flops = peaks
    batch, settings = batches[-1], run["settings"]
    prompts, completions = batch["prompt_lengths"], batch["completion_lengths"]
    body, head, total = model["body_parameters"], model["head_parameters"], model["parameters"]
    kv_per_token = 2 * model["layers"] * model["kv_heads"] * model["head_dim"] * 2  # K and V, bf16
    steps = max(batch["decode_steps"], 1)
    kv = kv_per_token * sum(c * p + c * (c - 1) / 2 for p, c in zip(prompts, completions, strict=True))
    weights = 2 * total
    prefill = 2 * body * sum(prompts) / settings["num_generations"]
    tokens, new = sum(prompts) + sum(completions), sum(completions)
    logprob_flops = 2 * (2 * body * tokens + 2 * head * new)
    optimizer_steps = settings["steps_per_generation"]
    update_flops = (6 * body * tokens + 6 * head * new) / optimizer_steps
    found = {
        "decode_ms": 1000 * (weights + kv / steps) / bandwidth,
        "sampling": (steps * weights + kv) / bandwidth + prefill / flops,
        "logprobs": logprob_flops / flops,
        "update": update_flops / flops + ADAM_BYTES_PER_PARAMETER * total / bandwidth,
        "logprob_flops": logprob_flops,
        "update_flops": update_flops,
    }
    found["batch"] = found["sampling"] + found["logprobs"] + optimizer_steps * found["update"]
    return found


def efficiency(got: dict[str, Any], floor: dict[str, float] | None, peak_flops: float) -> dict[str, float | None]:
    def share(work: float, seconds: float | None) -> float | None:
        return 100 * work / seconds if floor is not None and seconds else None

    return {
        "mfu_logprobs": share(floor["logprob_flops"] / peak_flops, got["logprobs"]) if floor else None,
        "mfu_update": share(floor["update_flops"] / peak_flops, got["update"]) if floor else None,
        "decode_bandwidth": share(floor["decode_ms"], got["decode_ms"]) if floor else None,
    }


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}x" if isinstance(a, int | float) and isinstance(b, int | float) and b else "-"


ROWS = [  # label, key in numbers(), has a floor
    ("sampling, s", "sampling", True),
    ("decode step, ms", "decode_ms", True),
    ("log-prob passes (reference + old), s", "logprobs", True),
    ("update per optimizer step, s", "update", True),
    ("generation batch, s", "batch", True),
    ("peak memory, GiB", "peak_gib", False),
    ("forwards per batch: log-prob passes", "logprob_forwards", False),
    ("forwards per batch: updates", "update_forwards", False),
    ("slowest update / median", "update_slowest_over_median", False),
    ("MFU of the log-prob passes, %", "mfu_logprobs", False),
    ("MFU of the updates, %", "mfu_update", False),
    ("decode step, % of the bandwidth limit", "decode_bandwidth", False),
    ("batches timed (0 is the warm-up)", "timed_batches", False),
]


def case_rows(label: str, ours: dict[str, Any] | None, theirs: dict[str, Any] | None) -> list[str]:
    rows = []
    for name, key, floored in ROWS:
        a = ours.get(key) if ours else None
        b = theirs.get(key) if theirs else None
        floor_a = (ours or {}).get("floors") or {}
        floor_b = (theirs or {}).get("floors") or {}
        floor = floor_a.get(key, floor_b.get(key)) if floored else None
        rloo_floor = ratio(a, floor_a.get(key)) if floored else ""
        trl_floor = ratio(b, floor_b.get(key)) if floored else ""
        cells = [f"{label}: {name}", fmt(a), fmt(b), ratio(a, b), fmt(floor), rloo_floor, trl_floor]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def summarize(run: dict[str, Any]) -> dict[str, Any] | None:
    got = numbers(run) if run.get("status") in ("done", "running", "error") else None
    if got is None:
        return None
    peaks = peaks_for(run.get("device", ""))
    got["floors"] = floors(run, peaks) if peaks else None
    got.update(efficiency(got, got["floors"], peaks[1] if peaks else 0.0))
    return got


def main_table(rloo: dict[str, Any], trl: dict[str, Any], ab: dict[str, Any] | None = None) -> list[str]:
    lines = [
        "| phase | rloo | TRL | rloo/TRL | floor | rloo/floor | TRL/floor |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in ("fixed", "varied"):
        lines += case_rows(case, summarize(rloo.get(case, {})), summarize(trl.get(case, {})))
    cb = trl.get("cb fixed", {})
    if cb.get("status") == "unsupported":
        lines.append(f"| fixed, TRL with continuous batching | | unsupported: {cb.get('reason')} | | | | |")
    elif cb:
        lines += case_rows("fixed, TRL continuous batching", summarize(rloo.get("fixed", {})), summarize(cb))
    ours = (ab or {}).get("cb fixed", {})
    if ours.get("status") == "unsupported":
        lines.append(f"| fixed, rloo with continuous batching | unsupported: {ours.get('reason')} | | | | | |")
    elif ours:  # the same engine on both sides: what is left is the trainers' own phases
        lines += case_rows("fixed, both continuous batching", summarize(ours), summarize(cb) if cb else None)
    return lines


def ab_table(rloo: dict[str, Any], ab: dict[str, Any]) -> list[str]:
    lines = [
        "| rloo | warm-up batch, s | timed batch, s | sampling, s | decode step, ms | log-probs, s | update, s "
        "| status |",
        "|---|---|---|---|---|---|---|---|",
    ]
    runs = [("as is, fixed", rloo.get("fixed")), *((k, v) for k, v in ab.items() if k.endswith("fixed"))]
    runs += [("as is, varied", rloo.get("varied")), *((k, v) for k, v in ab.items() if k.endswith("varied"))]
    for name, run in runs:
        if not run:
            continue
        got = numbers(run) or {}
        warm = run["batches"][0]["seconds"] if run.get("batches") else None
        keys = ("batch", "sampling", "decode_ms", "logprobs", "update")
        lines.append(f"| {name} | {fmt(warm)} | " + " | ".join(fmt(got.get(k)) for k in keys) + f" | {run['status']} |")
    return lines


def repro_table(repro: dict[str, Any]) -> list[str]:
    lines = [
        "| async_overlap repro | s / step | steps, s | rollout phases, s | mean completion lengths |",
        "|---|---|---|---|---|",
    ]
    for name, r in repro.get("results", {}).items():
        lengths = [round(x, 1) for x in r.get("mean_lengths", []) if x is not None]
        lines.append(f"| {name} | {fmt(r['per_step'])} | {r['steps']} | {r['rollout_phases']} | {lengths} |")
    return lines


def verdict(rloo: dict[str, Any], ab: dict[str, Any]) -> list[str]:
    """Which of rloo's opt-in paths won on this GPU's fixed case, against the eager loop and chunked head as is:
    the sampler (the captured decode step of ``graphs-fused``, transformers' continuous batching of ``cb``) by
    sampling seconds, the fused LM head (``graphs-fused``) by log-prob and update seconds; the next session makes
    a winner the CUDA default (issue 38)."""

    def finished(run: dict[str, Any] | None) -> dict[str, Any] | None:
        return numbers(run) if run and run.get("status") == "done" else None

    base = finished(rloo.get("fixed"))
    if base is None:
        return ["verdict: no finished as-is fixed run to compare with"]
    lines = []
    samplers = {"eager loop (as is)": base["sampling"]}
    for key, name in (("graphs-fused fixed", "captured decode step"), ("cb fixed", "continuous batching")):
        got = finished(ab.get(key))
        if got is not None:
            samplers[name] = got["sampling"]
    best = min(samplers, key=lambda name: samplers[name])
    shown = ", ".join(f"{name} {seconds:.3g} s" for name, seconds in samplers.items())
    lines.append(f"verdict, sampler: {best} is the fastest ({shown})")
    fused = finished(ab.get("graphs-fused fixed"))
    if fused is not None:
        for phase in ("logprobs", "update"):
            if base.get(phase) and fused.get(phase):
                lines.append(
                    f"verdict, {phase} with the fused head: {ratio(fused[phase], base[phase])} the chunked head's"
                )
    return lines


def device_slug(device: str) -> str:
    found = re.search(r"[HAB]\d{2,3}", device.upper())
    return found.group(0).lower() if found else re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "unknown"


def report(out: Path) -> Path:
    rloo, trl, ab, repro = (load(out, name) for name in ("rloo", "trl", "ab", "repro"))
    runs = {f"rloo {k}": v for k, v in rloo.items()} | {f"trl {k}": v for k, v in trl.items()}
    runs |= {f"rloo {k}": v for k, v in ab.items()}
    device = next((r["device"] for r in runs.values() if r.get("device")), "unknown")
    for name, run in runs.items():
        if run.get("status") not in ("done", "unsupported"):
            error = (run.get("error") or "no error recorded (killed at its time limit?)").strip().splitlines()
            print(f"{name}: {run.get('status')}, {len(run.get('batches', []))} batches: {error[-1]}")
    tables = {"ab": ab_table(rloo, ab), "repro": repro_table(repro), "main": main_table(rloo, trl, ab)}
    summary = {
        "device": device,
        "peaks": peaks_for(device),
        "summaries": {name: summarize(run) for name, run in runs.items()},
        "tables": tables,
        "verdict": verdict(rloo, ab),
    }
    path = out / f"gpu-vs-trl-{device_slug(device)}.json"
    path.write_text(json.dumps(summary, indent=1))
    print(f"\nrloo and TRL on {device} (summary: {path.name})\n")
    print("\n".join(summary["verdict"]) + "\n")
    print("\n\n".join("\n".join(tables[name]) for name in ("ab", "repro", "main")))  # the main table last
    return path


if __name__ == "__main__":
    report(Path(sys.argv[1]))
