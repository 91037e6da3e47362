"""Step counts and learning-rate schedules as transformers 5 reads them.

- ``warmup_steps``, ``logging_steps``, ``save_steps`` and ``eval_steps`` take a whole number of
  optimizer steps, or a fraction of the run in (0, 1): ``warmup_steps=0.1`` is the first 10% of
  ``max_steps`` (TRL's own scripts pass ``--warmup_steps 0.1``). The fraction is resolved when
  ``max_steps`` is known (:func:`optimizer_steps`), rounded up as transformers does.
- ``lr_scheduler_type`` is any schedule of transformers' ``get_scheduler`` that steps with the
  optimizer, with ``lr_scheduler_kwargs`` passed through (``cosine_with_min_lr`` needs ``min_lr``
  or ``min_lr_rate``); a wrong keyword is found when the config is built, on a throw-away optimizer,
  not at the trainer's first step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# transformers' SchedulerType values that step with the optimizer
LR_SCHEDULERS: tuple[str, ...] = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
)
REFUSED_SCHEDULERS = {
    "reduce_lr_on_plateau": "it steps on an evaluation metric, and rloo steps its schedule with the optimizer",
    "greedy": "it steps on a tracked loss, and rloo steps its schedule with the optimizer",
}


def optimizer_steps(value: float, max_steps: int) -> int:
    """``value`` optimizer steps; a ``value`` in (0, 1) is that fraction of ``max_steps``, rounded up."""
    return math.ceil(value * max_steps) if 0 < value < 1 else int(value)


def whole_if_integral(value: Any) -> Any:
    """``10.0`` (a float flag, as ``HfArgumentParser`` parses ``--logging_steps 10``) -> ``10``."""
    return int(value) if isinstance(value, float) and value >= 1 and value.is_integer() else value


def steps_problem(value: float, *, zero_allowed: bool = False) -> str | None:
    """What is wrong with a step count that may be a fraction of the run, or None."""
    if value == 0 and zero_allowed:
        return None
    if not value > 0:
        bound = ">= 0" if zero_allowed else "> 0"
        return f"must be {bound}: a number of optimizer steps, or a fraction of the run in (0, 1)"
    if value > 1 and not float(value).is_integer():
        return "must be a whole number of optimizer steps, or a fraction of the run in (0, 1)"
    return None


def scheduler_problem(name: str, kwargs: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """``(field, fix)`` for a schedule ``get_scheduler`` would refuse, or None. Builds it on a
    throw-away optimizer, so every keyword and requirement is checked as transformers checks it
    (a schedule that needs none, given none, is not built)."""
    if name in REFUSED_SCHEDULERS:
        return "lr_scheduler_type", f"{REFUSED_SCHEDULERS[name]}; choose one of {list(LR_SCHEDULERS)}"
    if name not in LR_SCHEDULERS:
        return "lr_scheduler_type", f"choose one of {list(LR_SCHEDULERS)}"
    if not kwargs and name not in ("cosine_with_min_lr", "cosine_warmup_with_min_lr"):
        return None  # nothing to check: no keywords, none needed (and no transformers import)
    import torch
    from transformers import get_scheduler

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    try:
        get_scheduler(name, optimizer, 1, 10, scheduler_specific_kwargs=dict(kwargs or {}))
    except (TypeError, ValueError) as error:
        return "lr_scheduler_kwargs", f"{name} refuses them: {error}"
    return None
