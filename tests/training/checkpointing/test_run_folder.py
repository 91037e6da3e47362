"""Nothing a user has is lost: run folders, checkpoints (no code on load), resume bookkeeping."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from rloo.training.checkpointing.state_files import load_state, save_state
from tests.helpers.models import trainer


def checkpoint_names(run: Path) -> list[str]:
    return sorted((p.name for p in run.iterdir() if p.name.startswith("checkpoint-")), key=lambda n: int(n[11:]))


def test_resuming_behind_newer_checkpoints_is_refused_then_allowed_explicitly(tmp_path: Path) -> None:
    # before: resuming from checkpoint-4 with save_total_limit=1 deleted the checkpoint it had
    # just written (checkpoint-5) and kept the abandoned checkpoint-6 for the next resume to pick
    trainer(tmp_path, max_steps=6, save_steps=2, save_total_limit=2).train()
    run = tmp_path / "run"
    assert checkpoint_names(run) == ["checkpoint-4", "checkpoint-6"]
    resumed = trainer(tmp_path, max_steps=7, save_steps=1, save_total_limit=1)
    with pytest.raises(ValueError, match=r"newer than checkpoint-4 \(checkpoint-6\).*overwrite_output_dir=True"):
        resumed.train(resume_from_checkpoint=str(run / "checkpoint-4"))
    assert checkpoint_names(run) == ["checkpoint-4", "checkpoint-6"]  # nothing changed
    allowed = trainer(tmp_path, max_steps=7, save_steps=1, save_total_limit=1, overwrite_output_dir=True)
    allowed.train(resume_from_checkpoint=str(run / "checkpoint-4"))
    assert checkpoint_names(run) == ["checkpoint-7"]
    assert json.loads((run / "checkpoint-7" / "trainer_state.json").read_text())["global_step"] == 7


def test_a_resumed_run_logs_each_steps_completions_once(tmp_path: Path) -> None:
    trainer(tmp_path, max_steps=4, save_steps=2, log_completions=True).train()
    run = tmp_path / "run"
    trainer(tmp_path, max_steps=4, save_steps=2, log_completions=True, overwrite_output_dir=True).train(
        resume_from_checkpoint=str(run / "checkpoint-2")
    )
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    per_step = {step: sum(r["step"] == step for r in rows) for step in {r["step"] for r in rows}}
    assert per_step == {0: 8, 1: 8, 2: 8, 3: 8}  # 8 completions a step, none replayed twice


def test_training_state_round_trips_without_pickle(tmp_path: Path) -> None:
    state = {
        "optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(2, 3)}},
            "groups": [{"betas": (0.9, 0.99), "fused": None}],
        },
        "rng": {"numpy": np.random.get_state(), "python": (3, (1, 2, 3), None), "torch": torch.get_rng_state()},
        "sampler": {"epoch": 2, "position": 5, "shuffle": True, "lr": float("inf")},
    }
    paths = save_state(state, tmp_path, "training_state")
    assert sorted(p.name for p in paths) == ["training_state.json", "training_state.safetensors"]
    loaded = load_state(tmp_path, "training_state")
    assert loaded["optimizer"]["state"][0]["step"].item() == 3.0
    torch.testing.assert_close(loaded["optimizer"]["state"][0]["exp_avg"], state["optimizer"]["state"][0]["exp_avg"])
    assert loaded["optimizer"]["groups"] == [{"betas": (0.9, 0.99), "fused": None}]
    assert loaded["rng"]["python"] == (3, (1, 2, 3), None) and torch.equal(
        loaded["rng"]["torch"], torch.get_rng_state()
    )
    np.random.set_state(loaded["rng"]["numpy"])  # accepted as a numpy state
    assert loaded["sampler"] == state["sampler"]
    with pytest.raises(TypeError, match="cannot store a object"):
        save_state({"x": object()}, tmp_path, "bad")


class Payload:
    """Unpickling this calls ``Path.touch`` on the marker: what a hostile checkpoint could run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (str(self.marker),))  # type: ignore[return-value]


def test_a_checkpoint_cannot_run_code_on_resume(tmp_path: Path) -> None:
    trainer(tmp_path, max_steps=1, save_steps=1).train()
    checkpoint = tmp_path / "run" / "checkpoint-1"
    assert not list(checkpoint.glob("*.pt"))  # the training state is JSON + safetensors
    marker = tmp_path / "pwned"
    # an old-style pickled training state, hostile: it is refused, never unpickled
    for name in ("training_state.json", "training_state.safetensors"):
        (checkpoint / name).unlink()
    (checkpoint / "training_state.pt").write_bytes(pickle.dumps({"optimizer": Payload(marker)}))
    with pytest.raises(ValueError, match=r"older rloo.*pickle.*unpickling can run code"):
        trainer(tmp_path, max_steps=2).train(resume_from_checkpoint=str(checkpoint))
    assert not marker.exists()
    # a tampered JSON is data, never code: it fails cleanly, naming the checkpoint
    (checkpoint / "training_state.json").write_text(json.dumps({"s:optimizer": {"__tensor__": "missing"}}))
    (checkpoint / "training_state.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match=r"checkpoint-1 is damaged: .*training_state.* does not match its checksum"):
        trainer(tmp_path, max_steps=2).train(resume_from_checkpoint=str(checkpoint))
    with pytest.raises(ValueError, match=r"training state in .*checkpoint-1 is unreadable"):
        load_state(checkpoint, "training_state")  # past the manifest, parsing still fails cleanly
    assert not marker.exists()


def test_a_damaged_checkpoint_is_named_and_the_newest_good_one_offered(tmp_path: Path) -> None:
    # before: an edited or truncated checkpoint failed with a raw error, or resumed from bad data
    trainer(tmp_path, max_steps=2, save_steps=1).train()
    run = tmp_path / "run"
    weights = run / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match=r"checkpoint-2 is damaged: model.safetensors does not match its checksum"):
        trainer(tmp_path, max_steps=3, save_steps=1).train(resume_from_checkpoint=True)
    with pytest.raises(ValueError, match=r"the newest good checkpoint is .*checkpoint-1: resume from it"):
        trainer(tmp_path, max_steps=3, save_steps=1).train(resume_from_checkpoint=True)
    (run / "checkpoint-1" / "config.yaml").unlink()
    with pytest.raises(ValueError, match=r"checkpoint-1 is damaged: config.yaml is missing"):
        trainer(tmp_path, max_steps=3).train(resume_from_checkpoint=str(run / "checkpoint-1"))


def test_resuming_with_another_batch_shape_is_refused(tmp_path: Path) -> None:
    # before: a changed num_generations silently continued the run with other batches
    trainer(tmp_path, max_steps=2, save_steps=2).train()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    with pytest.raises(ValueError, match=r"trained with num_generations=4, this run has num_generations=2"):
        trainer(tmp_path, max_steps=3, num_generations=2).train(resume_from_checkpoint=str(checkpoint))
    with pytest.raises(ValueError, match=r"trained with seed=0, this run has seed=1"):
        trainer(tmp_path, max_steps=3, seed=1).train(resume_from_checkpoint=True)
    trainer(tmp_path, max_steps=3, learning_rate=0.5).train(resume_from_checkpoint=True)  # not batch-shaping


def test_what_a_killed_write_left_is_tidied_before_resuming(tmp_path: Path) -> None:
    # a kill between moving checkpoint-2 aside and renaming its replacement in: the whole old
    # one comes back; a half-deleted folder and a partial new checkpoint go
    trainer(tmp_path, max_steps=2, save_steps=1).train()
    run = tmp_path / "run"
    (run / "checkpoint-2").rename(run / "old-checkpoint-2")
    (run / "tmp-checkpoint-3").mkdir()
    (run / "deleting-checkpoint-1").mkdir()
    resumed = trainer(tmp_path, max_steps=3, save_steps=1)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3
    assert checkpoint_names(run) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert not [p.name for p in run.iterdir() if p.name.startswith(("old-", "tmp-", "deleting-"))]
