"""``rloo eval``: mean reward and accuracy of a model, greedy and sampled (pass@K)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rloo.data.loading import encode_prompts, gather_columns, is_conversational
from rloo.generation.rollout import Rollout, generate_rollouts
from rloo.generation.sampling import SamplingParams
from rloo.rewards.calling import as_completions, compute_rewards, load_reward_funcs, reward_func_names


@dataclass(frozen=True)
class EvalSettings:
    num_samples: int = 4
    max_completion_length: int = 256
    temperature: float = 1.0
    success_threshold: float = 1.0
    batch_size: int = 64
    seed: int = 0


def evaluate_model(
    model: str,
    dataset: str,
    rewards: list[str],
    settings: EvalSettings,
    *,
    split: str = "test",
    columns: dict[str, str] | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """Load a model (folder, checkpoint or hub id) and a dataset, and score its completions.

    A completion is *correct* when its combined reward (sum over reward functions, None
    ignored) is at least ``success_threshold``; pass@K is the share of prompts with at least
    one correct completion among ``num_samples``.
    """
    from rloo.cli.run_file import DatasetSpec
    from rloo.rewards.builtins import resolve_reward
    from rloo.training.models import load_policy, load_tokenizer

    if settings.num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {settings.num_samples}")
    data = DatasetSpec(path=dataset, split=split, columns=columns, limit=limit).load()
    policy: Any = load_policy(model, None)
    policy.eval()
    policy.to("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer(model, None)
    funcs = load_reward_funcs([resolve_reward(r) for r in rewards])
    scorer = _Scorer(policy, tokenizer, funcs, settings)
    greedy, sampled = [], []
    for start in range(0, len(data), settings.batch_size):
        indices = list(range(start, min(start + settings.batch_size, len(data))))
        greedy.append(scorer.score(data, indices, 1, SamplingParams(top_k=1)))
        sampled.append(scorer.score(data, indices, settings.num_samples, SamplingParams(settings.temperature)))
    g, s = torch.cat(greedy), torch.cat(sampled).view(-1, settings.num_samples)
    ok = settings.success_threshold
    return {
        "model": model,
        "dataset": dataset,
        "num_prompts": len(data),
        "num_samples": settings.num_samples,
        "greedy_mean_reward": _nanmean(g),
        "greedy_accuracy": float((g >= ok).float().mean()),
        "sampled_mean_reward": _nanmean(s),
        "sampled_accuracy": float((s >= ok).float().mean()),
        "pass_at_k": float((s >= ok).any(dim=1).float().mean()),
    }


def _nanmean(values: torch.Tensor) -> float:
    return float(values.nanmean()) if (~values.isnan()).any() else float("nan")


class _Scorer:
    def __init__(self, model: Any, tokenizer: Any, funcs: list[Any], settings: EvalSettings) -> None:
        self.model, self.tokenizer, self.funcs, self.settings = model, tokenizer, funcs, settings
        self.names = reward_func_names(funcs)
        self.generator = torch.Generator(device=next(model.parameters()).device).manual_seed(settings.seed)

    @torch.no_grad()
    def score(self, data: Any, indices: list[int], k: int, params: SamplingParams) -> torch.Tensor:
        """Combined reward of K completions per prompt, NaN where no function applies: ``(P*K,)``."""
        prompts = [data[i]["prompt"] for i in indices]
        ids = encode_prompts(prompts, self.tokenizer, None).ids
        rollout: Rollout = generate_rollouts(
            self.model,
            ids,
            list(range(len(indices))),
            num_generations=k,
            max_new_tokens=self.settings.max_completion_length,
            params=params,
            eos_token_ids=[self.tokenizer.eos_token_id],
            pad_token_id=self.tokenizer.pad_token_id,
            generator=self.generator,
        )
        texts = self.tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
        completions = as_completions(texts, is_conversational(prompts[0]))
        scores = compute_rewards(
            self.funcs,
            prompts=[p for p in prompts for _ in range(k)],
            completions=completions,
            completion_ids=rollout.completion_id_lists(),
            columns=gather_columns(data, indices, k),
            names=self.names,
        ).values
        combined = torch.where(torch.isnan(scores), 0.0, scores).sum(dim=1)
        return torch.where(torch.isnan(scores).all(dim=1), torch.nan, combined)
