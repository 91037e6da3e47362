"""The training objective of one pass over rows, assembled from the pure math modules.

``loss = aggregate_i( S_i )`` with, per completion i,

    S_i = policy_loss_i(rho, A_i; w)                   (clipped surrogate, token or sequence, weighted)
          + kl_coef * sum_t KL_t                       (KL in the loss; kl_coef = 0 otherwise)
          - entropy_coef * sum_t H_t                   (entropy bonus; 0 disables it)

all over the loss mask (completion tokens up to EOS; none for masked truncated ones). The policy
loss's weights ``w`` (:mod:`rloo.algo.importance`): the engines' importance weights when given,
times the off-policy sequence mask when ``off_policy_threshold`` is set; the KL and entropy terms
are not weighted (as TRL). Takes tensors, scalars and registry names only: no config object, no model.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rloo.algo.importance import off_policy_sequence_mask
from rloo.algo.kl import get_kl_estimator
from rloo.algo.losses import aggregate_loss, get_policy_loss
from rloo.algo.masks import masked_row_sum
from rloo.algo.stats import ClipFractions, clip_fractions, masked_mean


@dataclass(frozen=True)
class ObjectiveInputs:
    """Tensors of the rows of one pass; ``(n, T)`` per token, ``(n,)`` per completion.

    ``entropy`` carries a gradient when there is an entropy bonus; ``reference_logprobs``
    is needed only for the KL in the loss. ``engine_weights``: the engines' importance weights
    (``(n, T)``, no gradient), or None; ``sampling_logprobs``: the sampling policy's log-probs,
    which the off-policy mask compares with (None: ``old_logprobs``).
    """

    logprobs: Tensor
    old_logprobs: Tensor
    reference_logprobs: Tensor | None
    advantages: Tensor
    loss_mask: Tensor
    entropy: Tensor | None
    engine_weights: Tensor | None = None
    sampling_logprobs: Tensor | None = None


@dataclass(frozen=True, kw_only=True)
class ObjectiveSettings:
    """The objective's scalars that are fixed for a run.

    ``ratio_level`` / ``aggregation`` / ``kl_estimator`` are registry names
    (:data:`rloo.algo.losses.POLICY_LOSSES`, :data:`rloo.algo.losses.AGGREGATIONS`,
    :data:`rloo.algo.kl.KL_ESTIMATORS`). ``eps_low = eps_high = inf`` turns clipping off.
    ``kl_coef`` is beta when the KL is placed in the loss, else 0 (see
    :class:`rloo.algo.kl.KLPlacement`); ``entropy_coef`` 0 disables the entropy bonus.
    ``off_policy_threshold``: delta of the off-policy sequence mask; None disables it.
    """

    ratio_level: str
    eps_low: float
    eps_high: float
    aggregation: str
    max_completion_length: int
    kl_estimator: str = "k1"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    off_policy_threshold: float | None = None


@dataclass(frozen=True)
class ObjectiveOutput:
    """``loss``: the scalar to backpropagate; ``clip``: clip fractions; ``kl``: mean KL in the loss."""

    loss: Tensor
    clip: ClipFractions
    kl: float | None


def policy_objective(
    inputs: ObjectiveInputs, settings: ObjectiveSettings, *, total_tokens: float, total_sequences: float
) -> ObjectiveOutput:
    """Loss of one pass, scaled so the passes of an optimizer step add up to its loss.

    ``total_tokens`` / ``total_sequences`` count the whole optimizer step (all its passes), see
    :func:`rloo.algo.losses.aggregate_loss`.
    """
    ratio_level, eps_low, eps_high = settings.ratio_level, settings.eps_low, settings.eps_high
    kl_coef, entropy_coef = settings.kl_coef, settings.entropy_coef
    policy = get_policy_loss(ratio_level)(
        inputs.logprobs,
        inputs.old_logprobs,
        inputs.advantages,
        inputs.loss_mask,
        eps_low,
        eps_high,
        loss_weights(inputs, settings),
    )
    sequence_loss = policy.sequence_loss
    kl_value = None
    if kl_coef > 0:
        if inputs.reference_logprobs is None:
            raise ValueError("KL in the loss needs reference log-probs")
        per_token_kl = get_kl_estimator(settings.kl_estimator)(inputs.logprobs, inputs.reference_logprobs)
        sequence_loss = sequence_loss + kl_coef * masked_row_sum(per_token_kl, inputs.loss_mask)
        kl_value = float(masked_mean(per_token_kl.detach(), inputs.loss_mask))
    if entropy_coef > 0:
        if inputs.entropy is None:
            raise ValueError("an entropy bonus needs the entropy with gradient")
        sequence_loss = sequence_loss - entropy_coef * masked_row_sum(inputs.entropy, inputs.loss_mask)
    loss = aggregate_loss(
        sequence_loss,
        inputs.loss_mask,
        settings.aggregation,
        total_tokens=total_tokens,
        total_sequences=total_sequences,
        max_completion_length=settings.max_completion_length,
    )
    clip = clip_fractions(policy.ratio.detach(), inputs.advantages, policy.action_mask, eps_low, eps_high)
    return ObjectiveOutput(loss, clip, kl_value)


def loss_weights(inputs: ObjectiveInputs, settings: ObjectiveSettings) -> Tensor | None:
    """The policy loss's weights: ``engine_weights`` times, with ``off_policy_threshold``, the off-policy
    sequence mask against ``sampling_logprobs`` (else ``old_logprobs``); None when neither applies."""
    weights = inputs.engine_weights
    if settings.off_policy_threshold is not None:
        sampling = inputs.sampling_logprobs if inputs.sampling_logprobs is not None else inputs.old_logprobs
        keep = off_policy_sequence_mask(
            inputs.advantages, inputs.logprobs, sampling, inputs.loss_mask, settings.off_policy_threshold
        )
        weights = keep.expand_as(inputs.loss_mask) if weights is None else weights * keep
    return weights
