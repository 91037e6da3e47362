"""A run's multi-turn settings (``tools=``, ``max_tool_calling_iterations``, ``tool_timeout``) and the
metrics of its episodes.

The tools are given to the chat template when prompts are rendered (``apply_chat_template(tools=...)``:
transformers turns each function into its JSON schema), so the model is told what it may call, as TRL
does; then :func:`rloo.tools.episodes.run_episodes` samples the episodes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rloo.data.prompts import TokenizedPrompts, encode_prompts
from rloo.tools.calling import Toolbox
from rloo.tools.environments import Environments, environment_tools, with_observation
from rloo.tools.episodes import Episode, EpisodeLimits


@dataclass(frozen=True)
class EpisodeInputs:
    """A batch's episodes before sampling: each episode's prompt (None: the K episodes of a prompt share it,
    rendered with ``AgentSettings.tools``), toolbox and environment (None without environments)."""

    prompts: list[Any] | None
    toolboxes: list[Toolbox]
    environments: list[Any] | None


@dataclass(frozen=True)
class AgentSettings:
    """What the model may call (``tools``, and each ``environments`` instance's methods) and the episode's
    limits (:class:`~rloo.tools.episodes.EpisodeLimits`)."""

    tools: tuple[Callable[..., Any], ...]
    limits: EpisodeLimits
    environments: Environments | None = None

    def reward_extras(self) -> tuple[list[Any], list[str]]:
        """What the environments add to the run's rewards: each environment class's ``get_reward``, and the
        ``environments`` argument reward functions may take (none without environments)."""
        if self.environments is None:
            return [], []
        return list(self.environments.rewards()), ["environments"]

    @classmethod
    def from_config(
        cls,
        args: Any,
        tools: Sequence[Callable[..., Any]] | None,
        environment_factory: Any = None,
        lockstep: bool = False,
    ) -> AgentSettings | None:
        """The settings of ``tools`` and ``environment_factory`` under ``args`` (an ``RLOOConfig``); None with
        neither (single-turn). ``lockstep``: the processes decode in lockstep (FSDP2), which episodes of
        different lengths do not yet."""
        if not tools and environment_factory is None:
            return None
        tools = list(tools or [])
        if lockstep:
            raise ValueError(
                "tools with FSDP2-sharded training are not built yet (the processes' episodes would need "
                "as many sampling rounds everywhere); train data-parallel (torchrun / accelerate launch without "
                "--use_fsdp) or with LoRA on one process"
            )
        Toolbox(tools)  # the names are checked now, not at the first batch
        environments = None if environment_factory is None else Environments(environment_factory)
        if environments is not None:
            for pool in environments.pool.values():
                Toolbox(tools + environment_tools(pool[0]))
        limits = EpisodeLimits(args.max_tool_calling_iterations, args.max_completion_length, args.tool_timeout)
        return cls(tuple(tools), limits, environments)

    def template_kwargs(
        self, base: dict[str, Any], tools: Sequence[Callable[..., Any]] | None = None
    ) -> dict[str, Any]:
        """The chat template's keywords with the tools (their JSON schemas, rendered in the prompt); none when
        there are none (some templates render tool boilerplate for an empty list)."""
        tools = list(self.tools if tools is None else tools)
        return {**base, "tools": tools} if tools else dict(base)

    def encode_episodes(
        self, inputs: EpisodeInputs, tokenizer: Any, max_prompt_length: int | None, base: dict[str, Any]
    ) -> TokenizedPrompts:
        """Each episode's own prompt (``inputs.prompts``), rendered with its own tools and tokenized."""
        assert inputs.prompts is not None
        ids, truncated = [], 0
        for prompt, box in zip(inputs.prompts, inputs.toolboxes, strict=True):
            one = encode_prompts([prompt], tokenizer, max_prompt_length, self.template_kwargs(base, box.functions))
            ids.extend(one.ids)
            truncated += one.num_truncated
        return TokenizedPrompts(ids, truncated)

    def episode_inputs(self, prompts: Sequence[Any], columns: dict[str, list[Any]], k: int) -> EpisodeInputs:
        """The batch's episodes (``k`` per prompt): with environments, an instance each, reset with its row, its
        observation appended to its prompt, its methods among its tools."""
        if self.environments is None:
            return EpisodeInputs(None, [Toolbox(self.tools)] * (len(prompts) * k), None)
        rows = [
            {"prompt": prompt, **{name: values[i] for name, values in columns.items()}}
            for i, prompt in enumerate(prompts)
        ]
        instances = self.environments.draw(rows, k)
        observations = self.environments.reset(instances, rows, k, self.limits.timeout)
        episode_prompts = [with_observation(prompts[i // k], seen) for i, seen in enumerate(observations)]
        toolboxes = [Toolbox([*self.tools, *environment_tools(instance)]) for instance in instances]
        return EpisodeInputs(episode_prompts, toolboxes, instances)


def resolve_tools(specs: Sequence[Any] | None) -> list[Callable[..., Any]] | None:
    """A run file's ``tools``: ``python`` (the sandboxed Python tool, :mod:`rloo.tools.python_tool`), the same
    as ``{name: python, sandbox: ..., <its limits>}``, or ``package.module:function`` strings; None for none."""
    if not specs:
        return None
    from rloo.rewards.resolve import import_callable
    from rloo.tools.python_tool import python_tool_from_spec

    tools = []
    for position, spec in enumerate(specs):
        if spec == "python" or (isinstance(spec, Mapping) and spec.get("name") == "python"):
            tools.append(python_tool_from_spec({} if spec == "python" else spec, position))
        elif isinstance(spec, str) and ":" in spec:
            tools.append(import_callable(spec, what="tool"))
        else:
            raise ValueError(
                f"`tools[{position}]`={spec!r}: give 'python' (the sandboxed Python tool), "
                "{name: python, sandbox: ..., <its limits>} or 'package.module:function'"
            )
    return tools


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
