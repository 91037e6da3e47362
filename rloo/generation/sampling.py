"""Next-token sampling: logits processors and one fused sampling step. Pure torch.

The processors follow ``transformers``' order and semantics: repetition penalty, then
temperature, top-k, top-p, min-p. The log-probability recorded for a sampled token is
``log_softmax(logits / temperature)`` *before* the penalty and the truncations: the same
quantity the trainer's forward pass computes (TRL does the same), so it can serve as the
sampling policy's log-prob.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class SamplingParams:
    """Sampling knobs; the defaults sample from the unmodified distribution."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float | None = None
    repetition_penalty: float = 1.0

    @classmethod
    def from_config(cls, args: Any) -> SamplingParams:
        """The sampling knobs of an ``RLOOConfig``."""
        return cls(args.temperature, args.top_k, args.top_p, args.min_p, args.repetition_penalty)

    @property
    def plain(self) -> bool:
        """The tokens are drawn from ``softmax(logits / T)`` itself: no repetition penalty, top-k, top-p or
        min-p, so the sampling distribution is the one rloo scores (its log-probs are the full support's)."""
        return self.repetition_penalty == 1.0 and self.top_k <= 0 and self.top_p >= 1.0 and not self.min_p


def apply_repetition_penalty(logits: Tensor, history: Tensor, penalty: float) -> Tensor:
    """CTRL's penalty on every token in ``history``: ``z/p`` if ``z > 0`` else ``z*p``.

    logits: ``(B, V)``; history: ``(B, L)`` token ids seen so far (prompt + generated).
    """
    if penalty == 1.0:
        return logits
    seen = torch.gather(logits, 1, history)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, history, seen)


def apply_top_k(logits: Tensor, top_k: int) -> Tensor:
    """Keep the ``top_k`` largest logits per row (ties at the threshold kept); 0 disables."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    threshold = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < threshold, -torch.inf)


def apply_top_p(logits: Tensor, top_p: float) -> Tensor:
    """Nucleus: keep the smallest set of tokens whose probability reaches ``top_p``."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    # drop a token when the tokens ranked before it already reach top_p (the first always stays)
    drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, -torch.inf)


def apply_min_p(logits: Tensor, min_p: float | None) -> Tensor:
    """Drop tokens with ``p < min_p * max_p``; None or 0 disables."""
    if not min_p:
        return logits
    probs = torch.softmax(logits, dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, -torch.inf)


def completion_seed(seed: int, group_id: int, sample: int) -> int:
    """The seed of sample ``sample`` of the prompt with ``group_id``: ``((seed * 1_000_003 + group_id)
    * 1_009 + sample) mod 2^63``."""
    return ((seed * 1_000_003 + group_id) * 1_009 + sample) % (2**63)


def completion_uniforms(seed: int, group_ids: Sequence[int], k: int, steps: int, device: torch.device) -> Tensor:
    """``(len(group_ids) * k, steps)`` uniforms, row ``(g, j)`` drawn from its own generator seeded
    with :func:`completion_seed`: a completion's randomness depends on the run's seed, its
    prompt's group id and ``j`` only, not on the batch or the process it is sampled in, so a
    run on any number of processes samples the same completions as one process."""
    rows = [
        torch.rand(steps, generator=torch.Generator().manual_seed(completion_seed(seed, g, j)))
        for g in group_ids
        for j in range(k)
    ]
    return torch.stack(rows).to(device)


def sample_categorical(probs: Tensor, generator: torch.Generator | None, u: Tensor | None = None) -> Tensor:
    """One draw per row from unnormalized probabilities ``(B, V) -> (B,)``, by inverse CDF.

    ``i = min{i : cdf_i > u * cdf_V}`` with one uniform ``u`` per row: the same distribution
    as ``torch.multinomial``, which on CPU draws V exponentials per row (the largest cost of
    sampling with a 32k vocabulary). A token of probability 0 is never drawn: the target is
    kept strictly below the total, and ``cdf`` does not rise at such a token. ``u``: ``(B,)`` (or
    ``(B, 1)``) uniforms to use instead of drawing them from ``generator``.
    """
    return _inverse_cdf(probs, generator, u).squeeze(1)


def _inverse_cdf(probs: Tensor, generator: torch.Generator | None, u: Tensor | None) -> Tensor:
    """:func:`sample_categorical`'s draws as a column ``(B, 1)``, the index shape ``gather`` takes."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    if u is None:
        u = torch.rand(total.shape, generator=generator, device=probs.device, dtype=probs.dtype)
    else:
        u = u.to(probs.dtype)
        u = u.unsqueeze(1) if u.dim() == 1 else u
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).clamp_(max=probs.shape[-1] - 1)


def sample_next_token(
    logits: Tensor,
    history: Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    uniforms: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Sample one token per row.

    Args:
        logits: ``(B, V)`` raw next-token logits. history: ``(B, L)`` ids seen so far.
        uniforms: ``(B,)`` or ``(B, 1)`` the draw of each row (see :func:`completion_uniforms`), or
            None to draw from ``generator``.

    Returns:
        ``(tokens (B,), logprobs (B,))`` with ``logprobs = log_softmax(logits / T)[token]``.

    ``temperature == 0`` is greedy decoding (the penalized argmax, as transformers'
    ``do_sample=False``), with ``log_softmax(logits)`` as the log-prob: never a division by 0.
    """
    logits = logits.float()
    if params.temperature == 0:
        penalized = apply_repetition_penalty(logits, history, params.repetition_penalty)
        tokens = penalized.argmax(dim=-1)
        return tokens, torch.log_softmax(logits, dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    scaled = logits / params.temperature if params.temperature != 1.0 else logits
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    if params.plain:  # the sampling distribution is the scored one: one softmax serves both
        probs = (scaled - lse).exp_()
    else:
        processed = apply_repetition_penalty(logits, history, params.repetition_penalty) / params.temperature
        processed = apply_min_p(apply_top_p(apply_top_k(processed, params.top_k), params.top_p), params.min_p)
        probs = torch.softmax(processed, dim=-1)
    tokens = _inverse_cdf(probs, generator, uniforms)  # (B, 1): gathered without an unsqueeze
    # z[y] - lse per row, the same float32 subtraction as log_softmax's entry: its value exactly
    logprobs = scaled.gather(1, tokens) - lse
    return tokens.squeeze(1), logprobs.squeeze(1)
