"""A checkpoint's training state: fp16's gradient scaler is part of it (issue 25); tensors that share memory
are stored (issue 29)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rloo.training.checkpointing.checkpoints import restore_training_state, training_state
from rloo.training.checkpointing.state_files import load_state, save_state


class Sampler:
    def state_dict(self) -> dict[str, int]:
        return {"position": 3}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def test_the_gradient_scalers_state_is_saved_and_restored(tmp_path: Path) -> None:
    # before: not saved, so a resumed fp16 run restarted its scale (65536) and skipped steps finding it again
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale(torch.ones(()))  # the scale exists from the first scaled loss on
    scaler.update(new_scale=512.0)  # where a run's overflows took it
    save_state(training_state(optimizer, scheduler, Sampler(), scaler=scaler), tmp_path, "training_state")
    resumed = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    restore_training_state(load_state(tmp_path, "training_state"), optimizer, scheduler, Sampler(), scaler=resumed)
    assert resumed.get_scale() == 512.0
    # a checkpoint written without one (bf16 or fp32 runs, older checkpoints) leaves the scaler as it starts
    fresh = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    restore_training_state(
        training_state(optimizer, scheduler, Sampler()), optimizer, scheduler, Sampler(), scaler=fresh
    )
    assert fresh.get_scale() == 2.0**16


def test_tensors_sharing_memory_are_saved_each_on_its_own(tmp_path: Path) -> None:
    # before: safetensors refused the state ("Some tensors share memory"): bitsandbytes' 8-bit AdamW keeps one
    # quantization map object in every parameter's state, and on a CPU nothing copied it apart
    qmap = torch.linspace(-1, 1, 256)
    state = {"state": {0: {"qmap1": qmap, "half": qmap[:128]}, 1: {"qmap1": qmap}}, "empty": [torch.zeros(0)] * 2}
    save_state(state, tmp_path, "training_state")
    loaded = load_state(tmp_path, "training_state")
    assert torch.equal(loaded["state"][0]["qmap1"], qmap) and torch.equal(loaded["state"][1]["qmap1"], qmap)
    assert torch.equal(loaded["state"][0]["half"], qmap[:128]) and loaded["empty"][1].numel() == 0


def test_trainer_state_json_is_transformers_fields_with_a_logged_row_a_line() -> None:
    """The same JSON as an indented dump (a resume reads it back), written row by row with json's C encoder."""
    import json

    from rloo.training.checkpointing.checkpoints import state_json

    rows = [{"step": float(i), "reward": i / 3, "kl": None if i == 2 else 0.5} for i in range(1, 4)]
    state = {"global_step": 3, "best_metric": None, "log_history": rows}
    text = state_json(state)
    assert json.loads(text) == state
    lines = text.splitlines()
    assert lines[lines.index(' "log_history": [') + 1 :][:3] == [json.dumps(row) + "," for row in rows[:2]] + [
        json.dumps(rows[2])
    ]
    for small in ({}, {"log_history": []}, {"global_step": 0, "log_history": []}, {"global_step": 0}):
        assert json.loads(state_json(small)) == small


def test_each_logged_row_is_encoded_once_across_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's RowTexts: a checkpoint encodes only the rows logged since the last (10,000 rows cost
    250 ms a checkpoint before); a replaced history (a resume) is encoded anew; the text is the same."""
    import json

    from rloo.training.checkpointing import checkpoints

    real = json.dumps
    texts = checkpoints.RowTexts()
    history = [{"step": 1.0, "reward": 0.5}, {"step": 2.0, "reward": 0.25}]
    first = checkpoints.state_json({"global_step": 2, "log_history": list(history)}, texts)
    assert json.loads(first)["log_history"] == history
    history.append({"step": 3.0, "reward": 1.0})
    state = {"global_step": 3, "log_history": list(history)}
    encoded: list[object] = []
    monkeypatch.setattr(checkpoints.json, "dumps", lambda value, **kw: encoded.append(value) or real(value, **kw))
    assert checkpoints.state_json(state, texts) == checkpoints.state_json(state)
    logged = [value for value in encoded if isinstance(value, dict) and "step" in value]
    assert logged == [history[2], *history]  # the new row with the trainer's texts; every row without them
    encoded.clear()
    resumed = [dict(row) for row in history]  # read back from a checkpoint: new objects, the same values
    assert texts(resumed) == [real(row) for row in resumed] and len(encoded) == 3
