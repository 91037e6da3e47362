"""Child processes of the tests that launch ``rloo`` for real (kill loop, multi-process runs)."""

from __future__ import annotations

import os

from tests.helpers.paths import REPO


def child_env(**extra: str) -> dict[str, str]:
    """This environment, with the repository importable (``tests.helpers`` rewards), one thread
    per process (the same sums in every run, no spin-waiting), wide console lines (rich does not
    wrap the "resumed from PATH" line), and ``extra``."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "OMP_NUM_THREADS": "1",
        "COLUMNS": "1000",
        **extra,
    }
