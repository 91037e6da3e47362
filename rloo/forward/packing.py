"""Padding-free passes: a pass's rows packed end to end, and the choice of a pass's layout by its FLOPs.

A log-prob or training pass pads each row (prompt + completion) to the pass's longest; in RL runs the
completions' lengths vary widely, so much of that forward is padding. Packed, the rows' real tokens go
end to end into a few "bins" of ``capacity`` tokens (first-fit decreasing), each row's positions
restarting at 0, with no attention mask: transformers (>= 4.56) then reads the restarts of
``position_ids`` as sequence boundaries and keeps every row's attention inside its own tokens (a
block-diagonal causal mask for sdpa/eager, variable-length kernels for flash-attention). The hidden
states that predict the completion tokens are gathered out and go to the chunked head
(:mod:`rloo.forward.lm_head`).

Which models: those whose attention honours packed positions. :func:`packs_rows` checks it once per
model with a probe (no gradient, eval mode): a row's logits must not change, bit for bit, when the row
packed before it changes (no attention or state leaks across rows: a state-space or linear-attention
layer fails), and must match the row run alone (positions restart). Vision-language inputs, a router
aux loss, a head the chunked path cannot reproduce, and lockstep passes (FSDP: every rank must run the
same forwards) are never packed.

Which layout a pass takes (:func:`choose_layout`) is a FLOPs comparison, per pass, of:

- ``plain``: one forward of N rows x L (the longest prompt + completion), attention N x L^2;
- ``shared``: each distinct prompt once, then the completions in length buckets
  (:mod:`rloo.forward.shared_prompt`);
- ``packed``: B bins x capacity C tokens; attention B x C^2 where the kernel computes the masked
  block-diagonal densely (sdpa, eager), or the sum of the rows' L_i^2 where it skips it
  (flash-attention's variable-length kernels, flex attention).

A forward costs ``2 x P`` FLOPs per token (P: the non-embedding weights a token multiplies; the LM head is
applied to the same completion tokens in every layout and is left out), ``4 x heads x head_dim`` summed over layers
per (query, key) pair, and a fixed cost per forward of some tokens' worth, measured on a GPU
(:mod:`rloo.forward.forward_overhead`: ~10^4 token-rows there, a few dozen on a CPU). The same cost
model gives the least FLOPs any layout could reach (:func:`minimum_flops`: every prompt once, no
padding, attention only to a row's own tokens), which the benchmark reports ratios to.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rloo.forward.forward_overhead import forward_overhead
from rloo.forward.layers import per_layer, text_config
from rloo.forward.lm_head import (
    ChunkScore,
    HeadInputs,
    Logprobs,
    chunkable_head,
    chunked_head_logprobs,
    matches_model_logits,
)
from rloo.forward.shared_prompt import distinct_prompts, length_buckets

# each probed model's verdict (:func:`packs_rows`): a fact of the model, never of a pass's history
_PACKS: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
_COSTS: weakref.WeakKeyDictionary[nn.Module, ForwardCost] = weakref.WeakKeyDictionary()
# attention implementations whose kernels skip what a packed mask hides (cost: the rows' own pairs)
VARLEN_ATTENTION = ("flash", "flex")


@dataclass(frozen=True)
class ForwardCost:
    """FLOPs of a forward: ``per_token`` (``2 x`` non-embedding weights), ``per_pair`` (one query
    attending one key: ``4 x sum over layers of heads x head_dim``), ``per_forward`` (a fixed cost), and whether
    packed attention costs only each row's own pairs (``varlen``)."""

    per_token: float
    per_pair: float
    per_forward: float
    varlen: bool = False


def forward_cost(model: nn.Module) -> ForwardCost:
    """``model``'s :class:`ForwardCost`, from its parameters and (text) config (computed once per model)."""
    if model not in _COSTS:
        _COSTS[model] = _forward_cost(model)
    return _COSTS[model]


def _forward_cost(model: nn.Module) -> ForwardCost:
    config = text_config(model)
    tables = [getattr(model, name, lambda: None)() for name in ("get_input_embeddings", "get_output_embeddings")]
    skip = {id(p) for table in tables if isinstance(table, nn.Module) for p in table.parameters()}
    weights = sum(p.numel() for p in model.parameters() if id(p) not in skip)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    heads = per_layer(config, "num_attention_heads", 1)
    # per layer: Gemma 4's full-attention layers have a larger head_dim than its sliding ones
    head_dims = per_layer(config, "head_dim", None)
    query_dims = sum(
        int(h) * int(d or (hidden // int(h) if hidden else 64)) for h, d in zip(heads, head_dims, strict=True)
    )
    implementation = str(getattr(config, "_attn_implementation", None) or "")
    per_token = 2.0 * weights
    return ForwardCost(
        per_token=per_token,
        per_pair=4.0 * query_dims,
        per_forward=forward_overhead(model) * per_token,  # measured on a GPU, a CPU constant elsewhere
        varlen=any(name in implementation for name in VARLEN_ATTENTION),
    )


def plain_flops(lengths: Sequence[int], cost: ForwardCost) -> float:
    """One forward of every row padded to the longest ``L``: ``N x L`` tokens, ``N x L^2`` pairs."""
    longest = max(lengths, default=0)
    rows = len(lengths)
    return rows * longest * cost.per_token + rows * longest**2 * cost.per_pair + cost.per_forward


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Rows (indices into ``lengths``) in bins of at most ``capacity`` tokens, first-fit decreasing; each
    bin's rows in the order placed. Every row is in exactly one bin (``capacity`` >= the longest row)."""
    if lengths and capacity < max(lengths):
        raise ValueError(f"a bin of {capacity} tokens cannot hold a row of {max(lengths)}")
    bins: list[list[int]] = []
    free: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda r: -lengths[r]):
        place = next((b for b, room in enumerate(free) if room >= lengths[row]), None)
        if place is None:
            bins.append([])
            free.append(capacity)
            place = len(bins) - 1
        bins[place].append(row)
        free[place] -= lengths[row]
    return bins


def packed_flops(lengths: Sequence[int], bins: list[list[int]], capacity: int, cost: ForwardCost) -> float:
    """One forward of ``len(bins)`` rows of ``capacity`` tokens: ``B x C`` tokens; attention ``B x C^2``
    pairs (dense kernels) or the rows' own ``sum L_i^2`` (``cost.varlen``)."""
    pairs = sum(length**2 for length in lengths) if cost.varlen else len(bins) * capacity**2
    return len(bins) * capacity * cost.per_token + pairs * cost.per_pair + cost.per_forward


def best_packing(lengths: Sequence[int], cost: ForwardCost) -> tuple[int, list[list[int]], float]:
    """``(capacity, bins, flops)`` of the cheapest packing: capacities from the longest row doubling up to
    every row in one bin (one bin: the fewest padded tokens; narrower bins: less dense attention)."""
    total, capacity = sum(lengths), max(lengths)
    best: tuple[int, list[list[int]], float] | None = None
    while True:
        bins = pack_rows(lengths, capacity)
        flops = packed_flops(lengths, bins, capacity, cost)
        if best is None or flops < best[2]:
            best = (capacity, bins, flops)
        if capacity >= total or len(bins) == 1:
            return best
        capacity = min(2 * capacity, total)


def shared_flops(
    prompt_lengths: Sequence[int], completion_lengths: Sequence[int], inverse: Sequence[int], cost: ForwardCost
) -> float:
    """The shared path's forwards (:mod:`rloo.forward.shared_prompt`): the ``U`` distinct prompts once,
    padded to the longest ``Tp`` (``U x Tp`` tokens, ``U x Tp^2`` pairs), then each length bucket's ``n_b``
    rows of ``L_b`` completion tokens attending the ``Tp`` prompt columns and their own
    (``n_b x L_b`` tokens, ``n_b x L_b x (Tp + L_b)`` pairs); ``inverse``: each row's distinct prompt."""
    distinct = len(set(inverse))
    tp = max(prompt_lengths, default=0)
    flops = distinct * tp * cost.per_token + distinct * tp**2 * cost.per_pair + cost.per_forward
    forwarded = [max(length - 1, 0) for length in completion_lengths]  # the first is the prompt forward's
    for bucket in length_buckets(forwarded, cost.per_forward / cost.per_token if cost.per_token else 0.0):
        width = max(forwarded[row] for row in bucket)
        if width == 0:
            continue
        flops += len(bucket) * width * cost.per_token + len(bucket) * width * (tp + width) * cost.per_pair
        flops += cost.per_forward
    return flops


def minimum_flops(
    prompt_lengths: Sequence[int], completion_lengths: Sequence[int], inverse: Sequence[int], cost: ForwardCost
) -> float:
    """The least any layout could cost: each distinct prompt's ``p`` real tokens once (``p^2`` pairs), each
    completion's real tokens but its last (only predicted, never an input) once (``(c - 1) x (p + c - 1)``
    pairs), no padding, one forward."""
    prompts: dict[int, int] = {}
    for row, group in enumerate(inverse):
        prompts[group] = prompt_lengths[row]
    flops = sum(p * cost.per_token + p**2 * cost.per_pair for p in prompts.values()) + cost.per_forward
    for row, c in enumerate(completion_lengths):
        fed = max(c - 1, 0)
        flops += fed * cost.per_token + fed * (prompt_lengths[row] + fed) * cost.per_pair
    return flops


@dataclass(frozen=True)
class RowLengths:
    """A pass's per-row lengths on the host, read in one device-to-host copy (:meth:`of`) and handed down,
    so the layout choice, the packing and the buckets make no host syncs of their own. ``prompt``: real
    prompt tokens; ``completion``: up to the last real completion token (right-padded); ``contiguous``:
    left-padded prompts and right-padded completions with no holes, and no empty prompt."""

    prompt: list[int]
    completion: list[int]
    contiguous: bool

    @classmethod
    def of(cls, prompt_mask: Tensor, completion_mask: Tensor) -> RowLengths:
        p, c = prompt_mask.bool(), completion_mask.bool()
        columns = torch.arange(1, c.shape[1] + 1, device=c.device)
        last = torch.where(c, columns, 0).amax(dim=1) if c.shape[1] else c.new_zeros(c.shape[0], dtype=torch.long)
        holes = (p[:, 1:] < p[:, :-1]).any() | (c[:, 1:] > c[:, :-1]).any() | ~p.any(dim=1).all()
        values = torch.cat([p.sum(dim=1), last, holes.long().view(1)]).tolist()  # the one host read
        n = p.shape[0]
        return cls(values[:n], values[n : 2 * n], not values[-1])


@dataclass(frozen=True)
class LayoutChoice:
    """A pass's layout (``plain``, ``shared`` or ``packed``), the bins of a packed one, each layout's FLOPs,
    and what the choice read: the rows' :class:`RowLengths` and their distinct prompts."""

    layout: str
    bins: list[list[int]] | None
    capacity: int
    flops: dict[str, float]
    lengths: RowLengths | None = None
    groups: tuple[Tensor, Tensor] | None = None  # the shared path's distinct prompts, where it was considered


def choose_layout(
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_mask: Tensor,
    cost: ForwardCost,
    *,
    shared: bool,
    packed: bool,
    lengths: RowLengths | None = None,
) -> LayoutChoice:
    """The layout of a pass of these prompts ``(N, Tp)`` and completion mask ``(N, Tc)``: packed (where
    ``packed`` allows it) when it costs fewer FLOPs than the pass would otherwise take, which is the shared
    path where ``shared`` allows it and some prompt repeats (it always runs there: its own buckets weigh it
    against padding), else plain. ``flops``: each layout considered, plain always (for reports).
    ``lengths``: the rows' :class:`RowLengths` where the caller has read them."""
    lengths = lengths or RowLengths.of(prompt_mask, completion_mask)
    prompt_lengths, completion_lengths = lengths.prompt, lengths.completion
    rows = [p + max(c - 1, 0) for p, c in zip(prompt_lengths, completion_lengths, strict=True)]  # (:func:`pack`)
    flops = {"plain": plain_flops([prompt_mask.shape[1] + completion_mask.shape[1]] * len(rows), cost)}
    groups = distinct_prompts(prompt_ids, prompt_mask) if shared else None
    if groups is not None:
        flops["shared"] = shared_flops(prompt_lengths, completion_lengths, groups[1].tolist(), cost)
    base = "shared" if "shared" in flops else "plain"
    if packed and rows:
        capacity, bins, flops["packed"] = best_packing(rows, cost)
        if flops["packed"] < flops[base]:
            return LayoutChoice("packed", bins, capacity, flops, lengths, groups)
    return LayoutChoice(base, None, 0, flops, lengths, groups)


def host_to_device(values: list[int], device: torch.device) -> Tensor:
    """``values`` as a long tensor on ``device``; to a GPU through pinned memory without waiting (a
    blocking host-to-device copy synchronizes the stream)."""
    tensor = torch.tensor(values, dtype=torch.long)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class Packed:
    """Rows packed into bins: ``input_ids``/``position_ids`` ``(B, C)`` and, per real completion token in
    row-major ``(N, Tc)`` order, the flat index ``(M,)`` of the position that predicts it."""

    input_ids: Tensor
    position_ids: Tensor
    predictors: Tensor


def pack(
    prompt_ids: Tensor, completion_ids: Tensor, lengths: RowLengths, bins: list[list[int]], capacity: int
) -> Packed:
    """Each row's real prompt then completion tokens but the last (only predicted), its positions
    ``0..len-1``, placed in its bin; a bin's unused tail gets token 0 at positions restarting at 0 (a
    sequence of its own, attended by nothing). Rows are contiguous (``lengths.contiguous``): a row's
    tokens are one run of ``[prompt | completion]`` from its first real prompt column, so the bins are one
    gather over those rows, its indices built on the host from ``lengths`` (no host sync)."""
    device = prompt_ids.device
    tp, width = prompt_ids.shape[1], prompt_ids.shape[1] + completion_ids.shape[1]
    rows = torch.cat([prompt_ids, completion_ids], dim=1).flatten()
    pad = rows.shape[0]  # the index of a 0 appended after the rows: the bins' unused tails
    gather: list[int] = []
    positions: list[int] = []
    where: dict[int, int] = {}  # each row's first flat index in the bins
    for b, bin_rows in enumerate(bins):
        offset = 0
        for row in bin_rows:
            n = lengths.prompt[row] + max(lengths.completion[row] - 1, 0)
            start = row * width + tp - lengths.prompt[row]
            gather.extend(range(start, start + n))
            positions.extend(range(n))
            where[row] = b * capacity + offset
            offset += n
        gather.extend([pad] * (capacity - offset))
        positions.extend(range(capacity - offset))
    predictors = [
        where[row] + lengths.prompt[row] - 1 + j
        for row in range(len(lengths.prompt))
        for j in range(lengths.completion[row])
    ]
    ids = torch.cat([rows, rows.new_zeros(1)]).index_select(0, host_to_device(gather, device))
    return Packed(
        ids.view(len(bins), capacity),
        host_to_device(positions, device).view(len(bins), capacity),
        host_to_device(predictors, device),
    )


def packs_rows(model: nn.Module) -> bool:
    """Whether ``model`` keeps packed rows apart (module docstring): probed once per model, no gradient,
    in eval mode (dropout off). Row B's logits after row A and after a different A' of the same length
    must be equal bit for bit, and close to B's logits alone (positions restart)."""
    if model in _PACKS:
        return _PACKS[model]
    head = chunkable_head(model)
    if head is None:
        return False
    device = next(model.parameters()).device
    high = max(2, min(int(getattr(head, "weight").shape[0]), 1000))  # noqa: B009 (typed as a Tensor)
    generator = torch.Generator().manual_seed(0)
    a, other, b = (torch.randint(1, high, (n,), generator=generator).to(device) for n in (7, 7, 5))

    def logits_of_b(before: Tensor | None) -> Tensor:
        ids = b if before is None else torch.cat([before, b])
        positions = torch.arange(b.shape[0], device=device)
        if before is not None:
            positions = torch.cat([torch.arange(before.shape[0], device=device), positions])
        logits: Tensor = model(input_ids=ids[None], position_ids=positions[None], use_cache=False).logits
        return logits[0, -b.shape[0] :].float()

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            after_a, after_other, alone = logits_of_b(a), logits_of_b(other), logits_of_b(None)
    except Exception:  # a forward that needs more than token ids and positions (e.g. 3-D positions): not packed
        _PACKS[model] = False
        return False
    finally:
        model.train(was_training)
    low_precision = any(p.dtype in (torch.bfloat16, torch.float16) for p in model.parameters()) or (
        torch.is_autocast_enabled(device.type)
    )
    tolerance = (3e-2 if low_precision else 1e-4) * (1.0 + float(alone.abs().max()))
    _PACKS[model] = torch.equal(after_a, after_other) and float((after_a - alone).abs().max()) <= tolerance
    return _PACKS[model]


def packed_logprobs(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    choice: LayoutChoice,
    score: ChunkScore,
    with_entropy: bool,
    chunk_elements: int | None = None,
) -> Logprobs | None:
    """Log-probs (and entropies) ``(N, Tc)`` as :func:`rloo.forward.logprobs.completion_logprobs` (text
    rows, no aux loss) from one forward of the rows packed in ``choice``'s bins; 0 at padding. None where
    the plain pass must run (a head the chunked path cannot reproduce, rows with holes in their masks)."""
    head = chunkable_head(model)
    lengths = choice.lengths or RowLengths.of(prompt_mask, completion_mask)
    if head is None or choice.bins is None or not lengths.contiguous:
        return None
    packed = pack(prompt_ids, completion_ids, lengths, choice.bins, choice.capacity)
    with HeadInputs(head) as inputs:
        out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False)
    hidden = inputs.hidden
    if hidden is None or not matches_model_logits(model, head, hidden, out.logits):
        return None
    predicting = hidden.reshape(-1, hidden.shape[-1]).index_select(0, packed.predictors)
    ids = completion_ids[completion_mask.bool()]
    ones = torch.ones(1, ids.shape[0], dtype=torch.bool, device=ids.device)
    logprobs, entropy = chunked_head_logprobs(
        model, head, predicting[None], ids[None], ones, score, with_entropy, chunk_elements
    )
    real = completion_mask.bool()

    def place(values: Tensor) -> Tensor:
        return values.new_zeros(real.shape).masked_scatter(real, values[0])

    return place(logprobs), None if entropy is None else place(entropy)
