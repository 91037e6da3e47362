"""Never train on in silence after a NaN: non-finite steps are skipped, counted, and stop the run.

An optimizer step whose loss or gradient norm is NaN/inf makes no update (the gradients are
dropped), is counted in ``train/nonfinite_steps`` and warned about; after
``max_nonfinite_steps`` such steps in a row, training stops with :class:`NonFiniteTrainingError`.
The weights then are still those of the last finite step. A checkpoint or final model is
written only when every weight is finite (:func:`require_finite_weights`).
"""

from __future__ import annotations

import math

import torch.distributed as dist
from torch import nn

from rloo.config.symptoms import SYMPTOMS


class NonFiniteTrainingError(RuntimeError):
    """Training stopped: too many optimizer steps in a row had a non-finite loss or gradient."""


NONFINITE_FIXES = SYMPTOMS["nonfinite"].fix


SKIPPED_STEP = f"a step had a non-finite loss or gradient and was skipped (no update); {NONFINITE_FIXES}"


class NonFiniteGuard:
    """Counts optimizer steps with a non-finite loss or gradient norm, in a row and in all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_a_row = 0
        self.total = 0

    def step_is_finite(self, losses: list[float], grad_norm: float, step: int) -> bool:
        """True if the step may update; raises after ``limit`` non-finite steps in a row."""
        if all(math.isfinite(v) for v in losses) and math.isfinite(grad_norm):
            self.in_a_row = 0
            return True
        self.in_a_row += 1
        self.total += 1
        if self.in_a_row >= self.limit:
            raise NonFiniteTrainingError(
                f"training stopped at step {step}: the last {self.in_a_row} optimizer steps had a non-finite "
                f"loss or gradient (loss {losses[-1] if losses else 'n/a'}, grad_norm {grad_norm}) and were skipped, "
                f"so the weights are those of the last finite step and every checkpoint is kept. To fix: "
                f"{NONFINITE_FIXES}"
            )
        return False


def require_finite_weights(model: nn.Module, what: str) -> None:
    """Raise ``NonFiniteTrainingError`` instead of writing ``what`` with a NaN/inf weight. Sharded
    weights (FSDP) are checked shard by shard and the verdict shared, so every process raises."""
    from torch.distributed.tensor import DTensor

    bad, sharded = None, False
    for name, param in model.named_parameters():
        sharded = sharded or isinstance(param, DTensor)
        local = param.to_local() if isinstance(param, DTensor) else param
        if bad is None and not bool(local.detach().isfinite().all()):
            bad = name
    if sharded and dist.is_initialized():
        names: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(names, bad)
        bad = next((n for n in names if n is not None), None)
    if bad is not None:
        raise NonFiniteTrainingError(
            f"not writing {what}: weight {bad} is not finite (NaN/inf); the earlier checkpoints are "
            f"kept. To fix: {NONFINITE_FIXES}"
        )
