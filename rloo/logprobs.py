"""Log-probabilities of completion tokens under a model (policy or reference).

``log pi(y_t | x, y_<t) = z[y_t] / T - logsumexp(z / T)`` with z the logits and T the
sampling temperature (as TRL), computed for the sampled tokens only ("selective"), in row
chunks so the full-vocabulary log-softmax is never materialized for the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rloo.metrics import entropy_from_logits
from rloo.rollout import position_ids_from_mask


def selective_logprobs(logits: Tensor, token_ids: Tensor, chunk_rows: int = 8) -> Tensor:
    """``logits[b, t, ids[b, t]] - logsumexp(logits[b, t])``: ``(B, T, V), (B, T) -> (B, T)``.

    Works on ``chunk_rows`` rows at a time in float32 to bound the temporary memory.
    """
    pieces = []
    for start in range(0, logits.shape[0], chunk_rows):
        z = logits[start : start + chunk_rows].float()
        picked = z.gather(-1, token_ids[start : start + chunk_rows].unsqueeze(-1)).squeeze(-1)
        pieces.append(picked - torch.logsumexp(z, dim=-1))
    return torch.cat(pieces, dim=0)


@dataclass
class TokenLogprobs:
    """``logprobs``: ``(N, Tc)``; ``entropy``: ``(N, Tc)`` or None."""

    logprobs: Tensor
    entropy: Tensor | None


def completion_logprobs(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_attention: Tensor,
    temperature: float,
    with_entropy: bool = False,
    entropy_requires_grad: bool = False,
) -> TokenLogprobs:
    """Per-token log-probs of ``completion_ids`` given the prompts, in one forward pass.

    prompt_ids/prompt_mask: ``(N, Tp)`` left-padded; completion_ids/completion_attention:
    ``(N, Tc)`` right-padded (attention 1 on real tokens). Gradients flow unless the
    caller disables them. ``entropy`` (of the temperature-scaled distribution) carries a
    gradient only with ``entropy_requires_grad`` (for an entropy bonus); else it is a metric.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention = torch.cat([prompt_mask, completion_attention.to(prompt_mask.dtype)], dim=1)
    tc = completion_ids.shape[1]
    logits = model(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=position_ids_from_mask(attention),
        logits_to_keep=tc + 1,
        use_cache=False,
    ).logits
    logits = logits[:, :-1] / temperature
    logprobs = selective_logprobs(logits, completion_ids)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_requires_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_requires_grad else logits.detach())
    return TokenLogprobs(logprobs, entropy)
