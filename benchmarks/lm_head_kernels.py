"""The LM head's kernels side by side (issue 38 part 7): the chunked head against the fused head, log-prob
passes (no gradient) and training passes (forward + backward), time and peak memory.

    python3 benchmarks/lm_head_kernels.py --out benchmarks/gpu/lm-head-h200.json   # a GPU (about a minute)
    .venv/bin/python benchmarks/lm_head_kernels.py --quick                          # a tiny head on the CPU
    .venv/bin/python benchmarks/lm_head_kernels.py --vocab 32000 --hidden 512 --rows 64 --tokens 64 \
        --autocast none --vocab-tiles 32000 --token-tile 2097 --repeats 3          # the CPU benchmark's head

The default shape is Qwen2.5-0.5B's head: V = 151,936, D = 896, 16 rows x 256 tokens (4,096), under bf16
autocast over float32 weights (rloo's default on a GPU; ``--weights bfloat16`` stores them in bf16), the
hidden states float32 as the final norm returns them there. ``chunked`` is
:func:`rloo.forward.lm_head.chunked_head_logprobs` with ``RLOO_LM_HEAD_KERNEL=chunked`` and rloo's
default 256 MiB of float32 logits a chunk; ``fused`` is :func:`rloo.forward.fused_head.fused_logprobs`
at each ``--vocab-tiles`` (its Triton fold on a GPU; on a CPU its torch fold: ``--quick`` is a dry run
of the script, its times mean nothing). Both compute the entropy as a metric, as the passes do.

Times: the median of ``--repeats`` after ``--warmup``, each between ``torch.cuda.synchronize()`` calls;
peak: ``torch.cuda.max_memory_allocated`` above what the inputs hold. Each fused case is also compared with
the chunked head (the largest log-prob, entropy and relative gradient differences), the first run of the
fused head's Triton kernels on a GPU being their first check there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rloo.forward.fused_head import KERNEL_VARIABLE, TOKEN_TILE, VOCAB_TILE, fused_logprobs
from rloo.forward.lm_head import chunked_head_logprobs
from rloo.forward.logprobs import TokenScore

MiB = 2**20
TEMPERATURE = 0.9


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="V 1000, D 32, 4 x 16 tokens, 1 repeat (CPU dry run)")
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256, help="completion tokens a row")
    parser.add_argument("--weights", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--chunk-mib", type=float, default=256.0, help="the chunked head's float32 logits a chunk")
    parser.add_argument("--vocab-tiles", default=str(VOCAB_TILE), help="the fused head's vocabulary tiles, a,b,...")
    parser.add_argument(
        "--token-tile", type=int, default=None, help="the fused head's tokens a tile (default: the device's)"
    )
    parser.add_argument(
        "--autocast", choices=["bf16", "none"], default="bf16", help="none: float32 passes, as rloo's CPU default"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    options = parser.parse_args(argv)
    if options.quick:
        options.vocab, options.hidden, options.rows, options.tokens = 1000, 32, 4, 16
        options.chunk_mib, options.vocab_tiles, options.repeats, options.warmup = 0.05, "256,1000", 1, 0
    return options


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def inputs(options: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The head, its float32 inputs ``(rows, tokens, D)``, the target ids and a weight a token (the loss)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    head = torch.nn.Linear(options.hidden, options.vocab, bias=False)
    torch.nn.init.normal_(head.weight, std=0.02, generator=gen)
    head = head.to(device=device, dtype=getattr(torch, options.weights))
    shape = (options.rows, options.tokens)
    return {
        "head": head,
        "hidden": torch.randn(*shape, options.hidden, generator=gen).to(device),
        "ids": torch.randint(0, options.vocab, shape, generator=gen).to(device),
        "weights": torch.randn(shape, generator=gen).to(device),
        "autocast": options.autocast == "bf16",
    }


def head_call(kernel: str, vocab_tile: int, data: dict[str, Any], options: argparse.Namespace) -> Callable[..., Any]:
    """One pass's head: ``hidden -> (log-probs, entropies)``, both ``(rows, tokens)``."""
    head, ids = data["head"], data["ids"]
    if kernel == "chunked":
        score, mask = TokenScore(TEMPERATURE, True, False), torch.ones_like(ids)
        chunk = max(1, int(options.chunk_mib * MiB) // 4)
        return lambda hidden: chunked_head_logprobs(head, head, hidden, ids, mask, score, True, chunk)

    def fused(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = hidden.reshape(-1, hidden.shape[-1])
        token_tile = options.token_tile or TOKEN_TILE
        logprobs, entropy = fused_logprobs(
            flat, head.weight, None, ids.reshape(-1), TEMPERATURE, True, token_tile=token_tile, vocab_tile=vocab_tile
        )
        assert entropy is not None
        return logprobs.view_as(ids), entropy.view_as(ids)

    return fused


def run_once(call: Callable[..., Any], data: dict[str, Any], train: bool) -> dict[str, torch.Tensor]:
    """The pass under bf16 autocast; with ``train``, the backward of ``sum(w * log p)``."""
    head, device = data["head"], data["hidden"].device
    head.zero_grad(set_to_none=True)
    hidden = data["hidden"].detach().requires_grad_(train)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=data["autocast"])
    with torch.set_grad_enabled(train), autocast:
        logprobs, entropy = call(hidden)
    if train:
        (logprobs * data["weights"]).sum().backward()
        return {"logprobs": logprobs.detach(), "entropy": entropy, "hidden": hidden.grad, "weight": head.weight.grad}
    return {"logprobs": logprobs, "entropy": entropy}


def measure(
    call: Callable[..., Any], data: dict[str, Any], train: bool, options: argparse.Namespace
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Median milliseconds over ``--repeats`` (after ``--warmup``), the peak memory above the inputs, the outputs."""
    device = data["hidden"].device
    for _ in range(options.warmup):
        run_once(call, data, train)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    times = []
    for _ in range(options.repeats):
        synchronize(device)
        start = time.perf_counter()
        outputs = run_once(call, data, train)
        synchronize(device)
        times.append(time.perf_counter() - start)
    peak = (torch.cuda.max_memory_allocated(device) - before) / MiB if device.type == "cuda" else None
    return {"ms": 1000 * statistics.median(times), "ms_all": [1000 * t for t in times], "peak_mib": peak}, outputs


def differences(ours: dict[str, torch.Tensor], chunked: dict[str, torch.Tensor]) -> dict[str, float]:
    """The largest absolute log-prob and entropy differences, and each gradient's relative to its largest."""
    found = {}
    for name, theirs in chunked.items():
        gap = float((ours[name].float() - theirs.float()).abs().max())
        found[name] = gap if name in ("logprobs", "entropy") else gap / max(float(theirs.float().abs().max()), 1e-30)
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    options = parse(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not options.quick else "cpu")
    data = inputs(options, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    shape = (
        f"V {options.vocab}, D {options.hidden}, {options.rows} x {options.tokens} tokens, {options.weights} weights"
    )
    print(f"{name}: {shape}, {'bf16 autocast' if options.autocast == 'bf16' else 'float32'}")
    cases = [("chunked", 0)] + [("fused", int(tile)) for tile in options.vocab_tiles.split(",")]
    results: list[dict[str, Any]] = []
    asked = os.environ.get(KERNEL_VARIABLE)
    os.environ[KERNEL_VARIABLE] = "chunked"  # the chunked case takes the chunked head on a GPU too
    try:
        for mode, train in (("logprobs", False), ("train", True)):
            results += run_cases(mode, train, cases, data, options)
    finally:
        os.environ.pop(KERNEL_VARIABLE)
        if asked is not None:
            os.environ[KERNEL_VARIABLE] = asked
    report = {"device": name, "shape": shape, "results": results}
    if options.out:
        Path(options.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


def run_cases(
    mode: str, train: bool, cases: list[tuple[str, int]], data: dict[str, Any], options: argparse.Namespace
) -> list[dict[str, Any]]:
    """Each case's row of the table, in order; the first (the chunked head) is the others' reference."""
    results, reference = [], {}
    for kernel, tile in cases:
        row: dict[str, Any] = {"mode": mode, "kernel": kernel, "vocab_tile": tile or None}
        try:
            timing, outputs = measure(head_call(kernel, tile, data, options), data, train, options)
            row |= timing
            reference = reference or outputs
            row["max_differences"] = differences(outputs, reference)
        except Exception as error:  # a case that fails (out of memory, a kernel) leaves the others' numbers
            row["error"] = f"{type(error).__name__}: {error}"[:500]
        results.append(row)
        print(table_row(row), flush=True)
    return results


def table_row(row: dict[str, Any]) -> str:
    case = f"{row['mode']:<9} {row['kernel']:<8} {row['vocab_tile'] or '':>6}"
    if "error" in row:
        return f"{case}  failed: {row['error']}"
    peak = "" if row["peak_mib"] is None else f"{row['peak_mib']:9.0f} MiB peak"
    gaps = ", ".join(f"{k} {v:.1e}" for k, v in row["max_differences"].items())
    return f"{case}  {row['ms']:9.2f} ms  {peak}  (vs chunked: {gaps})"


if __name__ == "__main__":
    main()
