"""A prompt's K samples share its forward in the log-prob passes (reference, old and training), and the
completions run in length buckets.

The plain pass runs every row's prompt + completion: a prompt of Tp tokens shared by the K samples
of a group is encoded K times, forward and backward, which on realistic work (few-shot and system
prompts, documents: Tp >> Tc) is most of the pass. Here the distinct prompts of a pass are run once
(``use_cache=True``), their cache is indexed out to the rows that share them (an ``index_select``,
so in the backward the K rows' gradients are summed into the one prompt forward, exactly), and the
completions are run on that cache. The first completion token is predicted by the prompt's last
position, the others by the completion forward; both hidden states go to the chunked head
(:mod:`rloo.forward.lm_head`).

Length buckets: one completion forward over all N rows pads each to the longest completion of the
pass, so it costs N x Tc_max however short most completions are; in RL runs lengths vary widely (a
median near a quarter of the limit, some rows at the limit), and most of that forward is padding.
So the rows, sorted by completion length, are cut into contiguous buckets (:func:`length_buckets`:
the fewest padded tokens plus a fixed cost per forward), and each bucket runs its own completion
forward, trimmed to its own longest row, on a cache selected out of the prompt's for its rows (a new
cache per bucket: the prompt cache is never changed; each selection is an ``index_select``, so the
buckets' gradients still sum into the one prompt forward). The cost follows the real tokens, not the
longest row. Each bucket's log-probs (and entropies) go back to the rows' places in ``(N, Tc)``, 0 at
padding as the chunked head gives them. Where one bucket is best (equal lengths, or splitting saves
less than a forward costs) the pass is one completion forward over every row, as wide as the pass.

Applies to passes that hold a prompt more than once, text prompts, no router aux loss asked for, a
model whose head is chunkable and whose prompt cache is a plain ``DynamicCache`` of plain
``DynamicLayer`` layers (full attention: Llama, Qwen, Mistral without a window, GPT-2, ...). Anything
else (sliding-window, linear-attention or state-space layers, another cache class, gradient
checkpointing in training mode) takes the plain pass; a model whose cache layers or logits did not
qualify is remembered and not tried again (facts of the model, not of its mode, so a resumed run
takes the same path at every pass as the run it resumes).
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.cache_utils import DynamicCache, DynamicLayer

from rloo.forward.forward_overhead import forward_overhead
from rloo.forward.lm_head import (
    ChunkScore,
    HeadInputs,
    Logprobs,
    chunkable_head,
    chunked_head_logprobs,
    matches_model_logits,
)
from rloo.generation.kv_cache import cache_of
from rloo.generation.multimodal import position_ids_from_mask

# models whose prompt cache the shared path cannot index (not plain DynamicLayer layers)
_UNSHARED_MODELS: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def length_buckets(lengths: Sequence[int], overhead: float) -> list[list[int]]:
    """The rows cut into length buckets, each to run as its own forward padded to its longest row.

    lengths: the tokens each row's forward must hold. Returns row indices (into ``lengths``) per bucket:
    every row in exactly one bucket; the rows sorted by length (stable) are the buckets' rows in order,
    so each bucket is a contiguous segment of the sorted lengths.

    Cost model: a bucket of ``n`` rows whose longest holds ``L`` tokens costs ``n x L`` token-rows (its
    forward pads every row to ``L``) plus ``overhead``, one forward's fixed cost in token-rows
    (:func:`rloo.forward.forward_overhead.forward_overhead`: a few dozen on a CPU, ~10^4 on a GPU). The
    partition returned minimises the sum over buckets, ``sum(n_b x L_b) + overhead x buckets``, among
    the contiguous partitions of the sorted lengths, by dynamic programming over the places where the
    length changes (O(D^2) for D distinct lengths: moving rows tied with a shorter bucket's longest
    into it never costs more, so no bucket boundary falls between equal lengths). Ties go to the
    longer last bucket: one bucket when splitting saves nothing.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    ordered = [lengths[row] for row in order]
    ends = [end for end in range(1, len(ordered) + 1) if end == len(ordered) or ordered[end] != ordered[end - 1]]
    best: dict[int, float] = {0: 0.0}  # least cost of the first ``end`` sorted rows
    start_of: dict[int, int] = {}  # where the last bucket of that best partition starts
    for j, end in enumerate(ends):
        longest = ordered[end - 1]
        best[end], start_of[end] = min(
            (best[start] + (end - start) * longest + overhead, start) for start in [0, *ends[:j]]
        )
    buckets, end = [], len(ordered)
    while end > 0:
        buckets.append(order[start_of[end] : end])
        end = start_of[end]
    return buckets[::-1]


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


def _prompt_states(
    model: nn.Module, head: nn.Module, ids: Tensor, mask: Tensor
) -> tuple[tuple[str, Any], Tensor] | None:
    """The distinct prompts' cache (with the name the model takes it by: :func:`cache_of`) and last
    hidden states ``(U, 1, D)``; None (remembered when it is a fact
    of the model: logits the head check rejects, a cache of other layers) where they cannot be shared."""

    def forward() -> Any:
        positions = position_ids_from_mask(mask)
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)

    prompt = _forward_hidden(model, head, forward)
    if prompt is None:
        _UNSHARED_MODELS.add(model)
        return None
    out, hidden = prompt
    found = cache_of(out)
    if found is None:  # no cache returned in this mode (use_cache off): not remembered, a mode can change
        return None
    if not _indexable(found[1]):
        _UNSHARED_MODELS.add(model)
        return None
    return found, hidden


def _select_cache(cache: Any, rows: Tensor) -> Any:
    """A new cache of rows ``rows`` of ``cache``'s states (``index_select``: in the backward each row's
    gradient is summed into the prompt forward's); ``cache`` itself is left as it is, for the next bucket."""
    selected = copy.copy(cache)
    selected.layers = []
    for layer in cache.layers:
        rows_layer = copy.copy(layer)
        rows_layer.keys, rows_layer.values = layer.keys.index_select(0, rows), layer.values.index_select(0, rows)
        selected.layers.append(rows_layer)
    return selected


def _completion_hidden(
    model: nn.Module,
    head: nn.Module,
    states: tuple[tuple[str, Any], Tensor],
    prompts: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
) -> Tensor | None:
    """The head's inputs ``(n, Tc, D)`` that predict ``completion_ids`` ``(n, Tc)`` of n rows, whose
    distinct prompts are ``prompts`` ``(n,)`` in the prompt forward's ``states`` (cache, last hidden
    states); None when the completion forward's logits fail the head check."""
    (cache_name, cache), prompt_hidden = states
    hidden = prompt_hidden.index_select(0, prompts)  # (n, 1, D): predicts the first completion token
    if completion_ids.shape[1] == 1:
        return hidden
    rows_cache = _select_cache(cache, prompts)  # the rows' prompt states, one forward's per distinct prompt
    attention = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    tp, inputs = prompt_mask.shape[1], completion_ids[:, :-1]
    rest = _forward_hidden(
        model,
        head,
        lambda: model(
            input_ids=inputs,
            attention_mask=attention[:, :-1],
            position_ids=position_ids_from_mask(attention)[:, tp:-1],
            use_cache=True,
            **{cache_name: rows_cache},
        ),
    )
    return None if rest is None else torch.cat([hidden, rest[1]], dim=1)


def _unbucket(parts: list[Logprobs], back: Tensor, width: int) -> Logprobs:
    """The buckets' ``(n_b, L_b)`` log-probs (and entropies), in bucket order, as ``(N, width)`` in the rows'
    order (``back``: each row's place in the buckets' order), 0 past each bucket's width."""

    def place(values: list[Tensor]) -> Tensor:
        return torch.cat([F.pad(value, (0, width - value.shape[1])) for value in values]).index_select(0, back)

    entropies = [entropy for _, entropy in parts if entropy is not None]
    return place([logprobs for logprobs, _ in parts]), place(entropies) if len(entropies) == len(parts) else None


def may_share(model: nn.Module) -> bool:
    """Whether passes of ``model`` may try the shared path (its head chunkable, not found unshareable, no
    gradient checkpointing in training mode); rows without a repeated prompt still take the plain one."""
    return chunkable_head(model) is not None and model not in _UNSHARED_MODELS and not _checkpointing(model)


def shared_prompt_logprobs(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    score: ChunkScore,
    with_entropy: bool,
    chunk_elements: int | None,
    completion_lengths: list[int],
    groups: tuple[Tensor, Tensor] | None,
) -> Logprobs | None:
    """Log-probs (and entropies) ``(N, Tc)`` as :func:`rloo.forward.logprobs.completion_logprobs`
    (text rows, no aux loss), each distinct prompt run once and the completions in length buckets;
    None where the plain pass must run. What the pass's layout choice read
    (:class:`rloo.forward.packing.LayoutChoice`): ``completion_lengths``, each row's up to its last real
    token, and ``groups``, :func:`distinct_prompts` of the rows (None: no prompt repeats)."""
    head = chunkable_head(model)
    if head is None or groups is None or not may_share(model):
        return None
    first, inverse = groups
    states = _prompt_states(model, head, prompt_ids[first], prompt_mask[first])
    if states is None:
        return None

    def rows_logprobs(prompts: Tensor, rows_prompt_mask: Tensor, ids: Tensor, mask: Tensor) -> Logprobs | None:
        hidden = _completion_hidden(model, head, states, prompts, rows_prompt_mask, ids, mask)
        if hidden is None:
            _UNSHARED_MODELS.add(model)
            return None
        return chunked_head_logprobs(model, head, hidden, ids, mask, score, with_entropy, chunk_elements)

    lengths = completion_lengths
    # the completion forward holds each row's tokens but its last (the first is predicted by the prompt's)
    buckets = length_buckets([max(length - 1, 0) for length in lengths], forward_overhead(model))
    if len(buckets) == 1:  # one completion forward over every row, as wide as the pass
        return rows_logprobs(inverse, prompt_mask, completion_ids, completion_mask)
    parts = []
    for bucket in buckets:
        rows = torch.tensor(bucket, device=completion_ids.device)
        width = max(1, *(lengths[row] for row in bucket))  # the bucket's longest completion
        part = rows_logprobs(
            inverse[rows], prompt_mask[rows], completion_ids[rows, :width], completion_mask[rows, :width]
        )
        if part is None:
            return None
        parts.append(part)
    order = torch.tensor([row for bucket in buckets for row in bucket], device=completion_ids.device)
    return _unbucket(parts, torch.argsort(order), completion_ids.shape[1])
