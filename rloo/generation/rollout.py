"""Rollouts: K sampled completions per prompt from the policy, with a KV cache.

The sampling loop is ours rather than ``model.generate``: each prompt is prefilled once
and its cache repeated for its K samples (no K-fold prompt prefill; every state of every
layer, hybrid and state-space ones included: :mod:`rloo.generation.kv_cache`), sampling is one
fused step (:func:`rloo.generation.sampling.sample_next_token`), the loop stops as soon as every row
has emitted EOS, rows that have ended leave the decode batch (:mod:`rloo.generation.decoding`),
and the log-prob of each sampled token under the sampling policy is
recorded on the way, so no extra forward pass is needed for it.
On a CPU, a decode step's LM head takes a kernel that suits few rows (:mod:`rloo.generation.decode_head`),
and prompts of 64 tokens or more are held once for their K rows, their keys and values read once a step
for all K (:mod:`rloo.generation.shared_prefix`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from rloo.algo.masks import completion_mask_from_lengths
from rloo.generation.decode_head import weight_left_head
from rloo.generation.decoding import DecodeBatch, finished_check_every, step_draws
from rloo.generation.device import model_device
from rloo.generation.kv_cache import can_select_rows, preallocate, returned_cache, share_prefill
from rloo.generation.multimodal import VisionInputs, placeholder_token_ids, prompt_positions
from rloo.generation.sampling import SamplingParams, completion_uniforms, sample_next_token
from rloo.generation.shared_prefix import share_prefix, shared_prefix_decoding, uses_shared_prefix


@dataclass
class Rollout:
    """A generation batch. N = P*K rows, the K samples of a prompt consecutive.

    prompt_ids / prompt_mask: ``(N, Tp)`` left-padded. completion_ids: ``(N, Tc)``
    right-padded with the pad id after the first EOS. completion_mask: ``(N, Tc)`` float,
    1 up to and including the first EOS. truncated: ``(N,)`` bool, no EOS within the limit (or
    ended before an image placeholder token, see :func:`generate_rollouts`).
    sampling_logprobs: ``(N, Tc)`` log-prob of each sampled token under the sampling policy
    (``log_softmax(logits / T)``), 0 where masked. group_ids: ``(N,)`` the prompt's id.
    vision: a vision-language policy's image inputs of the N rows (the K rows of a prompt share its
    images), which every later forward over these rows takes; None for text prompts.
    tool_mask: ``(N, Tc)`` float, multi-turn episodes (:mod:`rloo.tools.episodes`): 1 on the tokens the
    model sampled, 0 on those inserted between its turns (tool results, the next turn's header), which
    are attended to but never trained on; None: every completion token is the model's.
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    completion_ids: Tensor
    completion_mask: Tensor
    truncated: Tensor
    sampling_logprobs: Tensor
    group_ids: Tensor
    vision: VisionInputs | None = None
    tool_mask: Tensor | None = None

    @property
    def model_mask(self) -> Tensor:
        """``(N, Tc)``: 1 on the completion tokens the model sampled (the completion mask without inserted tokens)."""
        return self.completion_mask if self.tool_mask is None else self.completion_mask * self.tool_mask

    @property
    def num_completion_tokens(self) -> int:
        return int(self.completion_mask.sum())

    def to(self, device: torch.device | str) -> Rollout:
        """The same rollout with every tensor on ``device`` (a rollout worker's batch crossing processes)."""
        fields = [f.name for f in dataclasses.fields(self)]
        tensors = [name for name in fields if isinstance(getattr(self, name), Tensor)]
        moved: dict[str, Any] = {name: getattr(self, name).to(device) for name in tensors}
        if self.vision is not None:
            moved["vision"] = self.vision.to(torch.device(device))
        return dataclasses.replace(self, **moved)

    @property
    def num_tokens(self) -> int:
        """Prompt and completion tokens, padding not counted."""
        return int(self.prompt_mask.sum()) + self.num_completion_tokens

    def completion_id_lists(self) -> list[list[int]]:
        """Each completion's token ids up to and including EOS, without padding."""
        return [row[mask.bool()].tolist() for row, mask in zip(self.completion_ids, self.completion_mask, strict=True)]


def _pad_columns(values: Tensor, width: int, value: float, left: bool) -> Tensor:
    extra = width - values.shape[1]
    return torch.nn.functional.pad(values, (extra, 0) if left else (0, extra), value=value)


def concat_rollouts(parts: Sequence[Rollout], pad_token_id: int) -> Rollout:
    """``parts``' rows in order as one rollout, on the first part's device: prompts left-padded and completions
    right-padded to the widest part, with the pad token and a mask of 0 (log-probs 0), as the sampler pads, so
    no sum over tokens changes. A part without a tool mask has every completion token the model's."""
    if len(parts) == 1:
        return parts[0]
    device = parts[0].completion_ids.device
    tp = max(part.prompt_ids.shape[1] for part in parts)
    tc = max(part.completion_ids.shape[1] for part in parts)

    def joined(values: Sequence[Tensor], width: int | None = None, value: float = 0, left: bool = False) -> Tensor:
        padded = values if width is None else [_pad_columns(v, width, value, left) for v in values]
        return torch.cat([v.to(device) for v in padded])

    def column(name: str, width: int | None = None, value: float = 0, left: bool = False) -> Tensor:
        return joined([getattr(part, name) for part in parts], width, value, left)

    tool_mask = None
    if any(part.tool_mask is not None for part in parts):
        tool_mask = joined([part.model_mask for part in parts], tc)
    return Rollout(
        prompt_ids=column("prompt_ids", tp, pad_token_id, left=True),
        prompt_mask=column("prompt_mask", tp, left=True),
        completion_ids=column("completion_ids", tc, pad_token_id),
        completion_mask=column("completion_mask", tc),
        truncated=column("truncated"),
        sampling_logprobs=column("sampling_logprobs", tc),
        group_ids=column("group_ids"),
        vision=VisionInputs.concat([part.vision for part in parts], tp),
        tool_mask=tool_mask,
    )


def pad_to_multiple(rollout: Rollout, multiple: int, pad_token_id: int) -> Rollout:
    """``rollout`` with prompts left-padded and completions right-padded to a multiple of ``multiple``
    tokens (``pad_to_multiple_of``). The padding is masked, so every sum over tokens is unchanged."""
    prompt_width = -(-rollout.prompt_ids.shape[1] // multiple) * multiple
    completion_width = -(-rollout.completion_ids.shape[1] // multiple) * multiple
    return dataclasses.replace(
        rollout,
        prompt_ids=_pad_columns(rollout.prompt_ids, prompt_width, pad_token_id, left=True),
        prompt_mask=_pad_columns(rollout.prompt_mask, prompt_width, 0, left=True),
        completion_ids=_pad_columns(rollout.completion_ids, completion_width, pad_token_id, left=False),
        completion_mask=_pad_columns(rollout.completion_mask, completion_width, 0, left=False),
        sampling_logprobs=_pad_columns(rollout.sampling_logprobs, completion_width, 0, left=False),
        vision=None if rollout.vision is None else rollout.vision.pad_left(prompt_width),
        tool_mask=None
        if rollout.tool_mask is None
        else _pad_columns(rollout.tool_mask, completion_width, 0, left=False),
    )


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Left-pad token lists to ``(B, L)``; returns ``(ids, mask)``."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, length - len(seq) :] = torch.tensor(seq, dtype=torch.long)
            mask[row, length - len(seq) :] = 1
    return ids.to(device), mask.to(device)


def rollout_from(
    completions: list[list[int]],
    logprobs: list[list[float]],
    prompt_ids: Sequence[Sequence[int]],
    group_ids: Sequence[int],
    k: int,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    device: torch.device,
    keep_logprobs: bool,
    stop: Callable[..., Tensor] | None = None,
) -> Rollout:
    """A :class:`Rollout` of another engine's completions (vLLM's, transformers' continuous batching's): cut
    after the first EOS, or after the token at which ``stop`` (rloo's
    :class:`~rloo.generation.stopping.StopStrings`, run over the tokens as the sampler runs it) says the text
    holds a stop string; right-padded, masked; truncated where neither came within
    ``max_new_tokens``. A completion the engine ended early for a stop string is not truncated either."""
    eos = set(eos_token_ids)
    cut = []
    for ids in completions:
        end = next((i + 1 for i, token in enumerate(ids) if token in eos), None)
        kept = ids[:end] if end is not None else ids[:max_new_tokens]
        cut.append((kept, end is None and len(kept) >= max_new_tokens))  # shorter, no EOS: a stop string
    width = max(1, max(len(ids) for ids, _ in cut))
    completion_ids = torch.full((len(cut), width), pad_token_id, dtype=torch.long)
    sampled = torch.zeros((len(cut), width))
    for row, ((ids, _), row_logprobs) in enumerate(zip(cut, logprobs, strict=True)):
        completion_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        if keep_logprobs and ids:
            sampled[row, : len(ids)] = torch.tensor(row_logprobs[: len(ids)])
    lengths = torch.tensor([len(ids) for ids, _ in cut])
    truncated = torch.tensor([t for _, t in cut])
    if stop is not None:  # rloo's stop rule, token by token, so both samplers end a completion alike
        active = lengths > 0
        for step in range(width):
            active &= lengths > step
            ends = stop([completion_ids[:, i] for i in range(step + 1)], active)
            lengths = torch.where(ends, step + 1, lengths)
            truncated &= ~ends
            active &= ~ends
    mask = completion_mask_from_lengths(lengths, width)
    completion_ids = torch.where(mask.bool(), completion_ids, pad_token_id)
    prompts, prompt_mask = left_pad(prompt_ids, pad_token_id, device)
    return Rollout(
        prompt_ids=prompts.repeat_interleave(k, dim=0),
        prompt_mask=prompt_mask.repeat_interleave(k, dim=0),
        completion_ids=completion_ids.to(device),
        completion_mask=mask.to(device),
        truncated=truncated.to(device),
        sampling_logprobs=(sampled * mask).to(device),
        group_ids=torch.tensor(list(group_ids), device=device).repeat_interleave(k),
    )


@dataclass
class Prefill:
    """A prefill for P*k rows: :func:`returned_cache`'s keyword and cache, the last-position logits
    ``(P*k, V)``, (a Qwen-VL prompt with images) the rows' rope deltas ``(P*k, 1)``, and whether the cache
    holds each prompt once for its rows' decode (:mod:`rloo.generation.shared_prefix`)."""

    keyword: str
    cache: Any
    logits: Tensor
    rope_deltas: Tensor | None = None
    shared: bool = False


def _prefill_forward(
    model: nn.Module, ids: Tensor, mask: Tensor, vision: VisionInputs | None
) -> tuple[Any, Tensor | None]:
    positions = prompt_positions(model, ids, mask, vision)
    inputs = {} if vision is None else vision.model_inputs()
    # the last position's logits only, as transformers' generate: (P, Tp, V) would be 74 GiB in bf16
    # at 64 prompts x 4k tokens x a 151,936-token vocabulary
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions.position_ids,
        use_cache=True,
        logits_to_keep=1,
        **inputs,
    )
    return out, positions.rope_deltas


def prefill(
    model: nn.Module, ids: Tensor, mask: Tensor, k: int, vision: VisionInputs | None = None, new_tokens: int = 0
) -> Prefill:
    """Prefill P left-padded prompts ``(P, Tp)`` (``vision``: their image inputs) for ``k`` samples each.

    Each prompt is run once and its cache shared by its ``k`` rows: with ``new_tokens`` (the decode's
    length) and a model and prompts :func:`rloo.generation.shared_prefix.uses_shared_prefix` takes, held
    once for all of them (the decode then attends through :func:`shared_prefix_decoding`); otherwise repeated
    for each (:func:`rloo.generation.kv_cache.share_prefill`); a cache it cannot repeat exactly is
    filled by a second prefill over the ``P*k`` rows instead.
    """
    out, deltas = _prefill_forward(model, ids, mask, vision)
    keyword, cache = returned_cache(model, out)
    repeated = None if deltas is None else deltas.repeat_interleave(k, dim=0)
    if new_tokens and uses_shared_prefix(model, cache, k, ids.shape[1]):
        share_prefix(cache, mask, k, new_tokens)
        return Prefill(keyword, cache, out.logits[:, -1].repeat_interleave(k, dim=0), repeated, shared=True)
    if k == 1 or share_prefill(cache, k):
        return Prefill(keyword, cache, out.logits[:, -1].repeat_interleave(k, dim=0), repeated)
    ids, mask = ids.repeat_interleave(k, dim=0), mask.repeat_interleave(k, dim=0)
    out, deltas = _prefill_forward(model, ids, mask, None if vision is None else vision.repeat(k))
    keyword, cache = returned_cache(model, out)
    return Prefill(keyword, cache, out.logits[:, -1], deltas)


class SamplingEngine(Protocol):
    """The contract of a sampling engine: K completions of each prompt as a :class:`Rollout`.

    rloo's own sampler (:func:`generate_rollouts`, and the static-shape step of
    :func:`rloo.generation.graph_decode.rollout_sampler`) and vLLM's (:class:`rloo.generation.vllm.sampler.VLLMSampler`)
    keep it; the engine table (:mod:`rloo.generation.engines`) says which one a run samples with. Every call
    gives the same arguments: ``model`` (the policy, in eval mode), ``prompt_ids`` (P token lists),
    ``group_ids`` (P ids: the rollout's ``group_ids`` and, with ``sampling_seed``, each completion's random
    stream), ``num_generations`` (K), ``max_new_tokens``, ``params``, ``eos_token_ids``, ``pad_token_id``,
    ``generator`` or ``sampling_seed`` (where the randomness comes from), ``stop`` (a completion ends at the
    token after which it says so), ``vision`` (image inputs, or None), ``all_done`` (lockstep decoding across
    processes), ``compact_at`` (finished rows leave the decode batch) and ``step`` (the optimizer steps the
    policy has taken: an engine holding its own copy of the weights syncs them when it changes). An engine
    that cannot honour one (vLLM and images) raises ``NotImplementedError`` saying so.
    """

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
    ) -> Rollout: ...


@torch.no_grad()
def generate_rollouts(
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
    check_every: int | None = None,
) -> Rollout:
    """Sample ``num_generations`` completions for each prompt (:class:`SamplingEngine`'s contract).

    The model must be in eval mode (no dropout) and return its cache (:func:`returned_cache`). With
    ``sampling_seed``, completion ``j`` of group ``g`` is sampled from its own random stream
    (:func:`rloo.generation.sampling.completion_uniforms`) instead of ``generator``'s. A completion
    ends at its first token in ``eos_token_ids``, or at the token after which ``stop(tokens, active)``
    (e.g. :class:`rloo.generation.stopping.StopStrings`) says it stops; either way it is not truncated.
    ``vision``: the P prompts' image inputs (a vision-language policy), seen by the prefill; a
    completion then ends, truncated, before any image placeholder token it samples.
    ``all_done(done)``: whether every process is done, when several decode in lockstep (sharded
    parameters: each forward is a collective); a finished process then keeps decoding padding.
    ``compact_at``: finished rows leave the decode batch once they are this fraction of it
    (:mod:`rloo.generation.decoding`; exact, and only for a cache it can select rows of); None never.
    ``check_every``: whether every row has finished (and whether to compact) is read on the host every
    this many steps (None: :func:`rloo.generation.decoding.finished_check_every`); each read is a host
    sync, which on a GPU stops the host from queueing the next steps while the device works.
    ``step``: unused; this sampler reads the weights of the ``model`` it is given.
    """
    device = model_device(model)
    k = num_generations
    uniforms = None
    if sampling_seed is not None:
        uniforms = completion_uniforms(sampling_seed, group_ids, k, max_new_tokens, device)
    ids, mask = left_pad(prompt_ids, pad_token_id, device)
    vision = None if vision is None else vision.to(device)
    # the decode steps' LM head (rloo.generation.decode_head) and attention (rloo.generation.shared_prefix)
    with weight_left_head(model), contextlib.ExitStack() as decoding:
        filled = prefill(model, ids, mask, k, vision, new_tokens=max_new_tokens)
        prompt_ids_k, prompt_mask_k = ids.repeat_interleave(k, dim=0), mask.repeat_interleave(k, dim=0)
        total = prompt_ids_k.shape[0]
        padded = any(len(seq) != ids.shape[1] for seq in prompt_ids)
        cache = filled.cache if filled.shared else preallocate(filled.cache, max_new_tokens)
        batch = DecodeBatch.start(model, filled, cache, prompt_ids_k, prompt_mask_k, max_new_tokens, padded)
        decoding.enter_context(shared_prefix_decoding(model, filled.shared))
        compact_at = compact_at if can_select_rows(batch.cache) else None
        check_every = check_every or finished_check_every(device)
        eos = torch.tensor(list(eos_token_ids), device=device)
        placeholders = torch.tensor(placeholder_token_ids(model) if vision else [], dtype=torch.long, device=device)
        finished = torch.zeros(total, dtype=torch.bool, device=device)
        cut = torch.zeros_like(finished)  # rows that sampled an image placeholder token
        # the steps each row began finished (a row's length is the steps run less these), and the rows cut
        # before a placeholder (one token shorter): one in-place add a step, where a length and a last step
        # rewritten with torch.where took six ops (the decode step's own ops are its cost on a GPU)
        finished_steps = torch.zeros(total, dtype=torch.long, device=device)
        cut_short = torch.zeros_like(finished)
        tokens: list[Tensor] = []
        logprobs: list[Tensor] = []
        for step in range(max_new_tokens):
            draws = step_draws(uniforms, step, batch.rows, total, params, generator)
            token, logprob = sample_next_token(batch.logits, batch.history, params, generator, draws)
            token = batch.full(token, pad_token_id).masked_fill_(finished, pad_token_id)
            tokens.append(token)
            logprobs.append(batch.full(logprob, 0.0))
            finished_steps += finished
            # a finished row's EOS again changes nothing: no mask of the running rows is needed here
            ends = torch.isin(token, eos)
            if stop is not None:
                ends |= stop(tokens, ~finished)
            if vision is not None:
                # an image placeholder in a completion would claim image features no forward has: the row
                # ends before it, as truncated (no EOS)
                cuts = ~finished & torch.isin(token, placeholders)
                cut_short |= cuts & ~ends  # ended at the same step (a stop string): its length holds
                cut |= cuts
                ends |= cuts
            finished |= ends
            if step == max_new_tokens - 1:
                break
            if (step + 1) % check_every == 0:  # the one host read of this step: rows finished, in all and in the batch
                finished_rows, finished_in_batch = torch.stack([finished.sum(), finished[batch.rows].sum()]).tolist()
                done = finished_rows == total
                if all_done(done) if all_done is not None else done:
                    break
                if compact_at is not None:
                    batch.compact(finished, compact_at, finished_in_batch)
            batch.advance(model, batch.own(token), params.repetition_penalty != 1.0)
        steps_run = len(tokens) - finished_steps  # up to and including the step each row finished at
        # the loop may have run past the step every row had finished by (it checks every check_every steps):
        # those columns are padding, dropped; in lockstep every process keeps the steps they all ran
        width = len(tokens) if all_done is not None else int(steps_run.max())
        completion_ids = torch.stack(tokens[:width], dim=1)
        logprobs = logprobs[: completion_ids.shape[1]]
        completion_mask = completion_mask_from_lengths(steps_run - cut_short.long(), completion_ids.shape[1])
        completion_ids = torch.where(completion_mask.bool(), completion_ids, pad_token_id)
        return Rollout(
            prompt_ids=prompt_ids_k,
            prompt_mask=prompt_mask_k,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            truncated=~finished | cut,
            sampling_logprobs=torch.stack(logprobs, dim=1) * completion_mask,
            group_ids=torch.tensor(list(group_ids), device=device).repeat_interleave(k),
            vision=None if vision is None else vision.repeat(k),
        )
