"""rloo's sampler with a static-shape decode step, launched as one CUDA graph per batch-size bucket on a
GPU (the buffers and the step: :mod:`rloo.generation.static_decode`).

Why: on a GPU an eager decoding step of a transformers model is launch-bound (about 50 kernels a
layer, each with Python around it, and host syncs that stop the CPU running ahead), 25-33 ms for a
step whose weights and cache take 1-2 ms to read. A graph replays the step's kernels with one launch.

Where it departs from the eager loop (:func:`rloo.generation.rollout.generate_rollouts`, the
reference and the fallback):

- "every row finished" and "the live rows fit a smaller bucket" are read every :data:`CHECK_EVERY`
  steps with one copy to the host, not every step: a row that ends in between decodes padding
  until then, and the outputs are those of the eager loop.
- compaction moves to the smallest bucket (N, N/2, N/4, ...) that holds the live rows once
  ``compact_at`` of the batch has finished, where the eager loop drops exactly the finished rows.
- attention spans the whole static cache (rounded up to :data:`LENGTH_MULTIPLE` positions so
  batches of similar prompt lengths reuse a capture), the positions not written yet masked: the
  same distribution, the last bits of rounding not always the same (tested within tolerance).
- on CUDA under bf16 mixed precision the policy samples through a bf16 copy of its weights
  (:class:`SamplingCopy`), run outside autocast, as vLLM and TRL's paged path sample: a bf16 cache
  and no per-op casts. The copy is refreshed from the policy (``copy_``) at the start of every
  rollout, so it never lags whatever changed the weights (optimizer steps, loading, syncing), for
  one read of the weights per rollout; in fp32 the policy's own weights are captured.

Which rollouts: decoders of :data:`STATIC_FAMILIES` whose layers all attend to every past token
(transformers' own cache says so), with SDPA or eager attention, sampled with per-completion
uniforms (``sampling_seed``) or greedily, with no stop strings, no images and no sharded
parameters (FSDP decodes in lockstep). Anything else samples with the eager loop;
:func:`unsupported_reason` says why.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from transformers.cache_utils import DynamicCache, DynamicLayer

from rloo.algo.masks import completion_mask_from_lengths
from rloo.generation.decoding import CUDA_CHECK_EVERY
from rloo.generation.device import model_device
from rloo.generation.kv_cache import returned_cache
from rloo.generation.multimodal import position_ids_from_mask
from rloo.generation.rollout import Rollout, SamplingEngine, generate_rollouts, left_pad
from rloo.generation.sampling import SamplingParams, completion_uniforms
from rloo.generation.static_decode import DecodeSpec, StaticDecoder, buckets_for

# model types whose decoder layers take the 4-D mask, positions and cache the static step passes and
# dispatch no host sync of their own (tests/generation/test_graph_decode.py checks Llama and Qwen2)
STATIC_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# decoding steps between reads of the finished rows (one host sync each): the eager loop's on a GPU, on any device
CHECK_EVERY = CUDA_CHECK_EVERY
LENGTH_MULTIPLE = 128  # the static cache's length is prompt + completion rounded up to a multiple of it


def unsupported_reason(
    model: nn.Module,
    params: SamplingParams,
    sampling_seed: int | None,
    stop: Any = None,
    vision: Any = None,
) -> str | None:
    """Why the static step cannot sample this rollout (the eager loop does), or None when it can."""
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if vision is not None:
        return "a vision-language prompt"
    if stop is not None:
        return "stop strings (read on the host after every step)"
    if sampling_seed is None and params.temperature != 0:
        return "no sampling_seed: the static step draws from each completion's own uniforms"
    if family not in STATIC_FAMILIES:
        return f"model type {family!r} (supported: {', '.join(sorted(STATIC_FAMILIES))})"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type")) in ("dynamic", "longrope"):
        return "a RoPE scaling that reads the longest position on the host every step"
    attention = getattr(config, "_attn_implementation", None)
    if attention not in ("sdpa", "eager"):
        return f"attention implementation {attention!r} (supported: sdpa, eager)"
    kinds = {type(layer).__name__ for layer in DynamicCache(config=config).layers}
    if kinds != {DynamicLayer.__name__}:
        return f"cache layers {sorted(kinds)}: only layers that attend to every past token are static"
    if any(getattr(parameter, "device_mesh", None) is not None for parameter in model.parameters()):
        return "sharded parameters (FSDP): processes decode in lockstep"
    device = model_device(model).type
    if device == "cuda" and torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.float16:
        return "fp16 autocast"
    return None


class SamplingCopy:
    """A bf16 copy of a policy that samples for it: made once (each parameter cast, the modules deep
    copied around them, tied weights kept tied), its weights copied from the policy's by :meth:`refresh`."""

    def __init__(self, model: nn.Module) -> None:
        sources = list(model.parameters())
        memo: dict[int, Any] = {
            id(p): nn.Parameter(p.detach().to(torch.bfloat16), requires_grad=False) for p in sources
        }
        module = copy.deepcopy(model, memo)
        # accelerate's mixed-precision wrapper (autocast, outputs cast to fp32) is set on the instance:
        # dropped, the copy runs its class's forward, in bf16
        for name in ("forward", "_original_forward"):
            vars(module).pop(name, None)
        self.module = module.eval()
        self.sources = [id(p) for p in sources]
        self._pairs = [(memo[id(p)], p) for p in sources]

    def refresh(self) -> None:
        """The policy's current weights, cast, into the copy (in place: a captured graph reads them by address)."""
        with torch.no_grad():
            for target, source in self._pairs:
                target.copy_(source)


class _Sampling:
    """What sampling one policy with the static step keeps between rollouts: its bf16 copy (or None)
    and the last decoder, its buffers and graphs (rebuilt when a rollout needs other shapes)."""

    def __init__(self) -> None:
        self.copy: SamplingCopy | None = None
        self.decoder: StaticDecoder | None = None

    def sampling_model(self, model: nn.Module) -> tuple[nn.Module, contextlib.AbstractContextManager[Any]]:
        """The module that samples and the context it runs in: under bf16 autocast, the bf16 copy with
        autocast off (unless the weights are bf16 already); otherwise ``model`` as it is."""
        device = model_device(model).type
        bf16 = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.bfloat16
        # weights in bf16 already (LoRA adapters too): autocast casts none of them, nothing to copy
        if not bf16 or all(p.dtype == torch.bfloat16 for p in model.parameters()):
            return model, contextlib.nullcontext()
        if self.copy is None or self.copy.sources != [id(p) for p in model.parameters()]:
            self.copy, self.decoder = None, None  # the old copy's memory is free before the new one's taken
            self.copy = SamplingCopy(model)
        self.copy.refresh()
        return self.copy.module, torch.autocast(device, enabled=False)

    def decoder_for(self, spec: DecodeSpec, model: nn.Module) -> StaticDecoder:
        if self.decoder is None or self.decoder.spec != spec:
            self.decoder = None  # the old buffers and graphs are freed before the new ones are allocated
            decoder = StaticDecoder(spec)
            if spec.device.type == "cuda":
                try:
                    decoder.capture(model)
                except RuntimeError as error:  # a kernel or a host read that cannot be captured: the same step, eager
                    decoder.graphs.clear()
                    warnings.warn(f"sampler_cuda_graphs: the decode step runs eagerly ({error})", stacklevel=2)
            self.decoder = decoder
        return self.decoder


# keyed by the policy, so a policy's copy and decoder go when it does (nothing in them refers to it)
_SAMPLING: weakref.WeakKeyDictionary[nn.Module, _Sampling] = weakref.WeakKeyDictionary()


def sampling_model(model: nn.Module) -> tuple[nn.Module, contextlib.AbstractContextManager[Any]]:
    """The module that samples for ``model`` and the context it runs in (:meth:`_Sampling.sampling_model`: its
    bf16 copy, refreshed, with autocast off, under bf16 autocast), for any sampler that wants bf16 weights
    rather than autocast (the static step; transformers' continuous batching, whose thread autocast misses)."""
    return _SAMPLING.setdefault(model, _Sampling()).sampling_model(model)


def _spec(
    model: nn.Module, cache: Any, keyword: str, logits: Tensor, rows: int, prompt: int, **fixed: Any
) -> DecodeSpec:
    attention = getattr(model.config, "_attn_implementation", None)
    length = -(-(prompt + fixed["new_tokens"]) // LENGTH_MULTIPLE) * LENGTH_MULTIPLE
    layers = cache.layers
    return DecodeSpec(
        rows=rows,
        length=length,
        vocab=logits.shape[-1],
        kv=tuple(
            (la.keys.shape[1], la.keys.shape[-1], la.values.shape[-1], la.keys.dtype, la.values.dtype) for la in layers
        ),
        keyword=keyword,
        boolean_mask=attention == "sdpa",
        mask_dtype=next(model.parameters()).dtype,
        device=logits.device,
        weights=tuple(p.data_ptr() for p in model.parameters()),
        **fixed,
    )


def _decode(
    decoder: StaticDecoder, model: nn.Module, compact_at: float | None, all_done: Callable[[bool], bool] | None
) -> None:
    """Steps until every row has finished (read every :data:`CHECK_EVERY` steps) or the last token,
    moving to a smaller bucket when the live rows fit one and ``compact_at`` of the batch has finished."""
    spec, steps = decoder.spec, 0
    size = spec.rows
    while True:
        chunk = min(CHECK_EVERY, spec.new_tokens - steps)
        for _ in range(chunk):
            decoder.run(model, size)
        steps += chunk
        if steps == spec.new_tokens:
            return
        live = decoder.live_rows()  # the one copy to the host of these CHECK_EVERY steps
        if all_done(live == 0) if all_done is not None else live == 0:
            return
        target = min(bucket for bucket in spec.buckets if bucket >= live)
        if compact_at is not None and target < size and size - live >= compact_at * size:
            decoder.compact(size, target)
            size = target


def _rollout(decoder: StaticDecoder, ids: Tensor, mask: Tensor, k: int, group_ids: Sequence[int], pad: int) -> Rollout:
    """The rollout the decoder's outputs hold, as the eager loop builds it (new tensors: the buffers are
    reused by the next rollout). Its width is the eager loop's: the step the last row ended at, or Tc."""
    width = int(decoder.lengths.max())
    completion_mask = completion_mask_from_lengths(decoder.lengths, width)
    return Rollout(
        prompt_ids=ids.repeat_interleave(k, dim=0),
        prompt_mask=mask.repeat_interleave(k, dim=0),
        completion_ids=torch.where(completion_mask.bool(), decoder.tokens_out[:, :width], pad),
        completion_mask=completion_mask,
        truncated=~decoder.finished,
        sampling_logprobs=decoder.logprobs_out[:, :width] * completion_mask,
        group_ids=torch.tensor(list(group_ids), device=ids.device).repeat_interleave(k),
    )


@torch.no_grad()
def static_rollout(
    model: nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    group_ids: Sequence[int],
    *,
    num_generations: int,
    max_new_tokens: int,
    params: SamplingParams,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    sampling_seed: int | None = None,
    all_done: Callable[[bool], bool] | None = None,
    compact_at: float | None = None,
) -> Rollout | None:
    """:func:`rloo.generation.rollout.generate_rollouts` for a rollout :func:`unsupported_reason` accepts,
    with the static step (module docstring); None, having only prefilled, if the prefill's cache turns
    out not to be one of full-attention layers."""
    sampling = _SAMPLING.setdefault(model, _Sampling())
    sampler, context = sampling.sampling_model(model)
    k, device = num_generations, model_device(model)
    ids, mask = left_pad(prompt_ids, pad_token_id, device)
    with context:
        out = sampler(
            input_ids=ids,
            attention_mask=mask,
            position_ids=position_ids_from_mask(mask),
            use_cache=True,
            logits_to_keep=1,
        )
        keyword, cache = returned_cache(sampler, out)
        if type(cache) is not DynamicCache or any(type(layer) is not DynamicLayer for layer in cache.layers):
            return None
        fixed = {
            "new_tokens": max_new_tokens,
            "params": params,
            "eos_token_ids": tuple(eos_token_ids),
            "pad_token_id": pad_token_id,
            "buckets": buckets_for(ids.shape[0] * k, compact_at is not None),
        }
        spec = _spec(sampler, cache, keyword, out.logits, ids.shape[0] * k, ids.shape[1], **fixed)
        decoder = sampling.decoder_for(spec, sampler)
        uniforms = None
        if sampling_seed is not None:
            uniforms = completion_uniforms(sampling_seed, group_ids, k, max_new_tokens, device)
        decoder.start(cache, out.logits[:, -1], ids, mask, k, uniforms)
        del out, cache  # the prefill's cache is in the decoder's buffers now
        _decode(decoder, sampler, compact_at, all_done)
    return _rollout(decoder, ids, mask, k, group_ids, pad_token_id)


def sample_rollouts(
    model: nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    group_ids: Sequence[int],
    static: bool | None,
    eager: Callable[..., Rollout] = generate_rollouts,
    **kwargs: Any,
) -> Rollout:
    """:func:`rloo.generation.rollout.generate_rollouts`' contract, with the static step where ``static``
    (``sampler_cuda_graphs`` True, anywhere: on a CPU it runs eagerly) and :func:`unsupported_reason`
    finds nothing; ``eager``, the eager loop, otherwise. None (rloo's choice) is the eager loop until a GPU
    run has checked the captured step against it. True on a rollout it cannot take warns once per reason."""
    if not static:
        return eager(model, prompt_ids, group_ids, **kwargs)
    reason = unsupported_reason(
        model, kwargs["params"], kwargs.get("sampling_seed"), kwargs.get("stop"), kwargs.get("vision")
    )
    rollout = None
    if reason is None:
        names = ("num_generations", "max_new_tokens", "params", "eos_token_ids", "pad_token_id", "sampling_seed")
        named = {name: kwargs[name] for name in names if name in kwargs}
        rollout = static_rollout(
            model,
            prompt_ids,
            group_ids,
            **named,
            all_done=kwargs.get("all_done"),
            compact_at=kwargs.get("compact_at"),
        )
    elif static:
        warnings.warn(f"sampler_cuda_graphs: {reason}; sampling with the eager loop", stacklevel=2)
    return rollout if rollout is not None else eager(model, prompt_ids, group_ids, **kwargs)


def rollout_sampler(static: bool | None, eager: SamplingEngine = generate_rollouts) -> SamplingEngine:
    """rloo's own sampling engine (:class:`~rloo.generation.rollout.SamplingEngine`) for ``sampler_cuda_graphs``
    = ``static``, falling back to ``eager``."""
    return eager if static is False else functools.partial(sample_rollouts, static=static, eager=eager)
