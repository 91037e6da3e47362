"""Damaged checkpoints and killed runs lead somewhere: every refusal names a command that works.

Issue "damaged checkpoints lead somewhere": each message below used to point at a dead end (a
checkpoint that is itself refused, a fresh start that is refused, a traceback after a clean stop).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.helpers.cli import flat, invoke
from tests.helpers.launch import write_run_file
from tests.helpers.models import trainer
from tests.training.checkpointing.test_kill_resume import launch, tail


def names(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir() if "checkpoint-" in p.name)


def test_a_newest_checkpoint_missing_a_file_offers_the_newest_intact_one(tmp_path: Path) -> None:
    # before: "resume_from_checkpoint='.../checkpoint-2' is not a complete checkpoint (missing
    # training_state.safetensors); pick a checkpoint-<step> folder", also to a `--resume` user
    run = tmp_path / "run"
    run_file = write_run_file(tmp_path, run, max_steps=4, save_steps=2)
    assert invoke("train", run_file).exit_code == 0
    (run / "checkpoint-4" / "training_state.safetensors").unlink()
    result = invoke("train", run_file, "--resume")
    message = flat(result.stderr)
    assert result.exit_code == 2, result.output
    assert "checkpoint-4 is damaged: training_state.safetensors is missing" in message
    assert f"--resume-from {run / 'checkpoint-2'}" in message  # the CLI's flag, not the API's argument
    assert "resume_from_checkpoint=" not in message and "not a complete checkpoint" not in message
    with pytest.raises(ValueError, match=r"checkpoint-4 is damaged.*resume_from_checkpoint='.*checkpoint-2'") as info:
        trainer(tmp_path, output_dir=str(run), max_steps=5).train(resume_from_checkpoint=True)
    assert "--resume-from" not in str(info.value)  # the API user gets the argument


def test_resuming_from_the_offered_checkpoint_moves_the_damaged_ones_aside(tmp_path: Path) -> None:
    # before: --resume-from checkpoint-2 was refused because the damaged checkpoint-4 was "newer"
    # and would be overwritten, and "resume from the newest" pointed back at checkpoint-4
    run = tmp_path / "run"
    run_file = write_run_file(tmp_path, run, max_steps=6, save_steps=2)
    assert invoke("train", run_file).exit_code == 0
    weights = run / "checkpoint-6" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    (run / "checkpoint-4" / "training_state.safetensors").unlink()
    refused = invoke("train", run_file, "--resume")
    assert refused.exit_code == 2 and f"--resume-from {run / 'checkpoint-2'}" in flat(refused.stderr)
    result = invoke("train", run_file, "--resume-from", "checkpoint-2")
    assert result.exit_code == 0, result.output
    message = flat(result.stderr)
    assert "moved checkpoint-4 aside to damaged-checkpoint-4" in message
    assert "moved checkpoint-6 aside to damaged-checkpoint-6" in message
    assert names(run) == [
        "checkpoint-2",
        "checkpoint-4",
        "checkpoint-6",
        "damaged-checkpoint-4",
        "damaged-checkpoint-6",
    ]
    assert not (run / "damaged-checkpoint-4" / "training_state.safetensors").exists()  # kept as it was
    assert len((run / "damaged-checkpoint-6" / "model.safetensors").read_bytes()) == len(weights.read_bytes()) - 100


def test_intact_newer_checkpoints_still_block_and_the_api_hint_names_the_argument(tmp_path: Path) -> None:
    trainer(tmp_path, max_steps=6, save_steps=2).train()
    run = tmp_path / "run"
    (run / "checkpoint-4" / "config.yaml").write_text("edited")  # damaged: moved aside, not counted
    with pytest.raises(ValueError, match=r"newer than checkpoint-2 \(checkpoint-6\);.*resume_from_checkpoint=True"):
        trainer(tmp_path, max_steps=7).train(resume_from_checkpoint=str(run / "checkpoint-2"))
    assert names(run) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]  # nothing changed


def test_a_run_killed_before_its_first_checkpoint_is_led_to_a_fresh_start_that_works(tmp_path: Path) -> None:
    # before: --resume said "train without resuming", which was refused: the folder holds the logs
    run = tmp_path / "run"
    run_file = write_run_file(tmp_path, run, max_steps=2, save_steps=2)
    run.mkdir()
    (run / "config.yaml").write_text(run_file.read_text())  # what a run SIGKILLed at step 1 leaves
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 0.5}\n')
    (run / "tmp-checkpoint-2").mkdir()
    result = invoke("train", run_file, "--resume")
    message = flat(result.stderr)
    assert result.exit_code == 2, result.output
    assert "has no checkpoint-<step> folder to resume from" in message
    assert "config.yaml, metrics.jsonl" in message
    assert "rloo train ... overwrite_output_dir=true (without --resume;" in message
    assert "replaces config.yaml" in message and "logs are kept renamed" in message
    assert "resume_from_checkpoint" not in message
    fresh = invoke("train", run_file, "overwrite_output_dir=true")
    assert fresh.exit_code == 0, fresh.output
    assert (run / "checkpoint-2").is_dir() and list(run.glob("metrics.before-*.jsonl"))


def test_no_fresh_start_is_offered_over_a_finished_run_without_naming_its_model(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run_file = write_run_file(tmp_path, run, max_steps=1, save_steps=5)
    assert invoke("train", run_file).exit_code == 0
    assert not list(run.glob("checkpoint-*"))
    message = flat(invoke("train", run_file, "--resume").stderr)
    assert "replaces final" in message and "choose a new output_dir" in message


# the second Ctrl-C lands while the process runs its atexit callbacks (a slow one, as a tracker's
# upload or a process group's release can be)
SLOW_EXIT = """
import atexit, sys, time
def slow_exit():
    print("EXITING", flush=True)
    end = time.monotonic() + 3
    while time.monotonic() < end:
        time.sleep(0.05)
atexit.register(slow_exit)
from rloo.cli import main
main()
"""


@pytest.mark.system
def test_a_second_ctrl_c_while_exiting_prints_no_traceback(tmp_path: Path) -> None:
    # before: "Exception ignored in atexit callback ... KeyboardInterrupt" after a complete checkpoint
    run = tmp_path / "run"
    ctrl_c = {"name": "tests.helpers.models:signal_after", "calls": 1, "signum": int(signal.SIGINT)}
    run_file = write_run_file(tmp_path, run, reward_funcs=[ctrl_c], max_steps=3, save_steps=5)
    log = tmp_path / "train.log"
    proc = launch(run_file, [], log, entry=["-c", SLOW_EXIT])
    deadline = time.monotonic() + 240
    while "EXITING" not in log.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, tail(log)
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)  # the second Ctrl-C
    assert proc.wait(timeout=60) == 128 + signal.SIGINT, tail(log)
    output = log.read_text(errors="replace")
    assert "SIGINT received: stopping after this step" in output
    assert "Resume with: rloo train" in flat(output)
    assert "Traceback" not in output and "Exception ignored" not in output, output[-3000:]
    assert "SIGINT received while exiting" in output
    assert (run / "checkpoint-1" / "manifest.json").is_file()
