"""The exact fast paths of issue 13 against their plain paths, on realistic shapes, in one process.

    .venv/bin/python benchmarks/fast_paths.py                     # small model (36M, 32k vocab), CPU or GPU
    .venv/bin/python benchmarks/fast_paths.py --model tiny --quick  # a smoke run

Realistic work, unlike the rloo-vs-TRL benchmark's random model that never ends: completions end
at varied lengths (each token ends its completion with probability ``--end-prob``, geometric
lengths with a tail at ``--max-new``, by declaring that share of the vocabulary EOS on a random
model) and prompts are long (``--prompt-len`` tokens, random ids) and shared by their K samples.

Measured side by side, alternating, on the same inputs (each pair checked equal first):
- sampling: ``generate_rollouts`` with compaction (finished rows leave the decode batch) vs without;
- log-probs without gradient (the reference pass): plain forward vs chunked head vs chunked head +
  prompt sharing; and the same three with gradient (a training pass, forward + backward).
Prints one JSON object: median seconds per variant and ratios, and on CUDA the peak memory of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import MODEL_SIZES

from rloo.forward.logprobs import completion_logprobs
from rloo.generation.rollout import Rollout, generate_rollouts
from rloo.generation.sampling import SamplingParams


def build_model(size: str, device: torch.device, dtype: torch.dtype) -> Any:
    spec = MODEL_SIZES[size]
    config = transformers.LlamaConfig(
        vocab_size=spec["vocab_size"],
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_layers"],
        num_attention_heads=spec["num_heads"],
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, float, Any]:
    """``(seconds, peak MiB on CUDA else 0, result)`` of one call."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else 0.0
    return time.perf_counter() - start, peak, result


def compare(variants: dict[str, Callable[[], Any]], repeats: int, device: torch.device) -> dict[str, Any]:
    """Median seconds and peak MiB of each variant, runs alternating; ratios against the first (plain)."""
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    peaks: dict[str, float] = dict.fromkeys(variants, 0.0)
    for _ in range(repeats + 1):  # the first round warms up
        for name, fn in variants.items():
            elapsed, peak, _ = timed(fn, device)
            seconds[name].append(elapsed)
            peaks[name] = max(peaks[name], peak)
    medians = {name: statistics.median(values[1:]) for name, values in seconds.items()}
    plain = next(iter(medians.values()))
    return {
        "seconds": medians,
        "speedup_vs_plain": {name: plain / value for name, value in medians.items()},
        "peak_mib": peaks if device.type == "cuda" else None,
    }


def sample(model: Any, prompts: list[list[int]], args: argparse.Namespace, eos: list[int], compact: bool) -> Rollout:
    return generate_rollouts(
        model,
        prompts,
        list(range(len(prompts))),
        num_generations=args.k,
        max_new_tokens=args.max_new,
        params=SamplingParams(temperature=1.0),
        eos_token_ids=eos,
        pad_token_id=0,
        sampling_seed=0,
        compact_at=0.25 if compact else None,
    )


def logprob_pass(model: Any, r: Rollout, chunked: bool, shared: bool, grad: bool) -> torch.Tensor:
    with torch.set_grad_enabled(grad):
        out = completion_logprobs(
            model,
            r.prompt_ids,
            r.prompt_mask,
            r.completion_ids,
            r.completion_mask,
            1.0,
            with_entropy=grad,
            chunked_head=chunked,
            share_prompts=shared,
        )
        if grad:
            (out.logprobs * r.completion_mask).sum().backward()
            model.zero_grad(set_to_none=True)
    return out.logprobs.detach() * r.completion_mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODEL_SIZES), default="small")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--max-new", type=int, default=256)
    parser.add_argument("--end-prob", type=float, default=0.02, help="each token ends its completion with this p")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--quick", action="store_true", help="short prompts and completions, 1 repeat")
    args = parser.parse_args()
    if args.quick:
        args.prompt_len, args.max_new, args.repeats, args.k = 32, 16, 1, 4
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(args.model, device, getattr(torch, args.dtype))
    vocab = model.config.vocab_size
    eos = list(range(1, 1 + max(1, round(args.end_prob * vocab))))  # a random model: p(end) ~ their share
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(eos[-1] + 1, vocab, (args.prompt_len,), generator=gen).tolist() for _ in range(args.prompts)
    ]
    plain, compacted = sample(model, prompts, args, eos, False), sample(model, prompts, args, eos, True)
    assert torch.equal(plain.completion_ids, compacted.completion_ids), "compaction changed the tokens"
    lengths = plain.completion_mask.sum(dim=1)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "args": vars(args),
        "completion_lengths": {"mean": float(lengths.mean()), "max": float(lengths.max()), "min": float(lengths.min())},
        "sampling": compare(
            {
                "plain": lambda: sample(model, prompts, args, eos, False),
                "compacted": lambda: sample(model, prompts, args, eos, True),
            },
            args.repeats,
            device,
        ),
    }
    for grad in (False, True):
        variants = {
            "plain": lambda g=grad: logprob_pass(model, plain, False, False, g),
            "chunked_head": lambda g=grad: logprob_pass(model, plain, True, False, g),
            "chunked_head+shared_prompts": lambda g=grad: logprob_pass(model, plain, True, True, g),
        }
        results = [fn() for fn in variants.values()]
        for other in results[1:]:
            torch.testing.assert_close(other, results[0], atol=1e-3 if args.dtype == "float32" else 5e-2, rtol=0)
        report["training_pass" if grad else "reference_pass"] = compare(variants, args.repeats, device)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
