"""A run folder that cannot be used or written names itself, the cause and the fix; nothing written is lost.

Root writes through a read-only folder, so read-only folders and full disks are simulated by
monkeypatching the write functions to raise the errors the OS (or safetensors) raises.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any

import pytest
from safetensors import SafetensorError

from rloo.training.checkpointing import checkpoints
from rloo.training.checkpointing.checkpoints import checkpoint_problem
from rloo.training.checkpointing.run_folder import check_fresh_run
from tests.helpers.models import trainer


def refuse_under(monkeypatch: pytest.MonkeyPatch, method: str, folder: Path, error: OSError) -> None:
    """``Path.<method>`` raises ``error`` for ``folder`` and any path under it (as a read-only folder would)."""
    real = getattr(Path, method)

    def refusing(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self == folder or folder in self.parents:
            raise error
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, method, refusing)


def test_an_output_dir_that_is_a_file_is_refused_naming_it(tmp_path: Path) -> None:
    # before: FileExistsError from mkdir (after the model had loaded and the run had started)
    run = tmp_path / "run"
    run.write_text("not a folder")
    with pytest.raises(ValueError, match=rf"output_dir {re.escape(repr(str(run)))} is a file.*choose a folder"):
        check_fresh_run(run, overwrite=False)  # rloo train's check, before the model loads
    with pytest.raises(ValueError, match=r"is a file.*choose a folder"):
        trainer(tmp_path).train()
    with pytest.raises(ValueError, match=r"is a file.*choose a folder"):
        trainer(tmp_path, overwrite_output_dir=True).train()
    assert run.read_text() == "not a folder"  # untouched


def test_an_output_dir_under_a_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("x")
    run = tmp_path / "notes" / "run"
    with pytest.raises(ValueError, match=r"output_dir .*notes/run.* cannot be created: .*notes.* is a file.*folder"):
        trainer(tmp_path, output_dir=str(run)).train()
    assert (tmp_path / "notes").read_text() == "x"


def test_a_read_only_output_dir_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    run.mkdir()
    refuse_under(monkeypatch, "write_text", run, PermissionError(errno.EACCES, "Permission denied"))
    with pytest.raises(ValueError, match=rf"output_dir {re.escape(repr(str(run)))} is not writable.*writable"):
        trainer(tmp_path).train()


def test_an_output_dir_whose_parent_cannot_be_created_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = tmp_path / "shared"
    run = parent / "run"
    refuse_under(monkeypatch, "mkdir", parent, PermissionError(errno.EACCES, "Permission denied"))
    with pytest.raises(ValueError, match=r"output_dir .*shared/run.* is not writable.*choose a writable"):
        trainer(tmp_path, output_dir=str(run)).train()
    assert not parent.exists()


def test_a_read_only_parent_is_refused_before_anything_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # as a non-root user sees it: os.access says the nearest existing folder is not writable
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if Path(path) == tmp_path else real(path, mode))
    with pytest.raises(ValueError, match=r"output_dir .*run.* cannot be created: .* is not writable.*writable"):
        check_fresh_run(tmp_path / "run", overwrite=False)


FAILURES = {
    "read-only": PermissionError(errno.EACCES, "Permission denied"),
    "disk-full": OSError(errno.ENOSPC, "No space left on device"),
    "safetensors": SafetensorError("Error while serializing: IoError(No space left on device (os error 28))"),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_failed_checkpoint_write_keeps_the_earlier_ones_and_names_the_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    # before: PermissionError / SafetensorError naming neither the run folder nor --resume
    run = tmp_path / "run"
    real, calls = checkpoints.save_state, {"n": 0}

    def failing_second(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # checkpoint-4; checkpoint-2 was written
            raise FAILURES[failure]
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoints, "save_state", failing_second)
    with pytest.raises(OSError) as caught:
        trainer(tmp_path, max_steps=6, save_steps=2).train()
    message = str(caught.value)
    assert str(run) in message
    assert "checkpoint-4" in message and "checkpoint-2" in message and "intact" in message
    assert "free disk space" in message and "permissions" in message
    assert f"rloo train {run / 'config.yaml'} --resume" in message
    assert "trainer.train(resume_from_checkpoint=True)" in message
    # nothing half-written under a checkpoint's name, and the earlier checkpoint whole
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name) == ["checkpoint-2"]
    assert checkpoint_problem(run / "checkpoint-2") is None
    monkeypatch.undo()  # space freed: the resume the message names works
    trainer(tmp_path, max_steps=6, save_steps=2).train(resume_from_checkpoint=True)
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name) == [
        "checkpoint-2",
        "checkpoint-4",
        "checkpoint-6",
    ]


def test_a_failed_first_checkpoint_says_to_start_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoints, "save_state", full)
    with pytest.raises(OSError, match=r"checkpoint-2 .*run.*no earlier checkpoint.*free disk space") as caught:
        trainer(tmp_path, max_steps=2, save_steps=2).train()
    assert "--resume" not in str(caught.value)
    assert not [p.name for p in run.iterdir() if "checkpoint" in p.name]


def test_a_failed_rename_over_a_checkpoint_puts_the_old_one_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the same step saved twice (a stop right after a scheduled save): the old checkpoint-N is moved
    # aside for the new one; if the new one cannot take its name, the old one gets it back
    run = tmp_path / "run"
    trainer(tmp_path, max_steps=2, save_steps=2).train()
    before = (run / "checkpoint-2" / "manifest.json").read_text()
    real = os.replace

    def refusing(src: Any, dst: Any) -> None:
        if Path(src).name == "tmp-checkpoint-2":
            raise PermissionError(errno.EACCES, "Permission denied")
        real(src, dst)

    resumed = trainer(tmp_path, max_steps=2, save_steps=2)
    resumed.train(resume_from_checkpoint=True)
    monkeypatch.setattr(os, "replace", refusing)
    with pytest.raises(OSError, match=r"checkpoint-2.*intact"):
        resumed._save_checkpoint()
    monkeypatch.undo()
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name) == ["checkpoint-2"]
    assert (run / "checkpoint-2" / "manifest.json").read_text() == before
    assert checkpoint_problem(run / "checkpoint-2") is None


def test_the_cli_prints_a_failed_checkpoint_write_as_its_own_message() -> None:
    """No "CheckpointWriteError: ... (rloo --debug ...)" wrapper: the message already says what to do."""
    from rloo.cli.commands import _describe
    from rloo.training.checkpointing.checkpoints import CheckpointWriteError

    assert _describe(CheckpointWriteError("could not write checkpoint-4 in runs/x; resume with ...")) == (
        "could not write checkpoint-4 in runs/x; resume with ...",
        1,
    )
