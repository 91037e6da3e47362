"""``TrainerState``: the progress of a run, saved in every checkpoint."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class TrainerState:
    """Progress of a run; saved in every checkpoint."""

    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0
    num_input_tokens_seen: int = 0
    num_groups_seen: int = 0
    total_loss: float = 0.0  # the sum of every step's loss: train_loss is its mean, resumed runs included
    best_metric: float | None = None  # load_best_model_at_end: the best evaluation so far
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    log_history: list[dict[str, float]] = field(default_factory=list)
    health: dict[str, Any] = field(default_factory=dict)  # what the health monitors remember

    def to_dict(self) -> dict[str, Any]:
        """The fields, for ``trainer_state.json``: ``log_history``'s rows as they are (a new list of the same
        dicts) and the rest copied. ``dataclasses.asdict`` deep-copies every row: 0.7 s at 10,000 logged rows, at
        every checkpoint (the soak benchmark found it: ``benchmarks/soak.py``)."""
        values = {
            item.name: copy.deepcopy(getattr(self, item.name)) for item in fields(self) if item.name != "log_history"
        }
        values["log_history"] = list(self.log_history)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainerState:
        return cls(**values)
