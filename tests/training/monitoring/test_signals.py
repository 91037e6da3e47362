"""Stop signals (Ctrl-C, SIGTERM, SIGHUP): finish the step, checkpoint, say how to resume, exit 128+N."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from rloo.cli import app
from rloo.tiny import save_tiny_model
from rloo.training.monitoring.signals import StopRequest, TrainingInterrupted
from tests.helpers.models import params, signal_after, trainer


def test_the_first_signal_asks_to_stop_and_says_so_the_second_interrupts(capsys: pytest.CaptureFixture[str]) -> None:
    before = signal.getsignal(signal.SIGHUP)
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGHUP)
        assert stop.signum == signal.SIGHUP and stop.requested
        assert "SIGHUP received: stopping after this step" in capsys.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGHUP) == before  # handlers restored


def test_sigterm_finishes_the_step_checkpoints_and_resumes(tmp_path: Path) -> None:
    # before: SIGTERM (what a scheduler sends before a kill) ended the process with no checkpoint
    interrupted = trainer(tmp_path / "a", signal_after(2), max_steps=4)
    with pytest.raises(TrainingInterrupted) as info:
        interrupted.train()
    assert info.value.exit_code == 128 + signal.SIGTERM and info.value.checkpoint.name == "checkpoint-2"
    resumed = trainer(tmp_path / "a", signal_after(0), max_steps=4)
    resumed.train(resume_from_checkpoint=True)
    straight = trainer(tmp_path / "b", signal_after(0), max_steps=4)
    straight.train()
    a, b = params(straight.unwrapped_model), params(resumed.unwrapped_model)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_cli_exits_128_plus_the_signal_and_prints_the_resume_command(tmp_path: Path) -> None:
    model = save_tiny_model(tmp_path / "model", chars="0123456789+= ")
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(f'{{"prompt": "{a}+{a}="}}\n' for a in range(8)))
    run = {
        "model": str(model),
        "dataset": str(data),
        "reward_funcs": [{"name": "tests.helpers.models:signal_after", "calls": 1, "signum": int(signal.SIGHUP)}],
        "num_generations": 2,
        "per_device_train_batch_size": 4,
        "max_completion_length": 3,
        "max_steps": 5,
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    result = CliRunner().invoke(app, ["train", str(path), "reward_clip_range=[-5,5]"])  # brackets: not markup
    assert result.exit_code == 128 + signal.SIGHUP, result.output
    recorded = tmp_path / "run" / "config.yaml"  # the whole run, the override included
    assert f"Resume with: rloo train {recorded} --resume" in " ".join(result.stderr.split())
    assert (tmp_path / "run" / "checkpoint-1" / "trainer_state.json").is_file()
    assert yaml.safe_load(recorded.read_text())["reward_clip_range"] == [-5, 5]
    # the printed command resumes (the reward signals again after one call: one more step, checkpointed)
    again = CliRunner().invoke(app, ["train", str(recorded), "--resume"])
    assert again.exit_code == 128 + signal.SIGHUP, again.output
    assert (tmp_path / "run" / "checkpoint-2" / "trainer_state.json").is_file()


def test_progress_prints_plain_lines_when_output_is_not_a_terminal() -> None:
    import io

    from rich.console import Console

    from rloo.training.monitoring.progress import TrainingProgress

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    ticks = iter([0.0, 10.0, 20.0, 30.0])  # a step every 10 s
    progress = TrainingProgress(console, total=3, completed=0, interval=0.0, clock=lambda: next(ticks))
    with progress:
        for step in (1, 2, 3):
            progress.update(step, {"reward": 0.5 * step, "kl": 0.01, "tokens_per_second": 120.0})
    lines = out.getvalue().splitlines()
    assert lines == [
        "step 1/3 (0:20 left) last step: reward=0.500 kl=0.0100 tok/s=120",
        "step 2/3 (0:10 left) last step: reward=1.000 kl=0.0100 tok/s=120",
        "step 3/3 last step: reward=1.500 kl=0.0100 tok/s=120",
    ]
    quiet = io.StringIO()
    slow = TrainingProgress(Console(file=quiet, force_terminal=False, width=200), total=3, completed=0, interval=3600)
    with slow:
        for step in (1, 2, 3):
            slow.update(step, {"reward": 1.0})
    assert quiet.getvalue().splitlines() == ["step 3/3 last step: reward=1.000"]  # at most every interval, and the last
    assert TrainingProgress(Console(file=io.StringIO(), force_terminal=True), 3, 0).plain is False


def screen(output: str) -> list[str]:
    """The lines a terminal shows after ``output``: carriage return, erase line, cursor up, newline."""
    import re

    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[\d*[A-Za-z]|\x1b\[\?\d+[hl]|\r|\n|[^\x1b\r\n]+", output):
        if token == "\n":
            row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        elif token == "\r":
            col = 0
        elif token == "\x1b[2K":
            lines[row] = ""
        elif token == "\x1b[1A":
            row = max(row - 1, 0)
        elif not token.startswith("\x1b"):
            lines[row] = lines[row][:col] + token + lines[row][col + len(token) :]
            col += len(token)
    return [line.rstrip() for line in lines if line.strip()]


def test_the_bar_is_cleared_before_the_summary_in_a_terminal() -> None:
    """The bar stayed below the last log line and the summary (issue 24): training had ended."""
    import io

    from rich.console import Console

    from rloo.training.monitoring.progress import TrainingProgress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    with TrainingProgress(console, total=2, completed=0) as progress:
        for step in (1, 2):
            progress.update(step, {"reward": 0.5})
            console.print(f"step {step}/2 reward=0.5")
    console.print("trained to step 2/2 in 1.0 s")
    assert screen(out.getvalue()) == ["step 1/2 reward=0.5", "step 2/2 reward=0.5", "trained to step 2/2 in 1.0 s"]
