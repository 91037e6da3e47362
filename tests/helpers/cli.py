"""Running the ``rloo`` command line in-process, for the CLI tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from click.testing import Result
from typer.testing import CliRunner

from rloo.cli import app

runner = CliRunner()
DROP = object()  # a run_file() value: leave this key out of the run file


def invoke(*args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def flat(text: str) -> str:
    """Rich wraps long lines at 80 columns; compare messages with whitespace collapsed."""
    return " ".join(text.split())


def run_file(folder: Path, files: dict[str, Path], **values: Any) -> Path:
    """Write a tiny run file to ``folder/run.yaml``; ``values`` replace, add or (DROP) remove keys."""
    run: dict[str, Any] = {
        "model": str(files["model"]),
        "dataset": {"path": str(files["data"])},
        "reward_funcs": ["accuracy"],
        "num_generations": 2,
        "per_device_train_batch_size": 4,
        "max_completion_length": 2,
        "max_steps": 1,
        "logging_steps": 1,
        "save_steps": 1,
        "output_dir": str(folder / "run"),
    }
    for key, value in values.items():
        if value is DROP:
            del run[key]
        else:
            run[key] = value
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(run, sort_keys=False))
    return path
