"""Where bf16 autocast costs time on a small model: rloo's sampler and a training pass in float32, under
``torch.autocast`` (bf16 compute over float32 weights, what accelerate's ``mixed_precision="bf16"`` wraps the
policy's forward in), under accelerate's wrapper itself, and with bf16 weights.

    python3 benchmarks/sampling_precision.py                       # on a GPU: the async benchmark's Llama
    .venv/bin/python benchmarks/sampling_precision.py --quick     # tiny, any machine: a dry run

For each mode: seconds to sample 8 prompts x 4 completions of ``--tokens`` tokens (EOS masked out, so every
row runs them all; medians of ``--repeats``), seconds for one training forward and backward over the sampled
rows, and with ``--profile`` the CUDA kernels and CPU operators per decoded token (torch.profiler; slow: on an
H200 the first two modes took two minutes with it).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rloo.generation.rollout import generate_rollouts
from rloo.generation.sampling import SamplingParams
from rloo.tiny import build_char_tokenizer, build_tiny_llama


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def modes(model: torch.nn.Module, device: str) -> dict[str, tuple[torch.nn.Module, Callable[[], Any]]]:
    """Each mode's model and the context its forwards run in."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    autocast = lambda: torch.autocast(device, dtype=torch.bfloat16)  # noqa: E731
    AcceleratorState._reset_state(reset_partial_state=True)
    prepared = Accelerator(mixed_precision="bf16", cpu=device == "cpu").prepare(copy.deepcopy(model))
    return {
        "fp32": (model, contextlib.nullcontext),
        "torch.autocast bf16": (model, autocast),
        "accelerate bf16 (prepared forward)": (prepared, contextlib.nullcontext),
        "bf16 weights": (copy.deepcopy(model).to(torch.bfloat16), contextlib.nullcontext),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="hidden 64, 2 layers, 16 tokens, 1 repeat")
    parser.add_argument("--profile", action="store_true", help="count kernels and operators per token (slow)")
    parser.add_argument("--out", type=Path, default=None)
    options = parser.parse_args()
    if options.quick:
        options.hidden, options.layers, options.tokens, options.repeats = 64, 2, 16, 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = build_char_tokenizer()
    base = build_tiny_llama(len(tokenizer), hidden_size=options.hidden, num_layers=options.layers, tokenizer=tokenizer)
    base = base.to(device).eval()
    eos = tokenizer.eos_token_id
    prompts = [tokenizer(f"{a}+{a + 7}=")["input_ids"] for a in range(10, 18)]
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"{name}: Llama hidden {options.hidden}, {options.layers} layers, 8 prompts x 4 x {options.tokens} tokens")
    results = {}
    for mode, (model, context) in modes(base, device).items():
        model.eval()
        hook = model.get_output_embeddings().register_forward_hook(
            lambda m, i, out: out.index_fill(-1, torch.tensor([eos], device=out.device), -1e9)
        )

        def sample(model: torch.nn.Module = model, context: Callable[[], Any] = context) -> Any:
            with torch.no_grad(), context():
                return generate_rollouts(
                    model, prompts, list(range(8)), num_generations=4, max_new_tokens=options.tokens,
                    params=SamplingParams(), eos_token_ids=[eos], pad_token_id=tokenizer.pad_token_id,
                    sampling_seed=0,
                )  # fmt: skip

        rollout = sample()  # warm-up
        seconds = []
        for _ in range(options.repeats):
            synchronize()
            began = time.perf_counter()
            sample()
            synchronize()
            seconds.append(time.perf_counter() - began)
        kernels = ops = float("nan")
        if options.profile:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if device == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=activities) as profile:
                sample()
                synchronize()
            kernels = sum(1 for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA)
            ops = sum(1 for e in profile.events() if e.device_type == torch.autograd.DeviceType.CPU)
        hook.remove()
        ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
        model.train()
        train = []
        for _ in range(options.repeats + 1):
            synchronize()
            began = time.perf_counter()
            with context():
                logits = model(input_ids=ids, use_cache=False).logits
            torch.log_softmax(logits.float(), -1).mean().backward()
            synchronize()
            train.append(time.perf_counter() - began)
            model.zero_grad(set_to_none=True)
        results[mode] = {
            "sample_seconds": statistics.median(seconds),
            "kernels_per_token": kernels / options.tokens,
            "cpu_ops_per_token": ops / options.tokens,
            "train_pass_seconds": statistics.median(train[1:]),
        }
        print(mode, json.dumps({k: round(v, 4) for k, v in results[mode].items()}), flush=True)
    first = results["fp32"]
    print("\n| mode | sampling s | vs fp32 | CUDA kernels / token | CPU ops / token | train pass s | vs fp32 |")
    print("|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        print(
            f"| {mode} | {r['sample_seconds']:.2f} | {r['sample_seconds'] / first['sample_seconds']:.2f}x "
            f"| {r['kernels_per_token']:.0f} | {r['cpu_ops_per_token']:.0f} | {r['train_pass_seconds']:.3f} "
            f"| {r['train_pass_seconds'] / first['train_pass_seconds']:.2f}x |"
        )
    if options.out is not None:
        options.out.write_text(json.dumps({"device": name, "size": vars(options), "results": results}, default=str))


if __name__ == "__main__":
    main()
