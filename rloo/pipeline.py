"""Prompts -> K scored completions each: the one generate -> score pipeline.

Training (phases 1-2 of every step), ``RLOOTrainer.evaluate``, ``rloo eval`` and the demo's
evaluation all call :func:`generate_and_score`, so one set of prompts, model, sampling
settings, reward functions and weights gives the same rewards in all four.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from rloo.algo.advantages import clip_rewards, normalize_then_sum
from rloo.data.images import encode_image_prompts, image_column, is_processor, row_images
from rloo.data.prompts import TokenizedPrompts, encode_prompts, is_conversational, repeat_per_completion
from rloo.generation.device import model_device
from rloo.generation.engines import build_engine
from rloo.generation.graph_decode import rollout_sampler
from rloo.generation.multimodal import VisionInputs
from rloo.generation.rollout import Rollout, SamplingEngine, generate_rollouts, pad_to_multiple
from rloo.generation.sampling import SamplingParams
from rloo.generation.stopping import StopStrings
from rloo.rewards.calling import CombinedRewards, RewardFunctions, as_completions
from rloo.tools.agent import AgentSettings
from rloo.tools.episodes import Episode, run_episodes
from rloo.tools.rollout_func import custom_rollout
from rloo.waiting import waiting_for


def _id_list(value: Any, where: str) -> list[int]:
    ids = [] if value is None else [value] if isinstance(value, int) else list(value)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"{where} must be an int or a list of ints, got {value!r}")
    return ids


def eos_token_ids(tokenizer: Any, model: Any = None, extra: Sequence[int] = ()) -> list[int]:
    """The ids that end a completion: the tokenizer's ``eos_token_id`` (an int or a list), then
    those of the model's ``generation_config`` (chat models list their end-of-turn token there,
    and TRL 1.14+ stops at them too) and ``extra`` (``generation_kwargs["eos_token_id"]``), in order.

    Raises ``ValueError`` when the tokenizer has none (completions could never end).
    """
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token: set tokenizer.eos_token so completions can end")
    ids = _id_list(tokenizer.eos_token_id, "the tokenizer's eos_token_id")
    if not ids:
        raise ValueError("the tokenizer's eos_token_id is an empty list: set tokenizer.eos_token")
    generation_config = getattr(model, "generation_config", None)
    ids += _id_list(getattr(generation_config, "eos_token_id", None), "the model's generation_config.eos_token_id")
    ids += list(extra)
    return list(dict.fromkeys(ids))


@dataclass(frozen=True)
class RolloutSettings:
    """How completions are sampled: K per prompt, at most ``max_completion_length`` tokens,
    prompts cut from the left to ``max_prompt_length`` (None: never)."""

    num_generations: int
    max_completion_length: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_prompt_length: int | None = None
    stop_strings: tuple[str, ...] = ()  # a completion ends once its text contains one
    extra_eos_token_ids: tuple[int, ...] = ()  # besides the tokenizer's and generation_config's
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # e.g. enable_thinking=False
    pad_to_multiple_of: int | None = None  # token tensors padded to a multiple of it (masked)
    compact_at: float | None = None  # sampler_compaction: finished rows leave the decode batch
    static_decode: bool | None = None  # sampler_cuda_graphs: the static-shape step (rloo.generation.graph_decode)
    engine: SamplingEngine | None = None  # another sampling engine (rloo.generation.engines), or None: rloo's own
    agent: AgentSettings | None = None  # multi-turn episodes with tools (rloo.tools), or None: one turn
    custom: Callable[[list[Any]], Any] | None = None  # rollout_func bound to the trainer: the user samples

    @classmethod
    def from_config(
        cls,
        args: Any,
        num_generations: int | None = None,
        agent: AgentSettings | None = None,
        custom: Callable[[list[Any]], Any] | None = None,
    ) -> RolloutSettings:
        """The settings an ``RLOOConfig`` gives (``num_generations``: another K, e.g. for evaluation;
        ``agent``: the run's tools; ``custom``: its rollout_func)."""
        sampling = SamplingParams.from_config(args)
        return cls(
            num_generations or args.num_generations,
            args.max_completion_length,
            sampling,
            args.max_prompt_length,
            stop_strings=args.stop_strings,
            extra_eos_token_ids=args.extra_eos_token_ids,
            chat_template_kwargs=dict(args.chat_template_kwargs or {}),
            pad_to_multiple_of=args.pad_to_multiple_of,
            compact_at=args.sampler_compaction,
            static_decode=args.sampler_cuda_graphs,
            engine=build_engine(args),
            agent=agent,
            custom=custom,
        )


@dataclass(frozen=True)
class ScoredRollout:
    """P prompts x K completions, decoded and scored (N = P*K rows, a prompt's K consecutive).

    prompts: the P raw dataset prompts; completion_texts: N decoded completions; rewards:
    per-function scores, the weighted combination and the scorable mask, all ``(N, ...)``;
    num_truncated_prompts: prompts cut to ``max_prompt_length``; policy_version: the optimizer
    steps the sampling policy had taken (stamped by :mod:`rloo.training.rollouts.source`; None
    for rollouts no training step uses, e.g. evaluation's).
    """

    rollout: Rollout
    prompts: list[Any]
    completion_texts: list[str]
    rewards: CombinedRewards
    num_truncated_prompts: int
    generate_seconds: float
    score_seconds: float
    policy_version: int | None = None
    images: list[list[Any]] | None = None  # each prompt's images (an image column), else None
    episodes: list[Episode] | None = None  # multi-turn rollouts: each completion's episode record
    # dynamic sampling (rloo.training.rollouts.dynamic_sampling): the metrics of its generation rounds, and the
    # prompt and completion tokens this process generated in them (None: the rollout's own)
    sampling_metrics: dict[str, float] = field(default_factory=dict)
    generated_tokens: int | None = None

    def reward_completions(self) -> list[Any]:
        """The N completions as reward functions received them (:func:`completions_for_rewards`)."""
        return completions_for_rewards(self.completion_texts, self.prompts, self.episodes)


def task_rewards(scored: ScoredRollout, args: Any, reward_weights: Tensor) -> Tensor:
    """``(N,)`` the rewards the baseline sees before any KL penalty: the reward functions' weighted sum
    (``multi_objective_aggregation="normalize_then_sum"``: GDPO's, each function normalized within its
    group first), clipped to ``reward_clip_range``; ``reward_weights``: ``(F,)``."""
    combined = scored.rewards.rewards
    if args.multi_objective_aggregation == "normalize_then_sum":
        scores = scored.rewards.scores.values.to(combined)
        combined = normalize_then_sum(scores, reward_weights.to(combined), scored.rollout.group_ids)
    return clip_rewards(combined, args.reward_clip_range)


def completions_for_rewards(texts: list[str], prompts: Sequence[Any], episodes: list[Episode] | None) -> list[Any]:
    """What reward functions (and ``compute_metrics``) receive as ``completions``: the decoded texts, one
    assistant message each for conversational ``prompts`` (as TRL), or each multi-turn episode's messages."""
    if episodes is not None:
        return [episode.messages for episode in episodes]
    return as_completions(texts, is_conversational(prompts[0]))


def encode_batch(
    processing_class: Any, prompts: Sequence[Any], columns: Mapping[str, Sequence[Any]], settings: RolloutSettings
) -> tuple[TokenizedPrompts, VisionInputs | None]:
    """Token ids of ``prompts`` and, with an ``image``/``images`` column, their image inputs (the
    processor renders and encodes them); text prompts through the tokenizer."""
    if image_column(list(columns)) is None:
        tokenizer = processing_class.tokenizer if is_processor(processing_class) else processing_class
        return encode_prompts(list(prompts), tokenizer, settings.max_prompt_length, settings.chat_template_kwargs), None
    if not is_processor(processing_class):
        raise ValueError(
            f"the prompts have an image column but the processing class is a {type(processing_class).__name__}; "
            "pass the model's processor (AutoProcessor.from_pretrained(...)) as processing_class"
        )
    images = [row_images(columns, index) for index in range(len(prompts))]
    return encode_image_prompts(
        prompts, images, processing_class, settings.max_prompt_length, settings.chat_template_kwargs
    )


def generate_and_score(
    model: nn.Module,
    tokenizer: Any,
    prompts: Sequence[Any],
    columns: dict[str, list[Any]],
    rewards: RewardFunctions,
    settings: RolloutSettings,
    *,
    group_ids: Sequence[int] | None = None,
    generator: torch.Generator | None = None,
    sampling_seed: int | None = None,
    trainer_state: Any = None,
    autocast: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    all_done: Callable[[bool], bool] | None = None,
    sampled: tuple[SampledBatch, float] | None = None,
) -> ScoredRollout:
    """Sample ``settings.num_generations`` completions for each prompt and score them (``sampled``: the
    batch already sampled elsewhere, a rollout worker, and the seconds it took: only scored here).

    Args:
        tokenizer: the tokenizer, or a vision-language model's processor (needed for image columns).
        prompts: P raw dataset prompts (text or conversations). columns: the other dataset
            columns, one value per prompt (repeated here for each completion).
        group_ids: one id per prompt (default ``0..P-1``): the ids advantages group by.
        generator / sampling_seed: where the randomness comes from: one stream for the batch, or
            (``sampling_seed``) one per completion, keyed by its group id (training uses it, so a
            run on N processes samples what one process would).
        trainer_state: passed to reward functions as ``trainer_state``.
        autocast: a context for the sampling forward passes (mixed precision).
        all_done: whether every process has finished decoding (lockstep generation, FSDP).

    The model samples in eval mode (no dropout) and is put back in the mode it was in.
    """
    k = settings.num_generations
    groups = list(range(len(prompts))) if group_ids is None else list(group_ids)
    start = time.perf_counter()
    if sampled is None:
        was_training = model.training
        model.eval()
        try:
            with autocast(), waiting_for(f"sampling ({len(prompts)} prompts x {k} completions)"):
                batch = sample_batch(
                    model,
                    tokenizer,
                    prompts,
                    columns,
                    settings,
                    groups,
                    generator=generator,
                    sampling_seed=sampling_seed,
                    step=getattr(trainer_state, "global_step", 0),
                    all_done=all_done,
                )
        finally:
            model.train(was_training)
    else:
        batch, seconds = sampled
        start -= seconds  # the worker's sampling time
    tokenizer = tokenizer.tokenizer if is_processor(tokenizer) else tokenizer
    rollout = batch.rollout
    if settings.pad_to_multiple_of is not None:
        rollout = pad_to_multiple(rollout, settings.pad_to_multiple_of, tokenizer.pad_token_id)
    generated = time.perf_counter()
    texts = tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
    episodes = batch.episodes
    completions = completions_for_rewards(texts, prompts, episodes)
    per_completion = {name: repeat_per_completion(values, k) for name, values in columns.items()}
    scored = rewards.score(
        prompts=batch.episode_prompts or repeat_per_completion(prompts, k),
        completions=completions,
        completion_ids=rollout.completion_id_lists(),
        columns={**per_completion, **batch.columns},
        trainer_state=trainer_state,
    )
    rewards.warn_unscorable(scored.scorable, prompts, k)
    device = rollout.completion_ids.device
    scored = CombinedRewards(scored.scores, scored.rewards.to(device), scored.scorable.to(device), scored.log)
    return ScoredRollout(
        rollout=rollout,
        prompts=list(prompts),
        completion_texts=texts,
        rewards=scored,
        num_truncated_prompts=batch.num_truncated_prompts,
        generate_seconds=generated - start,
        score_seconds=time.perf_counter() - generated,
        images=[row_images(columns, i) for i in range(len(prompts))] if image_column(list(columns)) else None,
        episodes=episodes,
    )


@dataclass(frozen=True)
class SampledBatch:
    """What a rollout source returned for P prompts: the rollout (N = P*K rows); prompts cut to
    ``max_prompt_length``; multi-turn episodes' records, or None; each completion's own prompt (an
    environment's observation in it), or None (a prompt's K share it); more per-completion reward columns."""

    rollout: Rollout
    num_truncated_prompts: int
    episodes: list[Episode] | None = None
    episode_prompts: list[Any] | None = None
    columns: dict[str, list[Any]] = field(default_factory=dict)


def sample_batch(
    model: nn.Module,
    processing_class: Any,
    prompts: Sequence[Any],
    columns: dict[str, list[Any]],
    settings: RolloutSettings,
    groups: list[int],
    *,
    generator: torch.Generator | None,
    sampling_seed: int | None,
    step: int,
    all_done: Callable[[bool], bool] | None,
) -> SampledBatch:
    """K completions of each prompt from the run's rollout source: the user's ``rollout_func``, multi-turn
    episodes (``settings.agent``: tools, environments) or one turn, on rloo's sampler or ``settings.engine``."""
    k, agent = settings.num_generations, settings.agent
    tokenizer = processing_class.tokenizer if is_processor(processing_class) else processing_class
    eos = eos_token_ids(tokenizer, model, settings.extra_eos_token_ids)
    if settings.custom is not None:  # rollout_func: the user samples (and templates) the batch
        rollout, extra = custom_rollout(
            settings.custom(list(prompts)), len(prompts), k, groups, eos, tokenizer.pad_token_id, model_device(model)
        )
        return SampledBatch(rollout, 0, columns=extra)
    inputs, base = None, dict(settings.chat_template_kwargs)
    if agent is not None:  # multi-turn: the tools' schemas in the prompt; with environments, a prompt per episode
        if not is_conversational(prompts[0]):
            raise ValueError(
                "tools need conversational prompts (a list of messages per row, rendered with the chat template "
                "and the tools' schemas); make the prompt column [{'role': 'user', 'content': ...}]"
            )
        inputs = agent.episode_inputs(prompts, columns, k)
        settings = dataclasses.replace(settings, chat_template_kwargs=agent.template_kwargs(base))
    if agent is not None and inputs is not None and inputs.prompts is not None:
        tokenized, vision = agent.encode_episodes(inputs, tokenizer, settings.max_prompt_length, base), None
    else:
        tokenized, vision = encode_batch(processing_class, prompts, columns, settings)
    sample: SamplingEngine = settings.engine or rollout_sampler(settings.static_decode, generate_rollouts)
    common = {
        "params": settings.sampling,
        "eos_token_ids": eos,
        "pad_token_id": tokenizer.pad_token_id,
        "generator": generator,
        "sampling_seed": sampling_seed,
        "stop": StopStrings(tokenizer, settings.stop_strings) if settings.stop_strings else None,
        "vision": vision,
        "all_done": all_done,
        "compact_at": settings.compact_at,
        "step": step,
    }
    if agent is None or inputs is None:
        length = settings.max_completion_length
        rollout = sample(model, tokenized.ids, groups, num_generations=k, max_new_tokens=length, **common)
        return SampledBatch(rollout, tokenized.num_truncated)
    own = inputs.prompts is not None  # with environments: each episode's own prompt
    rollout, episodes = run_episodes(
        sample,
        model,
        [] if own else tokenized.ids,
        groups,
        num_generations=k,
        tokenizer=tokenizer,
        toolboxes=inputs.toolboxes,
        limits=agent.limits,
        chat_template_kwargs=dict(settings.chat_template_kwargs),
        episode_prompt_ids=tokenized.ids if own else None,
        **common,
    )
    extra = {} if inputs.environments is None else {"environments": inputs.environments}  # TRL passes them
    return SampledBatch(rollout, tokenized.num_truncated, episodes, inputs.prompts, extra)
