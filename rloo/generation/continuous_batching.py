"""Rollouts sampled by transformers' continuous batching (``use_transformers_continuous_batching=True``, TRL's
name): ``model.generate_batch``, a paged KV cache whose requests join and leave the running batch as they
finish, with each prompt's K samples forked from its prefill (``num_return_sequences``, the prompt's blocks
shared). It is an engine of the table (:mod:`rloo.generation.engines`) beside rloo's own sampler and vLLM, so
the two transformers-based samplers can be measured against each other on one seam (``make bench-gpu``).

What rloo does around transformers' call, and why:

- **The cache is sized to the batch.** Left to itself the engine takes a share of the device's free memory
  (TRL passes ``max_memory_percent=0.5``; on a CPU it takes most of the machine's RAM: 10 GiB, 4 s a call,
  for a 2-layer test model). Unless the user's ``transformers_continuous_batching_config`` sets
  ``num_blocks`` or ``max_memory_percent``, :func:`cache_blocks` gives it the blocks the batch can use:
  each of the P x K requests' prompt and ``max_new_tokens``, in pages.
- **The trainer's random state is kept.** The engine seeds torch's global generators (``torch.manual_seed``)
  when it starts; the call runs inside ``torch.random.fork_rng``, so dropout and every later draw of the
  run are those it would have had without the engine. Its seed comes from ``sampling_seed`` and the first
  prompt's group (the same batch samples the same completions), else from ``generator``; it seeds the
  global generators inside the fork, and the engine's own ``seed`` where its version has one.
- **Versions**: the config is built for the installed transformers' ``ContinuousBatchingConfig`` (5.8 on:
  ``block_size`` became ``page_size`` and ``seed`` came in 5.17).
- **Under bf16 mixed precision it samples a bf16 copy** of the policy (the one ``sampler_cuda_graphs`` keeps,
  :func:`rloo.generation.graph_decode.sampling_model`): the engine runs its forwards in a thread of its
  own, which autocast (thread-local) does not reach, so the policy's float32 weights would sample in float32.
- **A request that failed is an error**, naming it: ``generate_batch`` logs failures and returns what it has.
- **Completions are cut by rloo's rules** (:func:`rloo.generation.rollout.rollout_from`): after the first EOS,
  or at the token completing a stop string (the engine has no stop strings: it decodes on to EOS or the
  limit, and the tokens past the stop string are dropped, the kept ones drawn as they would be anyway).

Its log-probs are of the distribution each token was drawn from (after temperature, top-k and top-p), as
vLLM's, from other attention kernels (paged) than rloo's forward: the engine is ``separate`` in the table,
so the trainer scores the batch with its own forward where it needs log-probs, and with
``vllm_importance_sampling_correction`` weighs the loss for the engines' mismatch.

Not taken (refused when the config is checked, or here): repetition penalty and min-p (transformers' engine
drops or does not check those processors), images (transformers' engine takes token ids only), FSDP-sharded
parameters (the engine's thread runs forwards no other process joins), models whose cache holds other layers
than full or sliding attention (hybrid and state-space models: :func:`attention_only_reason`); a model the
engine fails on (GPT-NeoX, OPT, Falcon, Gemma 4 in transformers 5.24) is named with the families tested
(:data:`TESTED_FAMILIES`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from rloo.generation.device import model_device
from rloo.generation.graph_decode import sampling_model
from rloo.generation.multimodal import VisionInputs
from rloo.generation.rollout import Rollout, SamplingEngine, rollout_from
from rloo.generation.sampling import SamplingParams
from rloo.suggest import did_you_mean

# the text families whose greedy tokens under transformers' engine equal rloo's sampler's (transformers 5.24,
# tests/generation/test_continuous_batching.py); of rloo's other families, the hybrid and state-space ones are
# refused before the call (attention_only_reason), and others fail inside it (GPT-NeoX, OPT and Falcon call cache
# methods its paged cache lacks, Gemma 4 reads a per-layer head size) and are named when they do
TESTED_FAMILIES = ("gemma2", "gemma3", "gpt2", "llama", "mistral", "olmo2", "phi3", "qwen2", "qwen3", "qwen3_moe")
_SEED_STRIDE = 1_000_003  # a prime: sampling seeds of different runs stay apart (as the vLLM sampler's)
# the engine's own sizing of its cache; rloo sizes it to the batch when the user set none of them
_SIZING = ("num_blocks", "max_memory_percent")


def cache_blocks(prompt_lengths: Sequence[int], k: int, max_new_tokens: int, page_size: int) -> int:
    """The cache blocks P prompts' K requests can use: ``sum_p K * ceil((len_p + max_new_tokens) / page_size)``
    (each request's prompt and completion in whole pages, none shared: an upper bound the engine never
    outgrows), plus one block for its scheduler's slack."""
    return sum(k * -(-(length + max_new_tokens) // page_size) for length in prompt_lengths) + 1


def continuous_batching_config(
    settings: Mapping[str, Any], prompt_lengths: Sequence[int], k: int, max_new_tokens: int, seed: int | None = None
) -> Any:
    """transformers' ``ContinuousBatchingConfig`` from the user's ``settings`` (their keys checked against its
    fields, an unknown one named with the closest), log-probs on, the engine's ``seed`` where its version takes
    one (5.17 on), and the cache sized to the batch (:func:`cache_blocks`, in pages of ``page_size`` tokens,
    ``block_size`` before 5.17) unless ``settings`` sizes it."""
    from transformers import ContinuousBatchingConfig

    defaults: dict[str, Any] = {field.name: field.default for field in dataclasses.fields(ContinuousBatchingConfig)}
    for key in settings:
        if key not in defaults:
            raise ValueError(
                f"transformers_continuous_batching_config has {key!r}, which transformers' "
                f"ContinuousBatchingConfig does not take{did_you_mean(key, defaults)}; its fields are "
                f"{sorted(defaults)}"
            )
    kwargs = {"return_logprobs": True, **settings}
    if seed is not None and "seed" in defaults:
        kwargs.setdefault("seed", seed)
    if not any(kwargs.get(name) is not None for name in _SIZING):
        page = next(kwargs.get(name) or defaults[name] for name in ("page_size", "block_size") if name in defaults)
        kwargs["num_blocks"] = cache_blocks(prompt_lengths, k, max_new_tokens, int(page))
    if not kwargs["return_logprobs"]:
        raise ValueError(
            "transformers_continuous_batching_config has return_logprobs=False: rloo records the sampled tokens' "
            "log-probs; remove it"
        )
    return ContinuousBatchingConfig(**kwargs)


def generation_config(
    params: SamplingParams, k: int, max_new_tokens: int, eos_token_ids: Sequence[int], pad_token_id: int
) -> Any:
    """The ``GenerationConfig`` of one batch: K return sequences a prompt, every sampling knob set (a knob left
    None would take the model's ``generation_config``, e.g. a checkpoint's top_k=50); greedy at temperature 0,
    one sequence a prompt (transformers refuses more: the K would be equal)."""
    from transformers import GenerationConfig

    if params.repetition_penalty != 1.0 or params.min_p:
        raise ValueError(
            "transformers' continuous batching does not apply repetition_penalty or min_p (it drops or does not "
            "check those processors): set repetition_penalty=1.0 and min_p=None, or use rloo's sampler"
        )
    greedy = params.temperature == 0
    return GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=not greedy,
        temperature=None if greedy else params.temperature,
        top_k=params.top_k if params.top_k > 0 and not greedy else None,
        top_p=params.top_p if params.top_p < 1.0 and not greedy else None,
        max_new_tokens=max_new_tokens,
        num_return_sequences=1 if greedy else k,
        eos_token_id=list(eos_token_ids),
        pad_token_id=pad_token_id,
    )


def ordered_outputs(outputs: Mapping[str, Any], count: int, k: int) -> list[Any]:
    """The engine's ``count * k`` outputs in rloo's order (a prompt's K samples consecutive, as
    ``generate_batch`` returns them); raises naming the requests that failed or are missing."""
    failed = [f"{name}: {output.error}" for name, output in outputs.items() if output.error is not None]
    if failed or len(outputs) != count * k:
        missing = count * k - len(outputs) + len(failed)
        raise RuntimeError(
            f"transformers' continuous batching returned {len(outputs) - len(failed)} of {count * k} completions "
            f"({missing} failed or missing: {'; '.join(failed) or 'no error given'}); see the log above for the "
            "engine's own message, or sample with rloo's sampler (use_transformers_continuous_batching=False)"
        )
    return list(outputs.values())


def attention_only_reason(model: nn.Module) -> str | None:
    """Why transformers' engine cannot page ``model``'s cache (layers other than full or sliding attention:
    state-space, linear attention, convolution, KV-shared), or None; from transformers' own cache layout."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    config = getattr(model, "config", None)
    try:
        layers = DynamicCache(config=config.get_text_config()).layers if config is not None else []
    except Exception:  # a config transformers' cache cannot lay out: the engine's own error will say more
        return None
    kinds = sorted(
        {type(layer).__name__ for layer in layers} - {DynamicLayer.__name__, DynamicSlidingWindowLayer.__name__}
    )
    return f"its cache has {', '.join(kinds)} layers, which the engine's paged cache does not hold" if kinds else None


def _refusal(model: nn.Module, why: str, known: bool = False) -> str:
    """The message of a model the engine cannot (``known``: rloo knows it before the call) or did not sample."""
    family = getattr(getattr(model, "config", None), "model_type", None)
    what = "cannot sample" if known else "failed on"
    return (
        f"use_transformers_continuous_batching {what} model type {family!r}: {why}. Families tested with it: "
        f"{', '.join(TESTED_FAMILIES)}; for another, sample with rloo's sampler (use_transformers_continuous_batching"
        "=False)"
    )


def _seed(group_ids: Sequence[int], sampling_seed: int | None, generator: torch.Generator | None) -> int | None:
    if sampling_seed is not None:
        return (sampling_seed * _SEED_STRIDE + int(group_ids[0])) % 2**31
    if generator is not None:
        return int(torch.randint(0, 2**31, (1,), generator=generator))
    return None


class ContinuousBatchingSampler(SamplingEngine):
    """A :class:`~rloo.generation.rollout.SamplingEngine` sampling with ``generate_batch``; ``settings``: the
    user's ``transformers_continuous_batching_config``."""

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.settings = dict(settings or {})

    def __call__(
        self,
        model: nn.Module,
        prompt_ids: Sequence[Sequence[int]],
        group_ids: Sequence[int],
        *,
        num_generations: int,
        max_new_tokens: int,
        params: SamplingParams,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        generator: torch.Generator | None = None,
        sampling_seed: int | None = None,
        stop: Callable[[Sequence[Tensor], Tensor], Tensor] | None = None,
        vision: VisionInputs | None = None,
        all_done: Callable[[bool], bool] | None = None,
        compact_at: float | None = None,
        step: int = 0,
    ) -> Rollout:
        """:class:`~rloo.generation.rollout.SamplingEngine`'s contract, sampled by ``generate_batch`` (``all_done``,
        ``compact_at`` and ``step`` concern rloo's decode loop and other engines' weights only)."""
        if vision is not None:
            raise NotImplementedError(
                "image prompts with use_transformers_continuous_batching: transformers' engine takes token ids "
                "only; train them with rloo's sampler (use_transformers_continuous_batching=False)"
            )
        if any(getattr(p, "device_mesh", None) is not None for p in model.parameters()):
            raise NotImplementedError(
                "use_transformers_continuous_batching with FSDP-sharded parameters: the engine's forwards run in a "
                "thread no other process joins; use rloo's sampler"
            )
        if (why := attention_only_reason(model)) is not None:
            raise NotImplementedError(_refusal(model, why, known=True))
        k, device = num_generations, model_device(model)
        seed = _seed(group_ids, sampling_seed, generator)
        config = continuous_batching_config(self.settings, [len(ids) for ids in prompt_ids], k, max_new_tokens, seed)
        generation = generation_config(params, k, max_new_tokens, eos_token_ids, pad_token_id)
        sampler, precision = sampling_model(model)
        forked = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=forked), precision:
            if seed is not None:  # the engine's draws (its own seed where its version takes one, set from this)
                torch.manual_seed(seed)
            try:
                outputs = sampler.generate_batch(  # type: ignore[operator]
                    [list(ids) for ids in prompt_ids],
                    generation_config=generation,
                    continuous_batching_config=config,
                    progress_bar=False,
                )
            except torch.OutOfMemoryError:
                raise  # its own message says what to do
            except Exception as error:  # the engine refused the model before sampling (a config, a layer type)
                raise RuntimeError(_refusal(model, f"{type(error).__name__}: {error}")) from error
        each = generation.num_return_sequences  # greedy: one, the same for all K
        try:
            answered = ordered_outputs(outputs, len(prompt_ids), each)
        except RuntimeError as error:  # every request failed: likely a model the engine cannot run (the errors say)
            if all(output.error is not None for output in outputs.values()):
                raise RuntimeError(_refusal(model, str(error))) from error
            raise
        ordered = [out for out in answered for _ in range(k // each)]
        return rollout_from(
            [list(output.generated_tokens) for output in ordered],
            [list(output.logprobs) for output in ordered],
            prompt_ids,
            group_ids,
            k,
            max_new_tokens,
            eos_token_ids,
            pad_token_id,
            device,
            keep_logprobs=params.plain,
            stop=stop,
        )


def continuous_batching_sampler(args: Any) -> ContinuousBatchingSampler:
    """The engine a config asks for (``use_transformers_continuous_batching``)."""
    return ContinuousBatchingSampler(args.transformers_continuous_batching_config)
