"""Dynamic sampling (DAPO, Yu et al. 2025; verl's ``algorithm.filter_groups``): which drawn groups fill a batch.

A group whose K rewards are all equal gets advantage 0 from a group baseline
(:func:`rloo.algo.advantages.groups_with_signal` finds the others): it costs a forward and backward
and teaches nothing. Dynamic sampling draws more prompts, round after round, until ``target``
groups with a signal are found, and trains on those. Pure: booleans in, indices out.

Where we depart from verl: verl raises an error when ``max_num_gen_batches`` rounds did not find
enough; here the batch is completed with the earliest groups without a signal (zero advantages,
as a run without dynamic sampling would have trained them), so the batch keeps its size, the
optimizer steps per batch and the learning-rate schedule keep theirs, and the run goes on (the
trainer warns and logs how many).
"""

from __future__ import annotations

import torch
from torch import Tensor


def needs_another_round(num_with_signal: int, target: int, rounds: int, max_rounds: int) -> bool:
    """Draw another round: fewer than ``target`` groups with a signal so far, after ``rounds`` of at most
    ``max_rounds``."""
    return num_with_signal < target and rounds < max_rounds


def select_groups(signal: Tensor, target: int) -> Tensor:
    """The ``target`` groups a batch trains, from ``G`` drawn groups in draw order.

    ``signal: (G,)`` bool, whether each drawn group's rewards differ. Returns ``(target,)`` long
    indices into it, ascending (draw order): the first ``target`` groups with a signal; when fewer
    have one, all of them and then the earliest groups without one (fillers) until ``target``.
    Raises ``ValueError`` when fewer than ``target`` groups were drawn.
    """
    if signal.dim() != 1 or signal.dtype != torch.bool:
        raise ValueError(f"signal must be a (G,) bool tensor, got {signal.dtype} of shape {tuple(signal.shape)}")
    if signal.numel() < target:
        raise ValueError(f"{signal.numel()} groups were drawn, fewer than the {target} a batch trains")
    with_signal = torch.nonzero(signal).flatten()[:target]
    fillers = torch.nonzero(~signal).flatten()[: target - with_signal.numel()]
    return torch.sort(torch.cat([with_signal, fillers])).values
