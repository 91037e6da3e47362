"""``TrainerState.to_dict``: what ``trainer_state.json`` is written from, without a deep copy of the log history."""

from __future__ import annotations

import dataclasses

from rloo.training.state import TrainerState


def test_to_dict_holds_the_fields_and_shares_no_mutable_container_with_the_state() -> None:
    rows = [{"step": 1.0, "reward": 0.5}, {"step": 2.0, "reward": 0.75}]
    state = TrainerState(global_step=2, log_history=rows, health={"window": {"seen": [1, 2]}})
    values = state.to_dict()
    assert values == dataclasses.asdict(state)
    values["log_history"].append({"step": 3.0})
    values["health"]["window"]["seen"].append(3)
    assert len(state.log_history) == 2 and state.health == {"window": {"seen": [1, 2]}}
    assert values["log_history"][0] is rows[0]  # the rows themselves (logged rows are never changed): no copy
    assert TrainerState.from_dict(dataclasses.asdict(state)) == state
