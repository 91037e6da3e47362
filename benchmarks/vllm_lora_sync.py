"""A LoRA policy's weight sync to ``rloo vllm-serve``: its adapter alone (``--enable_lora true``) against its
merged weights, on one server, alternating (issue 39).

    .venv/bin/python benchmarks/vllm_lora_sync.py --json benchmarks/vllm-lora-sync.json

A random Llama (``--hidden-size``, ``--layers``, a ``--vocab``-token vocabulary) with a rank-``--rank`` LoRA
on every attention and MLP projection; each sync is timed from the trainer's side, from building the body to
the server's answer (the adapter: written to disk and loaded as a vLLM LoRA adapter; the merged weights:
peft's merge, then vLLM's in-place reload). Needs ``.venv-vllm`` (``make vllm``). Seconds depend on the
machine; the bytes do not.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    """A port of 127.0.0.1 no one listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from rloo.generation.vllm.client import VLLMClient, serving
    from rloo.generation.vllm.sampler import vllm_adapter, vllm_state_dict
    from rloo.tiny import save_tiny_model

    folder = Path(tempfile.mkdtemp(prefix="rloo-lora-sync-")) / "model"
    heads = max(2, args.hidden_size // 64)  # head size 64 (vLLM's CPU attention takes 32 and up)
    save_tiny_model(
        folder, vocab_size=args.vocab, hidden_size=args.hidden_size, num_layers=args.layers, num_heads=heads
    )
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    policy = get_peft_model(base, LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=targets))
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.01)
    flags = ("--dtype", "float32", "--max_model_len", "256", "--log_level", "warning")
    times: dict[str, list[float]] = {"adapter": [], "merged": []}
    sizes: dict[str, int] = {}
    with serving(folder, *flags, "--enable_lora", "true", "--max_lora_rank", str(args.rank), port=free_port()) as url:
        client = VLLMClient(url, timeout=600)
        rank = client.max_lora_rank()
        for _ in range(args.repeats):
            began = time.perf_counter()
            adapter = vllm_adapter(policy, rank)
            assert adapter is not None, "the server should take this adapter"
            client.load_adapter(*adapter)
            times["adapter"].append(time.perf_counter() - began)
            sizes["adapter"] = sum(t.numel() * t.element_size() for t in adapter[0].values())
            began = time.perf_counter()
            merged = vllm_state_dict(policy)
            client.update_weights(merged.items())
            times["merged"].append(time.perf_counter() - began)
            sizes["merged"] = sum(t.numel() * t.element_size() for t in merged.values())
    result: dict[str, Any] = {
        "model": {"hidden_size": args.hidden_size, "layers": args.layers, "vocab": args.vocab, "rank": args.rank},
        "parameters": sum(p.numel() for name, p in policy.named_parameters() if "lora_" not in name),
        "bytes": sizes,
        "seconds": times,
        "median_seconds": {key: statistics.median(value) for key, value in times.items()},
    }
    med = result["median_seconds"]
    print(
        f"adapter: {sizes['adapter'] / 2**20:.1f} MiB, {med['adapter']:.2f} s a sync; merged: "
        f"{sizes['merged'] / 2**20:.1f} MiB, {med['merged']:.2f} s; adapter / merged: bytes "
        f"{sizes['adapter'] / sizes['merged']:.3f}, seconds {med['adapter'] / med['merged']:.2f}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
