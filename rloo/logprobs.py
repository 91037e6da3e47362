"""Log-probabilities of completion tokens under a model (policy or reference).

``log pi(y_t | x, y_<t) = z[y_t] - logsumexp(z)`` with ``z = logits / T`` and T the
sampling temperature (as TRL), computed for the sampled tokens only ("selective"), in row
chunks so the full-vocabulary log-softmax is never materialized for the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rloo.rollout import position_ids_from_mask


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
        z = logits[start : start + rows].float() / temperature
        lse = torch.logsumexp(z, dim=-1)
        logprobs.append(z.gather(-1, token_ids[start : start + rows].unsqueeze(-1)).squeeze(-1) - lse)
        if with_entropy:
            with torch.set_grad_enabled(entropy_requires_grad and torch.is_grad_enabled()):
                zz = z if entropy_requires_grad else z.detach()
                ll = lse if entropy_requires_grad else lse.detach()
                entropies.append(ll - (torch.exp(zz - ll.unsqueeze(-1)) * zz).sum(dim=-1))
    return torch.cat(logprobs), torch.cat(entropies) if with_entropy else None


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
    logprobs, entropy = token_logprobs_and_entropy(
        logits[:, :-1], completion_ids, temperature, with_entropy, entropy_requires_grad
    )
    return TokenLogprobs(logprobs, entropy)
