"""Peak memory of the sampler's prefill at a real vocabulary (issue 25): 4 prompts x 1,000 tokens,
K = 2, a 2-layer Llama with Qwen's 151,936-token vocabulary, float32 on the CPU.

    .venv/bin/python benchmarks/prefill_memory.py            # both, each in a process of its own

``all-positions`` reruns the old prefill (the logits of every prompt position, ``(P, Tp, V)``);
``last-position`` is today's (``logits_to_keep=1``). Memory, not time: the numbers hold on shared cores.
"""

from __future__ import annotations

import resource
import subprocess
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rloo.generation.rollout import generate_rollouts
from rloo.generation.sampling import SamplingParams

PROMPTS, PROMPT_TOKENS, VOCAB = 4, 1000, 151_936


def measure(mode: str) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    )
    model = LlamaForCausalLM(config).eval()
    if mode == "all-positions":
        forward = model.forward
        model.forward = lambda *args, logits_to_keep=0, **kwargs: forward(*args, **kwargs)
    prompts = [[(7 * i + j) % (VOCAB - 1000) + 10 for j in range(PROMPT_TOKENS)] for i in range(PROMPTS)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    generate_rollouts(
        model,
        prompts,
        list(range(PROMPTS)),
        num_generations=2,
        max_new_tokens=4,
        params=SamplingParams(),
        eos_token_ids=[1],
        pad_token_id=0,
        generator=torch.Generator().manual_seed(0),
    )
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    logits = PROMPTS * (PROMPT_TOKENS if mode == "all-positions" else 1) * VOCAB * 4 / 2**20
    print(f"| {mode} | {grown:,.0f} MiB | {logits:,.1f} MiB |")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        measure(sys.argv[1])
    else:
        print("| prefill | peak RSS growth while sampling | prefill logits (float32) |\n|---|---|---|", flush=True)
        for mode in ("all-positions", "last-position"):
            subprocess.run([sys.executable, __file__, mode], check=True)
