"""The memory plan (``rloo plan``) against measured peaks, phase by phase (issue 25).

    .venv/bin/python benchmarks/memory_plan.py            # the CPU table of BENCHMARKS.md (about 1 min)

Each case trains 2 steps of a random-init 2-layer Llama (float32, on the CPU) and measures the peak of
each phase (``benchmarks/memory_measure.py``: live tensor bytes on the CPU, ``max_memory_allocated`` on a
GPU), then compares it with :func:`rloo.training.setup.memory_plan.plan_memory` for the same config.
Memory, not time: the numbers hold on shared cores. ``benchmarks/gpu_checks.py`` runs the GPU cases.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_measure import measure_step
from transformers import LlamaConfig

from rloo import RLOOConfig
from rloo.training.setup.memory_plan import ModelShape, Workload, plan_memory

MiB = 2**20


@dataclass
class Case:
    name: str
    model: Any  # a transformers config
    prompt_length: int
    config: dict[str, Any] = field(default_factory=dict)
    lora_rank: int | None = None

    def lora(self) -> Any:
        if self.lora_rank is None:
            return None
        from peft import LoraConfig

        return LoraConfig(r=self.lora_rank, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def llama(vocab: int = 32000, hidden: int = 64, intermediate: int = 128) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    )


BASE = {"num_generations": 4, "per_device_train_batch_size": 8, "max_completion_length": 64}
CPU_CASES = [
    Case("small (32k vocabulary, 256-token prompts)", llama(), 256, BASE),
    Case("151,936-token vocabulary, 1,000-token prompts", llama(151_936), 1000, BASE),
    Case("2,000-token prompts", llama(8000, 256, 512), 2000, BASE),
    Case("LoRA r=8 (q, v)", llama(32000, 256, 512), 500, BASE, lora_rank=8),
    Case("K = 16", llama(32000, 128, 256), 256, {**BASE, "num_generations": 16, "per_device_train_batch_size": 16}),
    Case("gradient checkpointing", llama(8000, 256, 512), 1000, {**BASE, "gradient_checkpointing": True}),
    Case(
        "max_logits_memory_mb 16, 4 micro-batches",
        llama(151_936),
        1000,
        {**BASE, "max_logits_memory_mb": 16, "steps_per_generation": 4},
    ),
]


def predict(case: Case, shards: int = 1) -> Any:
    with tempfile.TemporaryDirectory() as out:
        args = RLOOConfig(output_dir=out, **{k: v for k, v in case.config.items() if not k.startswith("_")})
        work = Workload.from_config(args, case.prompt_length, case.lora(), shards)
    return plan_memory(ModelShape.from_config(case.model), work)


def compare(cases: list[Case], device: str = "cpu") -> list[str]:
    """Markdown rows: per case, each phase's predicted / measured MiB and the step's peak ratio."""
    rows = [
        "| case | sampling | log-probs | training | step peak: predicted | measured | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        plan = predict(case)
        measured = measure_step(case.model, case.config, case.prompt_length, case.lora(), device=device)
        cells = []
        for name in ("sampling", "log-probs", "training"):
            predicted = plan.phase(name).total
            if name == "training":  # the measured phase holds the optimizer step too
                predicted = max(predicted, plan.phase("optimizer step").total)
            cells.append(f"{predicted / MiB:,.0f} / {measured.phases[name] / MiB:,.0f}")
        ratio = plan.peak.total / measured.peak
        rows.append(
            f"| {case.name} | {' | '.join(cells)} | {plan.peak.total / MiB:,.0f} MiB | "
            f"{measured.peak / MiB:,.0f} MiB | {ratio:.2f} |"
        )
        print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    print("phases: predicted / measured MiB", flush=True)
    print("\n".join(compare(CPU_CASES)[:2]))
