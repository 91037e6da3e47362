"""Shared pieces of the rloo-vs-TRL benchmark: identical inputs for both implementations.

Imported by the child runners in *every* virtual environment (ours and TRL's), so it uses
only the standard library, torch, tokenizers and transformers.

FLOPs are counted, not estimated: :class:`FlopCounter` hooks the backbone (``model.base_model``)
and the LM head of every model a run holds (policy and reference) and adds ``2 x parameters`` per
token each forward runs, padding and finished rows included (attention scores excluded: a
matmul-parameter count). A forward with gradient adds 3x (forward + input and weight gradients);
a head chunk recomputed in the backward (checkpointed, as both rloo and TRL 1.16 do) adds 1x more.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

MODEL_SIZES: dict[str, dict[str, int]] = {
    # ~0.5M parameters
    "tiny": {"hidden_size": 64, "num_layers": 4, "num_heads": 4, "intermediate_size": 128, "vocab_size": 4096},
    # ~36M parameters (hidden 512, 8 layers, a 32k vocabulary)
    "small": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "intermediate_size": 1024, "vocab_size": 32000},
}


@dataclass(frozen=True)
class BenchCase:
    """One configuration: P prompts x K completions of up to T new tokens, on one model folder.

    ``model``: a folder name (``small``, or ``small-varied``: the same weights arranged to end
    completions at varied lengths); ``prompt_chars``: 0 for the short arithmetic prompts, else
    few-shot prompts of exactly that many characters (tokens: the tokenizer is per character).
    """

    model: str
    num_prompts: int
    num_generations: int
    max_completion_length: int
    steps: int = 4
    seed: int = 0
    prompt_chars: int = 0
    kind: str = "fixed"

    @property
    def name(self) -> str:
        prompt = f" prompt={self.prompt_chars}" if self.prompt_chars else ""
        return f"{self.model} {self.num_prompts}x{self.num_generations} T={self.max_completion_length}{prompt}"


def prompts(n: int, chars: int = 0) -> list[dict[str, Any]]:
    """Deterministic arithmetic prompts with an answer column; ``chars`` > 0: each is preceded by
    solved examples (a few-shot prompt) so that every prompt is exactly ``chars`` characters."""
    rows = []
    for i in range(n):
        a, b = i * 7 % 90 + 10, i * 13 % 90 + 10
        question = f"{a}+{b}="
        if chars:
            shots, j = "", i
            while len(shots) < chars - len(question):
                x, y = j * 11 % 90 + 10, j * 17 % 90 + 10
                shots += f"{x}+{y}={x + y}\n"
                j += 1
            question = shots[len(shots) - (chars - len(question)) :] + question
        rows.append({"prompt": question, "answer": str(a + b)})
    return rows


def reward_sevens(completions: list[str], **kwargs: Any) -> list[float]:
    """The benchmark reward: share of characters that are '7' (cheap, identical for both)."""
    return [c.count("7") / max(len(c), 1) for c in completions]


def peak_rss_mib() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib() -> float:
    """Resident memory of this process now."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


def _in_backward() -> bool:
    return bool(torch._C._current_graph_task_id() >= 0)


class FlopCounter:
    """Matmul FLOPs of every forward (and its backward) through the hooked models (module docstring)."""

    def __init__(self) -> None:
        self.flops = 0.0
        self._hooked: set[int] = set()

    def add(self, tokens: int, params: int, grad: bool) -> None:
        if _in_backward():  # a checkpointed chunk recomputed in the backward: one more forward
            self.flops += 2.0 * params * tokens
        else:
            self.flops += 2.0 * params * tokens * (3 if grad else 1)

    def attach(self, model: torch.nn.Module) -> None:
        """Count ``model``'s backbone tokens and head rows (once per model)."""
        if model is None or id(model) in self._hooked:
            return
        self._hooked.add(id(model))
        head = model.get_output_embeddings()
        head_params = head.weight.numel()
        body = model.base_model
        body_params = sum(p.numel() for p in body.parameters()) - model.get_input_embeddings().weight.numel()
        body.register_forward_pre_hook(self._body_hook(body_params), with_kwargs=True)
        head.register_forward_hook(lambda m, i, out: self.add(out.numel() // out.shape[-1], head_params, _grad(i)))

    def _body_hook(self, params: int) -> Any:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None:
                ids = kwargs["inputs_embeds"]
            self.add(int(ids.shape[0] * ids.shape[1]), params, torch.is_grad_enabled())

        return hook


def _grad(inputs: tuple[Any, ...]) -> bool:
    return torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in inputs)


@dataclass
class StepRecord:
    seconds: float
    generate: float
    score: float
    logprobs: float
    train: float
    completion_tokens: int
    prompt_tokens: int
    flops: float = 0.0
    mean_length: float = 0.0
    clipped_ratio: float = 0.0


@dataclass
class RunInfo:
    """What a child reports besides its steps."""

    parameters: int
    head_parameters: int
    body_parameters: int
    prompt_length: int
    rss_at_start_mib: float
    extra: dict[str, Any] = field(default_factory=dict)


def model_sizes(model: torch.nn.Module) -> tuple[int, int, int]:
    """``(all, head, backbone without the input embedding)`` parameter counts."""
    total = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings().weight.numel()
    body = sum(p.numel() for p in model.base_model.parameters()) - model.get_input_embeddings().weight.numel()
    return total, head, body


def write_result(
    path: str | os.PathLike[str], case: BenchCase, impl: str, steps: list[StepRecord], info: RunInfo
) -> None:
    Path(path).write_text(
        json.dumps(
            {
                "impl": impl,
                "case": asdict(case),
                "steps": [asdict(s) for s in steps],
                "peak_rss_mib": peak_rss_mib(),
                "parameters": info.parameters,
                "info": asdict(info),
                "time": time.time(),
            }
        )
    )
