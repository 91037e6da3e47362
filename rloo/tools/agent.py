"""A run's multi-turn settings (``tools=``, ``max_tool_calling_iterations``, ``tool_timeout``) and the
metrics of its episodes.

The tools are given to the chat template when prompts are rendered (``apply_chat_template(tools=...)``:
transformers turns each function into its JSON schema), so the model is told what it may call, as TRL
does; then :func:`rloo.tools.episodes.run_episodes` samples the episodes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rloo.tools.calling import Toolbox
from rloo.tools.episodes import Episode, EpisodeLimits


@dataclass(frozen=True)
class AgentSettings:
    """What the model may call and the episode's limits (:class:`~rloo.tools.episodes.EpisodeLimits`)."""

    tools: tuple[Callable[..., Any], ...]
    limits: EpisodeLimits

    @classmethod
    def from_config(
        cls, args: Any, tools: Sequence[Callable[..., Any]] | None, lockstep: bool = False
    ) -> AgentSettings | None:
        """The settings of ``tools`` under ``args`` (an ``RLOOConfig``); None without tools (single-turn).
        ``lockstep``: the processes decode in lockstep (FSDP2), which episodes of different lengths do not yet."""
        if not tools:
            return None
        if lockstep:
            raise ValueError(
                "tools with FSDP2-sharded training are not built yet (the processes' episodes would need "
                "as many sampling rounds everywhere); train data-parallel (torchrun / accelerate launch without "
                "--use_fsdp) or with LoRA on one process"
            )
        Toolbox(tools)  # the names are checked now, not at the first batch
        limits = EpisodeLimits(args.max_tool_calling_iterations, args.max_completion_length, args.tool_timeout)
        return cls(tuple(tools), limits)

    def template_kwargs(self, base: dict[str, Any]) -> dict[str, Any]:
        """The chat template's keywords with the tools (their JSON schemas, rendered in the prompt)."""
        return {**base, "tools": list(self.tools)}

    def toolboxes(self, n: int) -> list[Toolbox]:
        """One toolbox per episode."""
        box = Toolbox(self.tools)
        return [box] * n


def episode_counts(episodes: Sequence[Episode], model_tokens: float, episode_tokens: float) -> list[float]:
    """One process's sums, to add over processes: episodes, tool calls, failed calls, malformed calls, turns,
    episodes cut by a limit, the model's tokens, all episode tokens."""
    return [
        float(len(episodes)),
        float(sum(e.tool_calls for e in episodes)),
        float(sum(e.tool_failures for e in episodes)),
        float(sum(e.malformed_calls for e in episodes)),
        float(sum(e.turns for e in episodes)),
        float(sum(e.cut is not None for e in episodes)),
        model_tokens,
        episode_tokens,
    ]


def tool_metrics(counts: Sequence[float]) -> dict[str, float]:
    """The batch's tool metrics from :func:`episode_counts` summed over processes: TRL's
    ``tools/call_frequency`` (calls per episode) and ``tools/failure_frequency`` (failed calls per call), and
    rloo's turns per episode, malformed calls per episode, the share of episode tokens inserted (tool
    results, headers) and the share of episodes cut by a limit."""
    episodes, calls, failures, malformed, turns, cut, model, total = counts
    per_episode = max(episodes, 1.0)
    return {
        "tools/call_frequency": calls / per_episode,
        "tools/failure_frequency": failures / calls if calls else 0.0,
        "tools/malformed_call_frequency": malformed / per_episode,
        "tools/turns_mean": turns / per_episode,
        "tools/inserted_token_frac": (total - model) / total if total else 0.0,
        "tools/cut_frac": cut / per_episode,
    }
