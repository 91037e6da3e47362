"""The training objective of one micro-batch, assembled from the pure math modules.

``loss = aggregate_i( S_i )`` with, per completion i,

    S_i = policy_loss_i(rho, A_i)                      (clipped surrogate, token or sequence)
          + beta * sum_t KL_t          if the KL is placed in the loss
          - entropy_coef * sum_t H_t   if an entropy bonus is on

all over the loss mask (completion tokens up to EOS; none for masked truncated ones).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.algo.kl import get_kl_estimator
from rloo.algo.losses import aggregate_loss, get_policy_loss, per_token_penalty_sum
from rloo.algo.stats import ClipFractions, clip_fractions, masked_mean
from rloo.config.presets import AlgorithmSpec


@dataclass(frozen=True)
class MicroBatchInputs:
    """Tensors of one micro-batch; ``(n, T)`` per token, ``(n,)`` per completion."""

    logprobs: Tensor
    old_logprobs: Tensor
    reference_logprobs: Tensor | None
    advantages: Tensor
    loss_mask: Tensor
    entropy: Tensor | None


@dataclass(frozen=True)
class ObjectiveOutput:
    loss: Tensor
    clip: ClipFractions
    kl: float | None


def micro_batch_objective(
    inputs: MicroBatchInputs,
    spec: AlgorithmSpec,
    *,
    entropy_coef: float,
    total_tokens: float,
    total_sequences: float,
    max_completion_length: int,
) -> ObjectiveOutput:
    """Loss of one micro-batch, scaled so the micro-batches of an optimizer step add up.

    ``total_tokens`` / ``total_sequences`` count the whole optimizer step (all its
    micro-batches), see :func:`rloo.algo.losses.aggregate_loss`.
    """
    eps_low, eps_high = spec.clip_range
    policy = get_policy_loss(spec.ratio_level)(
        inputs.logprobs, inputs.old_logprobs, inputs.advantages, inputs.loss_mask, eps_low, eps_high
    )
    sequence_loss = policy.sequence_loss
    kl_value = None
    if spec.beta > 0 and spec.kl_placement == "loss":
        if inputs.reference_logprobs is None:
            raise ValueError("KL in the loss needs reference log-probs")
        per_token_kl = get_kl_estimator(spec.kl_estimator)(inputs.logprobs, inputs.reference_logprobs)
        sequence_loss = sequence_loss + per_token_penalty_sum(per_token_kl, inputs.loss_mask, spec.beta)
        kl_value = float(masked_mean(per_token_kl.detach(), inputs.loss_mask))
    if entropy_coef > 0:
        if inputs.entropy is None:
            raise ValueError("an entropy bonus needs the entropy with gradient")
        sequence_loss = sequence_loss - per_token_penalty_sum(inputs.entropy, inputs.loss_mask, entropy_coef)
    loss = aggregate_loss(
        sequence_loss,
        inputs.loss_mask,
        spec.loss_aggregation,
        total_tokens=total_tokens,
        total_sequences=total_sequences,
        max_completion_length=max_completion_length,
    )
    action_mask = torch.ones_like(policy.ratio) if spec.ratio_level == "sequence" else inputs.loss_mask
    clip = clip_fractions(policy.ratio.detach(), inputs.advantages, action_mask, eps_low, eps_high)
    return ObjectiveOutput(loss, clip, kl_value)
