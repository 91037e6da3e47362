"""Log-probabilities of completion tokens under a model (policy or reference).

``log pi(y_t | x, y_<t) = z[y_t] - logsumexp(z)`` with ``z = logits / T`` and T the
sampling temperature (as TRL), computed for the sampled tokens only ("selective"). By default the
LM head itself is applied chunk by chunk over the real completion tokens
(:mod:`rloo.forward.lm_head`), so neither the ``(N, Tc, V)`` logits nor their log-softmax is ever
built; a model it cannot reproduce exactly gets the model's own logits, log-softmaxed in row chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from rloo.algo.stats import softmax_entropy
from rloo.forward.fused_head import HeadScoring
from rloo.forward.lean_mlp import lean_gated_mlps
from rloo.forward.lm_head import chunked_logprobs
from rloo.forward.packing import RowLengths, choose_layout, forward_cost, packed_logprobs, packs_rows
from rloo.forward.shared_prompt import may_share, shared_prompt_logprobs
from rloo.generation.multimodal import VisionInputs, prompt_positions


class _SelectiveLogprob(torch.autograd.Function):
    """``log p[y] = z[y] - logsumexp(z)`` with a one-pass backward.

    ``d log p[y] / dz = onehot(y) - softmax(z)``: the backward builds ``-softmax(z) * g`` and
    adds ``g`` at the target, instead of autograd's zero-filled gather gradient plus the
    logsumexp gradient plus their sum (three vocabulary-sized passes and two temporaries).
    """

    @staticmethod
    def forward(ctx: Any, z: Tensor, ids: Tensor) -> Tensor:
        lse = torch.logsumexp(z, dim=-1)
        ctx.save_for_backward(z, ids, lse)
        return z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - lse

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        z, ids, lse = ctx.saved_tensors
        grad_z = torch.exp(z - lse.unsqueeze(-1)).mul_(-grad.unsqueeze(-1))
        grad_z.scatter_add_(-1, ids.unsqueeze(-1), grad.unsqueeze(-1))
        return grad_z, None


def token_logprobs_and_entropy(
    logits: Tensor, token_ids: Tensor, temperature: float, with_entropy: bool, entropy_requires_grad: bool
) -> tuple[Tensor, Tensor | None]:
    """Log-probs of ``token_ids`` and entropies under ``softmax(logits / T)``, row chunk by row chunk.

    ``log p_t = z_t[y_t] - logsumexp(z_t)``, ``H_t = logsumexp(z_t) - sum_v p_tv z_tv`` with
    ``z = logits / T`` in float32. Each chunk's temporaries (the scaled logits, the softmax)
    are about 64 MiB, so no full-vocabulary ``(B, T, V)`` copy is made besides ``logits``.
    """
    rows = max(1, 2**24 // max(1, logits.shape[1] * logits.shape[2]))
    logprobs, entropies = [], []
    for start in range(0, logits.shape[0], rows):
        z = logits[start : start + rows].float()
        if temperature != 1.0:  # a division (and its backward) over the vocabulary saved
            z = z / temperature
        ids = token_ids[start : start + rows]
        if with_entropy and entropy_requires_grad and torch.is_grad_enabled():  # entropy bonus: plain autograd
            lse = torch.logsumexp(z, dim=-1)
            logprobs.append(z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - lse)
            entropies.append(softmax_entropy(z, lse))
            continue
        logprobs.append(_SelectiveLogprob.apply(z, ids))  # type: ignore[no-untyped-call]
        if with_entropy:
            with torch.no_grad():
                entropies.append(softmax_entropy(z.detach()))
    return torch.cat(logprobs), torch.cat(entropies) if with_entropy else None


@dataclass(frozen=True)
class TokenScore(HeadScoring):
    """A pass's chunk score: :func:`token_logprobs_and_entropy` of a chunk's logits at these settings,
    which the fused head (:mod:`rloo.forward.fused_head`) reads to compute the same from the head's inputs."""

    def __call__(self, logits: Tensor, ids: Tensor) -> tuple[Tensor, Tensor | None]:
        return token_logprobs_and_entropy(logits, ids, self.temperature, self.with_entropy, self.entropy_requires_grad)


def _laid_out_logprobs(
    model: nn.Module,
    rows: tuple[Tensor, Tensor, Tensor, Tensor],
    score: Any,
    with_entropy: bool,
    chunk: int | None,
    share_prompts: bool,
    padding_free: bool,
) -> tuple[Tensor, Tensor | None] | None:
    """The pass in the layout :func:`rloo.forward.packing.choose_layout` picks: rows packed (where
    ``padding_free`` and the model allow it and it costs fewer FLOPs), else prompts shared (where
    ``share_prompts`` allows it); None where the plain pass runs."""
    shared = share_prompts and may_share(model)
    packed = padding_free and packs_rows(model)
    if not (shared or packed):
        return None
    lengths = RowLengths.of(rows[1], rows[3])  # the pass's one host read of its lengths
    choice = choose_layout(*rows[:2], rows[3], forward_cost(model), shared=shared, packed=packed, lengths=lengths)
    if choice.layout == "packed":
        result = packed_logprobs(model, *rows, choice, score, with_entropy, chunk)
        if result is not None:
            return result
    if not shared:
        return None
    return shared_prompt_logprobs(
        model, *rows, score, with_entropy, chunk, completion_lengths=lengths.completion, groups=choice.groups
    )


@dataclass
class TokenLogprobs:
    """``logprobs``: ``(N, Tc)``; ``entropy``: ``(N, Tc)`` or None."""

    logprobs: Tensor
    entropy: Tensor | None
    aux_loss: Tensor | None = None  # a mixture-of-experts model's load-balancing loss, when asked for


def completion_logprobs(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float,
    with_entropy: bool = False,
    entropy_requires_grad: bool = False,
    with_aux_loss: bool = False,
    vision: VisionInputs | None = None,
    chunked_head: bool = True,
    share_prompts: bool = True,
    max_logits_mib: float | None = None,
    padding_free: bool = False,
) -> TokenLogprobs:
    """Per-token log-probs of ``completion_ids`` given the prompts, in one forward pass.

    prompt_ids/prompt_mask: ``(N, Tp)`` left-padded; completion_ids/completion_mask:
    ``(N, Tc)`` right-padded (attention 1 on real tokens). Gradients flow unless the
    caller disables them. ``entropy`` (of the temperature-scaled distribution) carries a
    gradient only with ``entropy_requires_grad`` (for an entropy bonus); else it is a metric.
    ``with_aux_loss``: ask a mixture-of-experts model for its router logits and return its ``aux_loss``.
    ``vision``: the rows' image inputs (a vision-language policy), as the sampler's prefill saw them.
    ``chunked_head``: apply the LM head chunk by chunk (:mod:`rloo.forward.lm_head`), never building
    ``(N, Tc, V)`` logits; padding positions then get 0 (the plain path gives the pad token's log-prob
    there): callers mask them either way. A model the chunked path cannot reproduce takes the plain one.
    ``share_prompts`` (with ``chunked_head``): rows with the same prompt share one forward of it and their
    completions run in length buckets (:mod:`rloo.forward.shared_prompt`), where the model and rows
    allow it. ``padding_free`` (with ``chunked_head``): the rows may be packed end to end
    (:mod:`rloo.forward.packing`), where the model keeps packed rows apart; each pass takes the layout
    (plain, shared prompts, packed) of the fewest FLOPs. ``max_logits_mib``: the
    chunked head's float32 logits per chunk (None: 64 MiB).
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    length, tc = input_ids.shape[1], completion_ids.shape[1]
    # the positions that predict the completion tokens: asking for exactly these avoids
    # slicing (and a full-size zero-filled gradient for the slice) on the logits
    positions = torch.arange(length - tc - 1, length - 1, device=input_ids.device)

    def forward() -> Any:
        return model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=prompt_positions(model, input_ids, attention, vision).position_ids,
            logits_to_keep=positions,
            use_cache=False,
            **({"output_router_logits": True} if with_aux_loss else {}),
            **({} if vision is None else vision.model_inputs(tc)),
        )

    with lean_gated_mlps(model):  # a training pass: the gated MLPs save two tensors of their width, not four
        score = TokenScore(temperature, with_entropy, entropy_requires_grad)
        chunk = None if max_logits_mib is None else max(1, int(max_logits_mib * 2**20) // 4)
        if chunked_head and (share_prompts or padding_free) and vision is None and not with_aux_loss:
            rows = (prompt_ids, prompt_mask, completion_ids, completion_mask)
            laid_out = _laid_out_logprobs(model, rows, score, with_entropy, chunk, share_prompts, padding_free)
            if laid_out is not None:
                return TokenLogprobs(*laid_out)
        fast = None
        if chunked_head:
            fast = chunked_logprobs(model, forward, completion_ids, completion_mask, score, with_entropy, chunk)
        if fast is not None:
            out, (logprobs, entropy) = fast
        else:  # the plain path: the model's (N, Tc, V) logits
            out = forward()
            logprobs, entropy = score(out.logits, completion_ids)
    # a model without routers in this configuration may return a plain 0 (GraniteMoeHybrid, transformers < 5.19)
    aux_loss = out.aux_loss if with_aux_loss and isinstance(out.aux_loss, Tensor) else None
    return TokenLogprobs(logprobs, entropy, aux_loss)
