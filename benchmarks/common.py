"""Shared pieces of the rloo-vs-TRL benchmark: identical inputs for both implementations.

Imported by the child runners in *both* virtual environments (ours and TRL's), so it uses
only the standard library, torch, tokenizers and transformers.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MODEL_SIZES: dict[str, dict[str, int]] = {
    # ~0.5M parameters
    "tiny": {"hidden_size": 64, "num_layers": 4, "num_heads": 4, "intermediate_size": 128, "vocab_size": 4096},
    # ~36M parameters (hidden 512, 8 layers, a 32k vocabulary)
    "small": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "intermediate_size": 1024, "vocab_size": 32000},
}


@dataclass(frozen=True)
class BenchCase:
    """One configuration: P prompts x K completions of up to T new tokens, on one model."""

    model: str
    num_prompts: int
    num_generations: int
    max_completion_length: int
    steps: int = 4
    seed: int = 0

    @property
    def name(self) -> str:
        return f"{self.model} {self.num_prompts}x{self.num_generations} T={self.max_completion_length}"


def prompts(n: int) -> list[dict[str, Any]]:
    """Deterministic arithmetic prompts with an answer column."""
    return [
        {"prompt": f"{a}+{b}=", "answer": str(a + b)}
        for a, b in ((i * 7 % 90 + 10, i * 13 % 90 + 10) for i in range(n))
    ]


def reward_sevens(completions: list[str], **kwargs: Any) -> list[float]:
    """The benchmark reward: share of characters that are '7' (cheap, identical for both)."""
    return [c.count("7") / max(len(c), 1) for c in completions]


def peak_rss_mib() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass
class StepRecord:
    seconds: float
    generate: float
    score: float
    logprobs: float
    train: float
    completion_tokens: int
    prompt_tokens: int


def write_result(
    path: str | os.PathLike[str], case: BenchCase, impl: str, steps: list[StepRecord], params: int
) -> None:
    Path(path).write_text(
        json.dumps(
            {
                "impl": impl,
                "case": asdict(case),
                "steps": [asdict(s) for s in steps],
                "peak_rss_mib": peak_rss_mib(),
                "parameters": params,
                "time": time.time(),
            }
        )
    )
