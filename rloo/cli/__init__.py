"""The ``rloo`` command line, run files, evaluation, reports and the demo.

Heavy imports (torch, transformers) happen inside the commands, so ``rloo --help`` is fast.
"""

from rloo.cli import demo_commands  # noqa: F401  (registers the demo commands on the app)
from rloo.cli.commands import app, main

__all__ = ["app", "main"]
