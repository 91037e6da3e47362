"""The LM head applied chunk by chunk: completion log-probs without a ``(rows, T, V)`` logits tensor.

A causal LM's forward ends with ``logits = lm_head(h)`` over every kept position: ``rows x Tc x V``
floats (2 GiB in float32 for 16 rows of 1k tokens at a 32k vocabulary, 10 GiB at 150k), plus its
float32 copy and gradient in the backward. Here a forward pre-hook on the model's output embeddings
takes the final hidden states ``h`` (the head's input) and hands the head only each row's first
position, and the log-probs (and entropies) of the completion tokens are computed by applying the
head to chunks of real tokens whose float32 logits fit ``max_logits_memory_mb`` (64 MiB when no
budget is given; padding positions are skipped: their log-probs are 0). With gradient, each chunk
is a ``torch.utils.checkpoint``: its logits are recomputed in the backward instead of kept, so the
peak holds one chunk's logits whatever the vocabulary, rows and length; passes are then not split by
rows for the logits' sake (:func:`head_is_exact` tells the planner before the first pass).

Exactness: the model's own logits of each row's first position (with whatever it does after the
head) are compared, bit for bit, with the head applied here to the same hidden states, followed by
Gemma2/3's ``final_logit_softcapping`` when the config sets one. A model that does anything else
after its head (a logit scale or multiplier, e.g. Granite's ``logits_scaling``) fails that check: the pass
is run again the plain way and that head is never chunked again. A model with no output embeddings
module, compiled with ``torch.compile`` (a hook would recompile it), or sharded by FSDP (the head is
called outside the forward that gathers its weight) always takes the plain path.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from rloo.forward.fused_head import fused_head_logprobs

# a mixed-precision context (accelerate's ``autocast``), or ``contextlib.nullcontext``
Autocast = Callable[[], AbstractContextManager[Any]]
# log-prob passes whose model's head did not pass the check: the plain path from then on
_INEXACT_HEADS: weakref.WeakSet[nn.Module] = weakref.WeakSet()
# elements of one chunk's float32 logits (64 MiB) when the caller gives no budget
CHUNK_ELEMENTS = 2**24
# each probed head's verdict per precision (:func:`head_is_exact`): a fact of the model and the dtype its
# product is computed in, never of a pass's history
_PROBED: weakref.WeakKeyDictionary[nn.Module, dict[str, bool]] = weakref.WeakKeyDictionary()


def _output_head(model: nn.Module) -> nn.Module | None:
    """The model's LM head, or None: compiled, no head, or a head sharded by FSDP (its weight a
    DTensor, gathered only inside the model's own forward)."""
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        return None
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    weight = getattr(head, "weight", None) if isinstance(head, nn.Module) else None
    return None if weight is None or isinstance(weight, DTensor) else head


def chunkable_head(model: nn.Module) -> nn.Module | None:
    """The module the chunked path applies as ``model``'s head, or None where it takes the plain path."""
    head = _output_head(model)
    return None if head is None or head in _INEXACT_HEADS else head


def _softcap(model: nn.Module) -> float | None:
    """Gemma2/3's ``final_logit_softcapping`` (the text config's, for a vision-language model), or None."""
    config = getattr(model, "config", None)
    for candidate in (config, getattr(config, "text_config", None)):
        cap = getattr(candidate, "final_logit_softcapping", None)
        if cap:
            return float(cap)
    return None


class HeadInputs:
    """A forward pre-hook on the head for one forward: keeps the head's input ``hidden`` and hands the
    head its first position only. Use as a context manager around the model's forward."""

    def __init__(self, head: nn.Module) -> None:
        self.head, self.hidden = head, None
        self._handle: Any = None

    def _hook(self, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        self.hidden = args[0]
        return (_first_positions(args[0]), *args[1:])

    def __enter__(self) -> HeadInputs:
        self._handle = self.head.register_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.remove()


def _first_positions(hidden: Tensor) -> Tensor:
    """``hidden[:, :1]``, contiguous: a strided ``(rows, 1, D)`` view that cannot be viewed as a matrix
    sends the head's matmul to a batched product (one pass over the head's weight per row: 0.2 s for 64
    rows at a 32k vocabulary on a CPU) where one matrix product reads it once."""
    return hidden[:, :1].contiguous()


def head_logits(head: nn.Module, hidden: Tensor, softcap: float | None) -> Tensor:
    """``head(hidden)``, soft-capped as Gemma2/3 do: ``tanh(z / cap) * cap``."""
    logits: Tensor = head(hidden)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def head_is_exact(model: nn.Module, ids: Tensor, autocast: Autocast = contextlib.nullcontext) -> bool:
    """Whether ``model``'s log-prob passes take the chunked head: :func:`chunkable_head`, and a forward
    of ``ids`` ``(1, L)`` (a probe, once per head and precision, no gradient) gives the head's own logits.
    Lets a caller size passes for the chunked path before running one; False when the probe cannot run.

    ``autocast``: the mixed-precision context the passes run in. The probe compares the model's logits
    with the head's product bit for bit, so both must be computed in the passes' precision: under bf16
    autocast (accelerate's wrapper keeps its own autocast on the forward) a float32 product never equals
    the bf16-rounded logits, and a probe outside autocast planned every pass of a 151,936-token
    vocabulary as one row. The verdict depends on the model and the precision only (not on which passes
    ran before), so a resumed run plans its passes as the run it resumes."""
    head = _output_head(model)
    if head is None:
        return False
    with autocast():
        precision = _precision(head)
        if precision not in _PROBED.get(head, {}):
            with torch.no_grad(), HeadInputs(head) as inputs:
                try:
                    out = model(input_ids=ids, use_cache=False)
                except (ValueError, TypeError, RuntimeError):  # a forward that needs more inputs than token ids
                    return False  # its passes, with their inputs, still check the head themselves
            verdict = matches_model_logits(model, head, inputs.hidden, out.logits)
            _PROBED.setdefault(head, {})[precision] = verdict
        return _PROBED[head][precision]


def _precision(head: nn.Module) -> str:
    """The dtype the head's product is computed in here: the autocast dtype where autocast is on for
    the head's device, else its weight's dtype."""
    weight: Tensor = getattr(head, "weight")  # noqa: B009 (typed as a Tensor here)
    device = weight.device.type
    if torch.is_autocast_enabled(device):
        return str(torch.get_autocast_dtype(device))
    return str(weight.dtype)


def matches_model_logits(model: nn.Module, head: nn.Module, hidden: Tensor | None, model_logits: Tensor) -> bool:
    """Whether the model's logits of each row's first kept position are the head's here, bit for bit."""
    if hidden is None:
        return False
    with torch.no_grad():
        ours = head_logits(head, _first_positions(hidden), _softcap(model))
    return ours.shape == model_logits.shape and torch.equal(ours.float(), model_logits.float())


ChunkScore = Callable[[Tensor, Tensor], tuple[Tensor, Tensor | None]]
Logprobs = tuple[Tensor, Tensor | None]


def chunked_logprobs(
    model: nn.Module,
    forward: Callable[[], Any],
    token_ids: Tensor,
    mask: Tensor,
    score: ChunkScore,
    with_entropy: bool,
    chunk_elements: int | None = None,
) -> tuple[Any, Logprobs] | None:
    """``forward()``'s output (its ``logits`` only each row's first position) and the log-probs (and
    entropies) of ``token_ids`` ``(N, Tc)`` by the chunked head (:func:`chunked_head_logprobs`); None
    when ``model`` takes the plain path (:func:`chunkable_head`) or its logits fail the check, which
    also sends its later passes the plain way."""
    head = chunkable_head(model)
    if head is None:
        return None
    with HeadInputs(head) as inputs:
        out = forward()
    hidden = inputs.hidden
    if (
        hidden is None
        or hidden.shape[:2] != token_ids.shape
        or not matches_model_logits(model, head, hidden, out.logits)
    ):
        _INEXACT_HEADS.add(head)
        return None
    return out, chunked_head_logprobs(model, head, hidden, token_ids, mask, score, with_entropy, chunk_elements)


def chunked_head_logprobs(
    model: nn.Module,
    head: nn.Module,
    hidden: Tensor,
    token_ids: Tensor,
    mask: Tensor,
    score: ChunkScore,
    with_entropy: bool,
    chunk_elements: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) ``(N, Tc)`` of ``token_ids`` from the head's inputs ``hidden``
    ``(N, Tc, D)``, chunk by chunk over the real tokens of ``mask``; 0 at padding.

    ``score(logits (1, n, V), ids (1, n))`` turns one chunk's logits into its ``(1, n)`` log-probs and
    entropies (or None). With gradient enabled each chunk is checkpointed (logits recomputed in backward).
    ``chunk_elements``: logits per chunk (None: :data:`CHUNK_ELEMENTS`). Where
    :func:`rloo.forward.fused_head.head_kernel` picks the fused head (CUDA with Triton, or
    ``RLOO_LM_HEAD_KERNEL=fused``), it computes the same from ``hidden`` with no float32 logits chunk.
    """
    softcap = _softcap(model)
    real = mask.bool()
    flat_hidden, flat_ids = hidden[real], token_ids[real]
    elements = chunk_elements or CHUNK_ELEMENTS
    fused = fused_head_logprobs(head, flat_hidden, flat_ids, score, softcap, elements)  # this device's kernel
    if fused is not None:
        return _scatter([fused[0]], real), None if fused[1] is None else _scatter([fused[1]], real)

    def chunk(h: Tensor, ids: Tensor) -> tuple[Tensor, Tensor | None]:
        return score(head_logits(head, h.unsqueeze(0), softcap), ids.unsqueeze(0))

    weight: Tensor = getattr(head, "weight")  # noqa: B009 (typed as a Tensor here)
    size = max(1, elements // int(weight.shape[0]))
    logprobs, entropies = [], []
    for start in range(0, flat_ids.shape[0], size):
        h, ids = flat_hidden[start : start + size], flat_ids[start : start + size]
        if torch.is_grad_enabled() and h.requires_grad:
            lp, entropy = checkpoint(chunk, h, ids, use_reentrant=False)
        else:
            lp, entropy = chunk(h, ids)
        logprobs.append(lp[0])
        if entropy is not None:
            entropies.append(entropy[0])
    return _scatter(logprobs, real), _scatter(entropies, real) if with_entropy else None


def _scatter(values: list[Tensor], real: Tensor) -> Tensor:
    """The real tokens' values back at their ``(N, Tc)`` places, 0 elsewhere."""
    flat = torch.cat(values) if values else real.new_zeros(0, dtype=torch.float32)
    return flat.new_zeros(real.shape).masked_scatter(real, flat)
