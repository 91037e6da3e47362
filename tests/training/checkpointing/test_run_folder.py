"""Nothing a user has is lost: run folders, checkpoints (no code on load), resume bookkeeping."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from rloo import RLOOConfig
from rloo.training.checkpointing.run_folder import with_run_folder
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
    assert per_step == {1: 8, 2: 8, 3: 8, 4: 8}  # 8 completions a step, none replayed twice


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


def test_runs_given_no_output_dir_each_get_a_fresh_folder_and_resume_by_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """TRL's quickstart run twice in one folder: the second was refused, the default runs/rloo
    holding the first (issue 24). Each now claims runs/rloo, runs/rloo-2..., says so at start-up,
    and config.yaml records it, so naming it resumes."""
    monkeypatch.chdir(tmp_path)
    Path("runs/rloo-2").mkdir(parents=True)
    Path("runs/rloo-2/notes.txt").write_text("not a run, but not ours")
    Path("runs/rloo-3").mkdir()  # empty: free
    for expected in ("runs/rloo", "runs/rloo-3"):
        run = trainer(tmp_path, output_dir=None, max_steps=2, save_steps=1)
        run.train()
        assert run.output_dir == Path(expected) and run.args.output_dir == expected
        assert yaml.safe_load((run.output_dir / "config.yaml").read_text())["output_dir"] == expected
        assert f"run folder {expected}" in capsys.readouterr().err
    resumed = trainer(tmp_path, output_dir="runs/rloo", max_steps=3, save_steps=1)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3 and (tmp_path / "runs/rloo/checkpoint-3").is_dir()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["rloo", "rloo-2", "rloo-3"]


def test_every_process_takes_the_folder_the_main_process_chose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each process picking its own could split a run over two folders: the main process chooses
    (``Ranks.on_main``); another process takes its answer."""
    monkeypatch.chdir(tmp_path)
    args = RLOOConfig(num_generations=4)
    config, folder = with_run_folder(args, lambda choose: Path("runs/rloo-7"))  # rank 1: rank 0's answer
    assert folder == Path("runs/rloo-7") and config.output_dir == "runs/rloo-7"
    assert config.replace(output_dir=None) == args  # nothing else changed
    with pytest.raises(dataclasses.FrozenInstanceError):  # read-only, as the config a trainer took
        config.output_dir = "elsewhere"
    config, folder = with_run_folder(args, lambda choose: choose())  # rank 0 (and a single process)
    assert folder == Path("runs/rloo") and not folder.exists()  # created when the run starts, not before
    Path("runs/rloo").mkdir(parents=True)
    Path("runs/rloo/config.yaml").write_text("{}")
    assert with_run_folder(config, lambda choose: choose())[1] == Path("runs/rloo")  # given: kept


@pytest.mark.report
def test_the_python_api_writes_the_report_and_a_failing_report_only_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docs (docs/cli.md) say every run writes report.html; only ``rloo train`` did (issue 24)."""
    trainer(tmp_path, max_steps=1).train()
    assert "<html" in (tmp_path / "run" / "report.html").read_text()[:300].lower()
    last = capsys.readouterr().err.strip().splitlines()[-1]  # the end of the run points to the report
    assert f"report: {tmp_path / 'run' / 'report.html'}" in last and f"rloo report {tmp_path / 'run'}" in last

    def broken(run_dir: Path) -> Path:
        raise RuntimeError("no plots today")

    monkeypatch.setattr("rloo.report.page.build_report", broken)
    run = trainer(tmp_path / "other", max_steps=1)
    run.train()  # the run and its model are done: a failing report does not fail them
    assert (run.output_dir / "final").is_dir() and not (run.output_dir / "report.html").exists()
    expected = "report.html was not written (RuntimeError: no plots today); rebuild it with `rloo report"
    assert expected in capsys.readouterr().err and expected in (run.output_dir / "warnings.log").read_text()
