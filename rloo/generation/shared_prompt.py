"""A prompt's K samples share its forward in the log-prob passes (reference, old and training).

The plain pass runs every row's prompt + completion: a prompt of Tp tokens shared by the K samples
of a group is encoded K times, forward and backward, which on realistic work (few-shot and system
prompts, documents: Tp >> Tc) is most of the pass. Here the distinct prompts of a pass are run once
(``use_cache=True``), their cache is indexed out to the rows that share them (an ``index_select``,
so in the backward the K rows' gradients are summed into the one prompt forward, exactly), and the
completions are run on that cache. The first completion token is predicted by the prompt's last
position, the others by the completion forward; both hidden states go to the chunked head
(:mod:`rloo.generation.lm_head`).

Applies to passes that hold a prompt more than once, text prompts, no router aux loss asked for, a
model whose head is chunkable and whose prompt cache is a plain ``DynamicCache`` of plain
``DynamicLayer`` layers (full attention: Llama, Qwen, Mistral without a window, GPT-2, ...). Anything
else (sliding-window, linear-attention or state-space layers, another cache class, gradient
checkpointing in training mode) takes the plain pass; a model whose cache layers or logits did not
qualify is remembered and not tried again (facts of the model, not of its mode, so a resumed run
takes the same path at every pass as the run it resumes).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from transformers.cache_utils import DynamicCache, DynamicLayer

from rloo.generation.lm_head import (
    ChunkScore,
    HeadInputs,
    Logprobs,
    chunkable_head,
    chunked_head_logprobs,
    matches_model_logits,
)
from rloo.generation.multimodal import position_ids_from_mask

# models whose prompt cache the shared path cannot index (not plain DynamicLayer layers)
_UNSHARED_MODELS: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def distinct_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor] | None:
    """``(first, inverse)``: one row index per distinct prompt ``(U,)`` and each row's prompt ``(N,)``;
    None when every row's prompt is distinct (nothing to share) or a row has an empty prompt."""
    if not bool(prompt_mask.any(dim=1).all()):
        return None
    key = torch.where(prompt_mask.bool(), prompt_ids, -1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    if unique.shape[0] == key.shape[0]:
        return None
    first = torch.full((unique.shape[0],), key.shape[0], dtype=torch.long, device=key.device)
    first = first.scatter_reduce(0, inverse, torch.arange(key.shape[0], device=key.device), reduce="amin")
    return first, inverse


def _checkpointing(model: nn.Module) -> bool:
    """Gradient checkpointing in training mode: transformers then turns ``use_cache`` off."""
    return model.training and any(
        getattr(module, "gradient_checkpointing", False) is True for module in model.modules()
    )


def _indexable(cache: Any) -> bool:
    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)


def _forward_hidden(model: nn.Module, head: nn.Module, forward: Callable[[], Any]) -> tuple[Any, Tensor] | None:
    """``forward()``'s output and the head's input, when the model's logits pass the head check."""
    with HeadInputs(head) as inputs:
        out = forward()
    if inputs.hidden is None or not matches_model_logits(model, head, inputs.hidden, out.logits):
        return None
    return out, inputs.hidden


def _prompt_states(model: nn.Module, head: nn.Module, ids: Tensor, mask: Tensor) -> tuple[Any, Tensor] | None:
    """The distinct prompts' cache and last hidden states ``(U, 1, D)``; None (remembered when it is a fact
    of the model: logits the head check rejects, a cache of other layers) where they cannot be shared."""

    def forward() -> Any:
        positions = position_ids_from_mask(mask)
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)

    prompt = _forward_hidden(model, head, forward)
    if prompt is None:
        _UNSHARED_MODELS.add(model)
        return None
    out, hidden = prompt
    caches = [getattr(out, name, None) for name in ("past_key_values", "cache_params")]
    cache = next((found for found in caches if found is not None), None)
    if cache is None:  # no cache returned in this mode (use_cache off): not remembered, a mode can change
        return None
    if not _indexable(cache):
        _UNSHARED_MODELS.add(model)
        return None
    return cache, hidden


def shared_prompt_logprobs(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    score: ChunkScore,
    with_entropy: bool,
    chunk_elements: int | None = None,
) -> Logprobs | None:
    """Log-probs (and entropies) ``(N, Tc)`` as :func:`rloo.generation.logprobs.completion_logprobs`
    (text rows, no aux loss), each distinct prompt run once; None where the plain pass must run."""
    head = chunkable_head(model)
    groups = distinct_prompts(prompt_ids, prompt_mask)
    if head is None or groups is None or model in _UNSHARED_MODELS or _checkpointing(model):
        return None
    first, inverse = groups
    states = _prompt_states(model, head, prompt_ids[first], prompt_mask[first])
    if states is None:
        return None
    cache, prompt_hidden = states
    for layer in cache.layers:  # the rows' prompt states, one forward's per distinct prompt
        layer.keys, layer.values = layer.keys.index_select(0, inverse), layer.values.index_select(0, inverse)
    hidden = prompt_hidden.index_select(0, inverse)  # (N, 1, D): predicts the first completion token
    if completion_ids.shape[1] > 1:
        attention = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
        tp, inputs = prompt_ids.shape[1], completion_ids[:, :-1]
        rest = _forward_hidden(
            model,
            head,
            lambda: model(
                input_ids=inputs,
                attention_mask=attention[:, :-1],
                position_ids=position_ids_from_mask(attention)[:, tp:-1],
                past_key_values=cache,
                use_cache=True,
            ),
        )
        if rest is None:
            _UNSHARED_MODELS.add(model)
            return None
        hidden = torch.cat([hidden, rest[1]], dim=1)
    return chunked_head_logprobs(
        model, head, hidden, completion_ids, completion_mask, score, with_entropy, chunk_elements
    )
