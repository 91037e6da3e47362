"""Policy-gradient losses: importance ratio, clipped surrogate, aggregation. Pure torch.

Shapes: N completions, T completion tokens. ``logprobs``, ``old_logprobs`` and
``completion_mask`` are ``(N, T)``; ``advantages`` are ``(N,)``.

The clipped surrogate for one action with ratio ``rho = pi / pi_old`` and advantage A is

    l = -min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)

(PPO; DAPO's asymmetric clip when eps_high != eps_low). An *action* is either one token
(``ratio_level="token"``: PPO, GRPO, DAPO) or the whole completion
(``ratio_level="sequence"``: ``rho_i = exp(sum_t log pi_it - sum_t log pi_old_it)``, one clip
decision per completion, as in TRL's RLOOTrainer). When the batch is used once,
``pi_old = pi`` detached, so ``rho = 1`` and ``grad l = -A grad log pi``: plain REINFORCE.

Each completion's summed loss ``S_i`` (sum of its token losses, or its one sequence loss)
is reduced to a scalar by an aggregation mode, see :func:`aggregate_loss`.

``weights`` (optional, ``(N, T)``, no gradient) multiply the losses: token ``t``'s loss by ``w_t``, a
completion's one sequence loss by its tokens' mean weight ``sum_t m_t w_t / sum_t m_t`` (the off-policy
corrections of :mod:`rloo.algo.importance`; 1 everywhere leaves the loss unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from rloo.algo.masks import masked_row_sum
from rloo.algo.registry import Registry


def clipped_surrogate(ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """``-min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)``, elementwise (broadcasts)."""
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return -torch.min(ratio * advantages, clipped * advantages)


@dataclass(frozen=True)
class PolicyLossOutput:
    """Per-completion summed loss and the ratio it was built from.

    sequence_loss: ``(N,)`` ``S_i``. ratio: ``(N, T)`` for token level, ``(N, 1)`` for
    sequence level (the shape the clip decisions were taken at). action_mask: same shape as
    ``ratio``, the actions that count (the mask for tokens; every completion for sequences).
    """

    sequence_loss: Tensor
    ratio: Tensor
    action_mask: Tensor


class PolicyLoss(Protocol):
    def __call__(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        completion_mask: Tensor,
        eps_low: float,
        eps_high: float,
        weights: Tensor | None = None,
    ) -> PolicyLossOutput: ...


def _masked_log_ratio(logprobs: Tensor, old_logprobs: Tensor, completion_mask: Tensor) -> Tensor:
    """``log pi - log pi_old`` where the mask is non-zero, exactly 0 elsewhere.

    Padded positions may hold any value (even +-inf); selecting rather than multiplying
    keeps them from turning into ``exp(big) = inf`` and ``inf * 0 = NaN`` in the loss or
    its gradient.
    """
    return torch.where(completion_mask != 0, logprobs - old_logprobs, 0.0)


def token_level_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    eps_low: float,
    eps_high: float,
    weights: Tensor | None = None,
) -> PolicyLossOutput:
    """``S_i = sum_t m_it * w_it * l(rho_it, A_i)`` with ``rho_it = exp(log pi_it - log pi_old_it)``
    (``w = 1`` without ``weights``)."""
    ratio = torch.exp(_masked_log_ratio(logprobs, old_logprobs, completion_mask))
    per_token = clipped_surrogate(ratio, advantages.unsqueeze(1), eps_low, eps_high)
    if weights is not None:
        per_token = per_token * weights
    return PolicyLossOutput(masked_row_sum(per_token, completion_mask), ratio, completion_mask)


def sequence_level_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    eps_low: float,
    eps_high: float,
    weights: Tensor | None = None,
) -> PolicyLossOutput:
    """``S_i = w_i * l(rho_i, A_i)`` with ``rho_i = exp(sum_t m_it (log pi_it - log pi_old_it))`` and
    ``w_i = sum_t m_it w_it / sum_t m_it`` (1 without ``weights``)."""
    log_ratio = masked_row_sum(_masked_log_ratio(logprobs, old_logprobs, completion_mask), completion_mask)
    ratio = torch.exp(log_ratio)
    sequence_loss = clipped_surrogate(ratio, advantages, eps_low, eps_high)
    if weights is not None:
        sequence_loss = (
            sequence_loss * masked_row_sum(weights, completion_mask) / completion_mask.sum(dim=1).clamp(min=1.0)
        )
    return PolicyLossOutput(sequence_loss, ratio.unsqueeze(1), torch.ones_like(ratio).unsqueeze(1))


POLICY_LOSSES: Registry[PolicyLoss] = Registry("ratio level")
POLICY_LOSSES.add("token", token_level_loss, "rho_it = exp(log pi_t - log pi_old_t), one per token")
POLICY_LOSSES.add("sequence", sequence_level_loss, "rho_i = exp(sum_t log pi_t - log pi_old_t), one per completion")


def get_policy_loss(ratio_level: str) -> PolicyLoss:
    """Look the policy loss up by ratio level; an unknown name lists the valid ones."""
    return POLICY_LOSSES.get_entry(ratio_level)


def count_actions(ratio_level: str, loss_mask: Tensor) -> float:
    """The actions of rows with ``loss_mask: (N, T)`` at ``ratio_level``: the sum of the policy loss's
    own ``action_mask`` (tokens for ``token``, completions for ``sequence``), the count clip fractions
    are over. Evaluated at ratio 1 and A = 0: no model output is needed."""
    zeros = torch.zeros(loss_mask.shape, dtype=torch.float32, device=loss_mask.device)
    inf = float("inf")
    out = get_policy_loss(ratio_level)(zeros, zeros, zeros.new_zeros(loss_mask.shape[0]), loss_mask, inf, inf)
    return float(out.action_mask.sum())


@dataclass(frozen=True)
class LossTotals:
    """Whole-step normalizers: the tokens (``sum_i L_i``) and completions (N) of the optimizer
    step, and the completion-length limit ``T_max``."""

    num_tokens: float
    num_sequences: float
    max_length: int


class Aggregation(Protocol):
    """Per-completion summed losses ``S_i: (N,)`` and lengths ``L_i: (N,)`` -> one scalar."""

    def __call__(self, sequence_loss: Tensor, lengths: Tensor, totals: LossTotals) -> Tensor: ...


AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation")


@AGGREGATIONS.register("token_mean", "sum_i S_i / sum_i |o_i|")
def _token_mean(sequence_loss: Tensor, lengths: Tensor, totals: LossTotals) -> Tensor:
    return sequence_loss.sum() / max(totals.num_tokens, 1.0)


@AGGREGATIONS.register("seq_mean_token_mean", "1/N sum_i S_i / |o_i|")
def _seq_mean_token_mean(sequence_loss: Tensor, lengths: Tensor, totals: LossTotals) -> Tensor:
    return (sequence_loss / lengths.clamp(min=1.0)).sum() / max(totals.num_sequences, 1.0)


@AGGREGATIONS.register("seq_mean_token_sum", "1/N sum_i S_i")
def _seq_mean_token_sum(sequence_loss: Tensor, lengths: Tensor, totals: LossTotals) -> Tensor:
    return sequence_loss.sum() / max(totals.num_sequences, 1.0)


@AGGREGATIONS.register("seq_mean_token_sum_norm", "1/(N T_max) sum_i S_i")
def _seq_mean_token_sum_norm(sequence_loss: Tensor, lengths: Tensor, totals: LossTotals) -> Tensor:
    return sequence_loss.sum() / (max(totals.num_sequences, 1.0) * totals.max_length)


AGGREGATION_MODES: tuple[str, ...] = tuple(AGGREGATIONS)


def aggregate_loss(
    sequence_loss: Tensor,
    completion_mask: Tensor,
    mode: str,
    *,
    total_tokens: float | None = None,
    total_sequences: float | None = None,
    max_completion_length: int | None = None,
) -> Tensor:
    """Reduce per-completion summed losses ``S_i`` to one scalar.

    With ``L_i = sum_t m_it`` the completion's token count:

    - ``token_mean``: ``sum_i S_i / sum_i L_i``; every token of the batch weighs the same.
    - ``seq_mean_token_mean``: ``1/N sum_i S_i / L_i``; each completion weighs the same
      (AReaL's and the GRPO paper's formula).
    - ``seq_mean_token_sum``: ``1/N sum_i S_i``; the completion is one action (RLOO paper,
      TRL's RLOOTrainer).
    - ``seq_mean_token_sum_norm``: ``1/(N * T_max) sum_i S_i`` with ``T_max`` the
      completion-length limit (Dr. GRPO).

    ``total_tokens`` / ``total_sequences`` replace ``sum_i L_i`` / ``N`` when a batch is
    split into micro-batches, so the micro-batch losses add up to the full-batch loss.
    Completions with ``L_i = 0`` (fully masked) count as 1 token in ``S_i / L_i``.
    """
    aggregation = AGGREGATIONS.get_entry(mode)
    if mode == "seq_mean_token_sum_norm" and max_completion_length is None:
        raise ValueError("seq_mean_token_sum_norm needs max_completion_length")
    lengths = completion_mask.sum(dim=1)
    num_tokens = float(lengths.sum()) if total_tokens is None else total_tokens
    num_sequences = float(sequence_loss.shape[0]) if total_sequences is None else total_sequences
    return aggregation(sequence_loss, lengths, LossTotals(num_tokens, num_sequences, max_completion_length or 1))
