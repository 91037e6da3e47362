"""``rloo eval``: mean reward and accuracy of a model, greedy and sampled (pass@K).

Completions are generated and scored by :func:`rloo.pipeline.generate_and_score`, the same
pipeline training uses, with the same reward weights: a run file given with ``--run-file``
reports the rewards ``rloo train`` logged for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from rloo.generation.sampling import SamplingParams
from rloo.pipeline import RolloutSettings, generate_and_score
from rloo.rewards.calling import RewardFunctions


@dataclass(frozen=True)
class EvalSettings:
    """K samples per prompt (``num_generations``), their length limit and temperature; a
    completion is correct when its combined reward is at least ``success_threshold``."""

    num_generations: int = 4
    max_completion_length: int = 256
    temperature: float = 1.0
    success_threshold: float = 1.0
    batch_size: int = 64
    seed: int = 0
    max_prompt_length: int | None = None

    def __post_init__(self) -> None:
        checks = [
            ("--num-generations", self.num_generations, self.num_generations >= 1, ">= 1"),
            ("--max-completion-length", self.max_completion_length, self.max_completion_length >= 1, ">= 1"),
            ("--batch-size", self.batch_size, self.batch_size >= 1, ">= 1 (prompts generated at once)"),
            ("--success-threshold", self.success_threshold, math.isfinite(self.success_threshold), "a finite number"),
            (
                "--temperature",
                self.temperature,
                math.isfinite(self.temperature) and self.temperature >= 0,
                "finite and >= 0 (0 is greedy)",
            ),
        ]
        for option, value, ok, rule in checks:
            if not ok:
                raise ValueError(f"{option}={value} is invalid: it must be {rule}")


def evaluate_model(model: str, data: Any, rewards: RewardFunctions, settings: EvalSettings) -> dict[str, Any]:
    """Load a model (folder, checkpoint or hub id) and score its completions on ``data``.

    The combined reward is the weighted sum over the reward functions that apply (NaN where
    none does), as in training; pass@K is the share of prompts with at least one correct
    completion among ``num_generations``.
    """
    from rloo.data.prompts import gather_columns
    from rloo.training.setup.models import load_policy, load_processing_class

    policy: Any = load_policy(model, None)
    policy.to("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_processing_class(model, None, policy, [data])  # a processor for prompts with images
    rewards.to(policy.device)
    generator = torch.Generator(device=policy.device).manual_seed(settings.seed)
    greedy_settings = RolloutSettings(
        1, settings.max_completion_length, SamplingParams(top_k=1), settings.max_prompt_length
    )
    sampled_settings = RolloutSettings(
        settings.num_generations,
        settings.max_completion_length,
        SamplingParams(settings.temperature),
        settings.max_prompt_length,
    )
    greedy: list[torch.Tensor] = []
    sampled: list[torch.Tensor] = []
    with torch.no_grad():
        for start in range(0, len(data), settings.batch_size):
            indices = list(range(start, min(start + settings.batch_size, len(data))))
            prompts, columns = [data[i]["prompt"] for i in indices], gather_columns(data, indices)
            for out, rollout_settings in ((greedy, greedy_settings), (sampled, sampled_settings)):
                scored = generate_and_score(
                    policy, tokenizer, prompts, columns, rewards, rollout_settings, generator=generator
                )
                out.append(scored.rewards.rewards_or_nan().cpu())
    g, s = torch.cat(greedy), torch.cat(sampled).view(-1, settings.num_generations)
    ok = settings.success_threshold
    return {
        "model": model,
        "num_prompts": len(data),
        "num_generations": settings.num_generations,
        "reward_functions": rewards.names,
        "reward_weights": rewards.weights.tolist(),
        "greedy_mean_reward": _nanmean(g),
        "greedy_accuracy": float((g >= ok).float().mean()),
        "sampled_mean_reward": _nanmean(s),
        "sampled_accuracy": float((s >= ok).float().mean()),
        "pass_at_k": float((s >= ok).any(dim=1).float().mean()),
    }


def _nanmean(values: torch.Tensor) -> float:
    return float(values.nanmean()) if (~values.isnan()).any() else float("nan")
