"""Multi-turn episodes: the model samples a turn, its tool calls are answered, it samples the next turn.

An episode is one token sequence after the prompt: the model's turns exactly as sampled (never
re-tokenized, so what is trained is what was sampled) and, between them, the tool messages and the next
assistant header as the chat template renders them (:func:`rloo.tools.parsing.tool_suffix_ids`). The
inserted tokens are context: ``Rollout.tool_mask`` is 0 on them, 1 on the model's tokens, and every loss,
KL, entropy and per-token metric counts the model's tokens only.

The loop (TRL GRPO's ``_tool_call_loop``): all K x P first turns are sampled together; each turn that ends
with EOS and holds tool calls gets them answered (all episodes' calls at once,
:func:`rloo.tools.calling.run_tool_calls`) and the episodes that continue sample their next turns together,
each from its own prompt + episode so far. An episode ends at a turn without calls, at
``max_tool_calling_iterations`` rounds of calls, or when ``max_completion_length`` (the whole episode after
the prompt) is reached: a turn cut by it, or tool answers that would leave no room for the model's next
token (those answers are dropped, as TRL drops them), marks the episode truncated. Answers longer than
:data:`MAX_CHARS_PER_TOKEN` characters per token of room are dropped so without being tokenized (megabytes
from a tool cost nothing).

Randomness: with ``sampling_seed``, the continuation of episode ``j`` of group ``g`` in round ``r`` samples
from the stream of group ``g * K + j`` under the seed ``sampling_seed + r * 7919``: a run samples the same
episodes however the prompts are batched or spread over processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rloo.algo.masks import completion_mask_from_lengths
from rloo.generation.rollout import Rollout
from rloo.tools.calling import Toolbox, run_tool_calls
from rloo.tools.parsing import parse_turn, tool_suffix_ids

_ROUND_SEED_STRIDE = 7919
# the most characters a token of any tokenizer spans (whitespace and "=====" runs reach ~100): tool answers longer
# than this many characters per token of room cannot fit, so they are dropped untokenized (a 5 MB answer took 6 s
# to render and tokenize, only to be dropped)
MAX_CHARS_PER_TOKEN = 256


@dataclass
class Episode:
    """One episode's record: the completion as TRL's message list (assistant turns and tool messages), and
    its counts. ``cut``: the limit that ended it with calls unanswered or mid-turn, else None."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: int = 0
    tool_failures: int = 0
    malformed_calls: int = 0
    turns: int = 0
    cut: str | None = None


@dataclass(frozen=True)
class EpisodeLimits:
    """``max_iterations``: rounds of tool calls (None: no limit); ``max_tokens``: the episode after the prompt;
    ``timeout``: seconds per tool call (None: no limit)."""

    max_iterations: int | None
    max_tokens: int
    timeout: float | None


@dataclass
class _Row:
    tokens: list[int]
    logprobs: list[float]
    model: list[int]  # 1: sampled by the model, 0: inserted
    truncated: bool


def run_episodes(
    sample: Callable[..., Rollout],
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    group_ids: Sequence[int],
    *,
    num_generations: int,
    tokenizer: Any,
    toolboxes: Sequence[Toolbox],
    limits: EpisodeLimits,
    eos_token_ids: Sequence[int],
    sampling_seed: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    episode_prompt_ids: Sequence[Sequence[int]] | None = None,
    **sampler: Any,
) -> tuple[Rollout, list[Episode]]:
    """K episodes per prompt (``toolboxes``: one per episode, P*K) with ``sample``'s contract
    (:func:`rloo.generation.rollout.generate_rollouts`; ``sampler``: its other keywords); returns the
    :class:`Rollout` (with ``tool_mask``) and each episode's :class:`Episode`. ``episode_prompt_ids``: each
    episode's own prompt (P*K, an environment's observation in it), sampled from the stream of group
    ``g * K + j`` as later rounds are, instead of ``prompt_ids``."""
    k, eos = num_generations, set(eos_token_ids)
    common = {**sampler, "eos_token_ids": eos_token_ids}
    if episode_prompt_ids is None:
        first = sample(
            model,
            prompt_ids,
            group_ids,
            num_generations=k,
            max_new_tokens=limits.max_tokens,
            sampling_seed=sampling_seed,
            **common,
        )
        prompt_of = [list(prompt_ids[i // k]) for i in range(len(prompt_ids) * k)]
    else:
        streams = [g * k + j for g in group_ids for j in range(k)]
        first = sample(
            model,
            episode_prompt_ids,
            streams,
            num_generations=1,
            max_new_tokens=limits.max_tokens,
            sampling_seed=sampling_seed,
            **common,
        )
        first = dataclasses.replace(
            first, group_ids=torch.tensor(list(group_ids), device=first.group_ids.device).repeat_interleave(k)
        )
        prompt_of = [list(ids) for ids in episode_prompt_ids]
    n = first.completion_ids.shape[0]
    rows, episodes = [], [Episode() for _ in range(n)]
    for i, ids in enumerate(first.completion_id_lists()):
        logprobs = first.sampling_logprobs[i, : len(ids)].tolist()
        rows.append(_Row(list(ids), logprobs, [1] * len(ids), bool(first.truncated[i])))
    tools_of = [box.functions or None for box in toolboxes]
    calls = {i: _record_turn(tokenizer, episodes[i], rows[i].tokens, prompt_of[i], tools_of[i]) for i in range(n)}
    pending = [i for i in range(n) if calls[i] and _ended(rows[i], eos)]
    rounds = 0
    while pending:
        if limits.max_iterations is not None and rounds >= limits.max_iterations:
            for i in pending:
                episodes[i].cut = "max_tool_calling_iterations"
            break
        answers = run_tool_calls([(toolboxes[i], calls[i]) for i in pending], limits.timeout)
        going = []
        for i, answered in zip(pending, answers, strict=True):
            episode = episodes[i]
            episode.tool_calls += len(answered)
            episode.tool_failures += sum(answer.failed for answer in answered)
            messages = [answer.message for answer in answered]
            left = limits.max_tokens - len(rows[i].tokens)
            oversized = sum(len(str(m.get("content") or "")) for m in messages) > MAX_CHARS_PER_TOKEN * left
            suffix = [] if oversized else tool_suffix_ids(tokenizer, messages, chat_template_kwargs, eos)
            if oversized or len(suffix) >= left:  # no room left for a model token
                rows[i].truncated, episode.cut = True, "max_completion_length"
                continue
            episode.messages += messages
            rows[i].tokens += suffix
            rows[i].logprobs += [0.0] * len(suffix)
            rows[i].model += [0] * len(suffix)
            going.append(i)
        rounds += 1
        if not going:
            break
        room = [limits.max_tokens - len(rows[i].tokens) for i in going]
        seed = None if sampling_seed is None else sampling_seed + rounds * _ROUND_SEED_STRIDE
        groups = [group_ids[i // k] * k + i % k for i in going]
        turn = sample(
            model,
            [prompt_of[i] + rows[i].tokens for i in going],
            groups,
            num_generations=1,
            max_new_tokens=max(room),
            sampling_seed=seed,
            **common,
        )
        for j, (i, ids) in enumerate(zip(going, turn.completion_id_lists(), strict=True)):
            before = prompt_of[i] + rows[i].tokens
            kept = list(ids[: room[j]])
            rows[i].truncated = bool(turn.truncated[j]) or len(ids) > room[j]
            rows[i].tokens += kept
            rows[i].logprobs += turn.sampling_logprobs[j, : len(kept)].tolist()
            rows[i].model += [1] * len(kept)
            calls[i] = _record_turn(tokenizer, episodes[i], kept, before, tools_of[i])
            if rows[i].truncated:
                episodes[i].cut = "max_completion_length"
        pending = [i for i in going if calls[i] and _ended(rows[i], eos)]
    return _as_rollout(first, rows, sampler["pad_token_id"]), episodes


def _ended(row: _Row, eos: set[int]) -> bool:
    """The model's last turn ended with EOS (not cut by a limit or a stop string)."""
    return not row.truncated and bool(row.tokens) and row.tokens[-1] in eos


def _record_turn(
    tokenizer: Any, episode: Episode, ids: list[int], prefix: list[int], tools: list[Any] | None
) -> list[dict[str, Any]]:
    """Parse a model turn into ``episode`` (its message, counts); returns the turn's tool calls."""
    parsed = parse_turn(tokenizer, ids, prefix, tools)
    episode.messages.append(parsed.message)
    episode.turns += 1
    episode.malformed_calls += parsed.malformed
    return parsed.calls


def _as_rollout(first: Rollout, rows: list[_Row], pad_token_id: int) -> Rollout:
    """The episodes as one :class:`Rollout`: the first turn's prompts, the episodes right-padded, attention
    over every episode token, ``tool_mask`` over the model's."""
    device = first.completion_ids.device
    width = max(1, max(len(row.tokens) for row in rows))
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    logprobs = torch.zeros((len(rows), width))
    tool_mask = torch.zeros((len(rows), width))
    for i, row in enumerate(rows):
        length = len(row.tokens)
        ids[i, :length] = torch.tensor(row.tokens, dtype=torch.long)
        logprobs[i, :length] = torch.tensor(row.logprobs)
        tool_mask[i, :length] = torch.tensor(row.model, dtype=torch.float32)
    mask = completion_mask_from_lengths(torch.tensor([len(row.tokens) for row in rows]), width)
    return Rollout(
        prompt_ids=first.prompt_ids,
        prompt_mask=first.prompt_mask,
        completion_ids=ids.to(device),
        completion_mask=mask.to(device),
        truncated=torch.tensor([row.truncated for row in rows], device=device),
        sampling_logprobs=(logprobs * mask).to(device),
        group_ids=first.group_ids,
        vision=first.vision,
        tool_mask=tool_mask.to(device),
    )
