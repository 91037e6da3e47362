"""A built-in tool: the model's Python code, run in the sandbox the ``code_execution`` reward uses.

``python_tool()`` returns ``run_python(code: str) -> str``, a tool for ``tools=[...]``: each call is a fresh
interpreter under bubblewrap with the rlimits of :class:`rloo.rewards.sandbox.SandboxLimits` (no network,
a read-only root, a small private disk; :mod:`rloo.rewards.sandbox` says what it can and cannot reach). The
model reads what the program printed, or its error: a failing program is an answer, not a failed call.
"""

from __future__ import annotations

from collections.abc import Callable

from rloo.rewards.sandbox import SandboxLimits, run_in_sandbox, sandbox_backend

MAX_ANSWER_CHARS = 2000  # an answer longer than this is cut (it becomes context tokens of the episode)


def python_tool(
    limits: SandboxLimits | None = None, sandbox: str = "auto", max_chars: int = MAX_ANSWER_CHARS
) -> Callable[[str], str]:
    """The ``run_python`` tool, with the sandbox's ``limits`` per call and ``sandbox`` as
    :func:`rloo.rewards.sandbox.run_in_sandbox` takes it (``auto``: bubblewrap if it works here, else the
    rlimits alone, with a warning); answers cut to ``max_chars``."""
    limits = limits if limits is not None else SandboxLimits()
    sandbox_backend(sandbox)  # a bad value, or sandbox='bwrap' without bubblewrap, fails now, not at a call

    def run_python(code: str) -> str:
        """Run a Python program in a sandbox and return what it printed.

        Args:
            code: The program; print the values you want to see.
        """
        result = run_in_sandbox(code, limits=limits, sandbox=sandbox)
        if result.status == "ok":
            answer = result.stdout
        elif result.status == "timeout":
            answer = f"{result.stdout}[timed out after {limits.timeout:g} s]"
        elif result.stderr.strip():  # the error's last line: what a traceback ends with
            answer = result.stdout + result.stderr.strip().splitlines()[-1]
        else:  # killed without a word: a signal or a limit (CPU seconds, memory, output)
            answer = (
                f"{result.stdout}[stopped ({result.status}, exit code {result.returncode}): a crash or a limit of the "
                f"sandbox: {limits.cpu_seconds} CPU s, {limits.memory_mb} MiB, {limits.output_bytes} bytes of output]"
            )
        return answer if len(answer) <= max_chars else answer[: max_chars - 1] + "…"

    return run_python
