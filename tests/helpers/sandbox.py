"""The sandbox on this machine, for tests that run model-written code: they run under bubblewrap or are
skipped saying why, never unsandboxed; and hiding bubblewrap, for the tests of what happens without it."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from rloo.rewards import sandbox
from rloo.rewards.sandbox import SandboxLimits

BWRAP_PROBLEM = sandbox.bwrap_problem()  # the probe: bwrap starts and isolates a program (once per process)
needs_bwrap = pytest.mark.skipif(
    BWRAP_PROBLEM is not None,
    reason=f"{BWRAP_PROBLEM}: no sandbox to run model-written code in (install bubblewrap: `make sandbox`)",
)
SECRET = "hunter2-do-not-leak"
# short limits keep the attacks fast
LIMITS: dict[str, Any] = {"timeout": 2.0, "cpu_seconds": 1, "memory_mb": 256, "max_processes": 8, "output_bytes": 4096}
SANDBOX_LIMITS = SandboxLimits(**LIMITS)
DOUBLE = [{"input": "2\n", "output": "4\n"}, {"input": "5", "output": "10   \n\n"}, {"input": "-1\n", "output": "-2"}]
CORRECT = "```python\nprint(2 * int(input()))\n```"

FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
# files under the size limit (output_bytes) until the working directory's tmpfs (disk_mb) is full
DISK_FLOOD = "i = 0\nwhile True:\n    with open(f'f{i}', 'wb') as file:\n        file.write(b'x' * 4000)\n    i += 1"
KILLERS = {
    "parent": "import os\nos.kill(os.getppid(), 9)",
    "pid 1": "import os\nos.kill(1, 9)",
    "everyone": "import os\nos.kill(-1, 9)",
    "every pid in /proc": (
        "import os\nfor pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    try:\n        os.kill(pid, 9) if pid != os.getpid() else None\n    except OSError:\n        pass"
    ),
}
KILLED = ("error", "timeout")  # by the CPU limit, or by the wall clock first on a busy machine
# hostile programs that need nothing from the host, and the statuses that contain them
ATTACKS = {
    "infinite loop": ("while True:\n    pass", KILLED),
    "sleep forever": ("import time\ntime.sleep(600)", ("timeout",)),
    "fork bomb": (FORK_BOMB, KILLED),
    "memory bomb": ("blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))", ("error",)),
    "giant allocation": ("x = bytearray(64 * 2**30)", ("error",)),
    "giant output": ("while True:\n    print('spam' * 1000)", ("output_limit",)),
    "disk flood": (DISK_FLOOD, ("error",)),
    **{f"kill {name}": (code, ("ok", "error")) for name, code in KILLERS.items()},
}


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nDone."


def hide_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on this process finds no bwrap (other programs are found as before), and the unsafe
    opt-out's warning is given again."""
    found = shutil.which

    def which(name: str, *args: Any, **kwargs: Any) -> str | None:
        return None if name == "bwrap" else found(name, *args, **kwargs)

    monkeypatch.setattr(sandbox.shutil, "which", which)
    monkeypatch.setattr(sandbox, "_WARNED", set())
