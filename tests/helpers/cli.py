"""Running the ``rloo`` command line in-process, for the CLI tests."""

from __future__ import annotations

from pathlib import Path

from click.testing import Result
from typer.testing import CliRunner

from rloo.cli import app

runner = CliRunner()


def invoke(*args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def flat(text: str) -> str:
    """Rich wraps long lines at 80 columns; compare messages with whitespace collapsed."""
    return " ".join(text.split())
