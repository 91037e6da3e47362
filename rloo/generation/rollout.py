"""Rollouts: K sampled completions per prompt from the policy, with a KV cache.

The sampling loop is ours rather than ``model.generate``: each prompt is prefilled once
and its KV cache repeated for its K samples (no K-fold prompt prefill), sampling is one
fused step (:func:`rloo.generation.sampling.sample_next_token`), the loop stops as soon as every row
has emitted EOS, and the log-prob of each sampled token under the sampling policy is
recorded on the way, so no extra forward pass is needed for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rloo.algo.masks import completion_mask_from_ids
from rloo.generation.kv_cache import preallocate
from rloo.generation.sampling import SamplingParams, completion_uniforms, sample_next_token


@dataclass
class Rollout:
    """A generation batch. N = P*K rows, the K samples of a prompt consecutive.

    prompt_ids / prompt_mask: ``(N, Tp)`` left-padded. completion_ids: ``(N, Tc)``
    right-padded with the pad id after the first EOS. completion_mask: ``(N, Tc)`` float,
    1 up to and including the first EOS. truncated: ``(N,)`` bool, no EOS within the limit.
    sampling_logprobs: ``(N, Tc)`` log-prob of each sampled token under the sampling policy
    (``log_softmax(logits / T)``), 0 where masked. group_ids: ``(N,)`` the prompt's id.
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    completion_ids: Tensor
    completion_mask: Tensor
    truncated: Tensor
    sampling_logprobs: Tensor
    group_ids: Tensor

    @property
    def num_completion_tokens(self) -> int:
        return int(self.completion_mask.sum())

    def completion_id_lists(self) -> list[list[int]]:
        """Each completion's token ids up to and including EOS, without padding."""
        return [row[mask.bool()].tolist() for row, mask in zip(self.completion_ids, self.completion_mask, strict=True)]


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


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding: ``cumsum(mask) - 1``, clamped at 0. ``(B, L)``."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


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
) -> Rollout:
    """Sample ``num_generations`` completions for each prompt.

    The model must be in eval mode (no dropout) and accept ``past_key_values``. With
    ``sampling_seed``, completion ``j`` of group ``g`` is sampled from its own random stream
    (:func:`rloo.generation.sampling.completion_uniforms`) instead of ``generator``'s.
    """
    device = next(model.parameters()).device
    k = num_generations
    uniforms = None
    if sampling_seed is not None:
        uniforms = completion_uniforms(sampling_seed, group_ids, k, max_new_tokens, device)
    ids, mask = left_pad(prompt_ids, pad_token_id, device)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=True)
    cache = out.past_key_values
    cache.batch_repeat_interleave(k)
    cache = preallocate(cache, max_new_tokens)
    logits = out.logits[:, -1].repeat_interleave(k, dim=0)
    prompt_ids_k, prompt_mask_k = ids.repeat_interleave(k, dim=0), mask.repeat_interleave(k, dim=0)
    attention = prompt_mask_k
    next_position = attention.sum(dim=1, keepdim=True)
    eos = torch.tensor(list(eos_token_ids), device=device)
    finished = torch.zeros(ids.shape[0] * k, dtype=torch.bool, device=device)
    tokens: list[Tensor] = []
    logprobs: list[Tensor] = []
    # the penalty's history must skip left padding (as transformers does): fill the padding
    # with the row's last prompt token, which is penalized once either way
    history = torch.where(prompt_mask_k.bool(), prompt_ids_k, prompt_ids_k[:, -1:])
    for step in range(max_new_tokens):
        draws = None if uniforms is None else uniforms[:, step]
        token, logprob = sample_next_token(logits, history, params, generator, draws)
        token = torch.where(finished, pad_token_id, token)
        tokens.append(token)
        logprobs.append(logprob)
        finished = finished | torch.isin(token, eos)
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        if params.repetition_penalty != 1.0:
            history = torch.cat([history, token.unsqueeze(1)], dim=1)
        attention = torch.cat([attention, torch.ones_like(token).unsqueeze(1)], dim=1)
        out = model(
            input_ids=token.unsqueeze(1),
            attention_mask=attention,
            position_ids=next_position,
            past_key_values=cache,
            use_cache=True,
        )
        cache, logits = out.past_key_values, out.logits[:, -1]
        next_position = next_position + 1
    completion_ids = torch.stack(tokens, dim=1)
    completion_mask, truncated = completion_mask_from_ids(completion_ids, eos_token_ids)
    completion_ids = torch.where(completion_mask.bool(), completion_ids, pad_token_id)
    return Rollout(
        prompt_ids=prompt_ids_k,
        prompt_mask=prompt_mask_k,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        truncated=truncated,
        sampling_logprobs=torch.stack(logprobs, dim=1) * completion_mask,
        group_ids=torch.tensor(list(group_ids), device=device).repeat_interleave(k),
    )
