"""A built-in tool: the model's Python code, run in the sandbox the ``code_execution`` reward uses.

``python_tool()`` returns ``run_python(code: str) -> str``, a tool for ``tools=[...]``: each call is a fresh
interpreter under bubblewrap with the rlimits of :class:`rloo.rewards.sandbox.SandboxLimits` (no network,
a read-only root, a small private disk; :mod:`rloo.rewards.sandbox` says what it can and cannot reach). The
model reads what the program printed, or its error: a failing program is an answer, not a failed call.
Without a working bubblewrap the tool is refused when it is made; ``sandbox="none"`` is the unsafe opt-out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from rloo.rewards.sandbox import SandboxLimits, SandboxResult, run_in_sandbox, sandbox_backend

MAX_ANSWER_CHARS = 2000  # an answer longer than this is cut (it becomes context tokens of the episode)
OPT_OUT = 'python_tool(sandbox="none") (in a run file: tools: [{name: python, sandbox: none}])'


def python_tool(
    limits: SandboxLimits | None = None, sandbox: str = "auto", max_chars: int = MAX_ANSWER_CHARS
) -> Callable[[str], str]:
    """The ``run_python`` tool, with the sandbox's ``limits`` per call and ``sandbox`` as
    :func:`rloo.rewards.sandbox.run_in_sandbox` takes it (``auto``: bubblewrap, and
    :class:`rloo.rewards.sandbox.SandboxUnavailable` here where it does not work; ``none``: UNSAFE, the
    rlimits alone); answers cut to ``max_chars``, keeping the note that says how a program was stopped."""
    limits = limits if limits is not None else SandboxLimits()
    sandbox_backend(sandbox, "the python tool", OPT_OUT)  # refused now, not at the first call

    def run_python(code: str) -> str:
        """Run a Python program in a sandbox and return what it printed.

        Args:
            code: The program; print the values you want to see.
        """
        return answer_text(run_in_sandbox(code, limits=limits, sandbox=sandbox), limits, max_chars)

    return run_python


def answer_text(result: SandboxResult, limits: SandboxLimits, max_chars: int) -> str:
    """What the model reads: the program's output, then what stopped it (its error's last line, the time
    limit, or a limit that killed it without a word). The output is cut first, so the ending survives."""
    if result.status == "timeout":
        ending = f"[timed out after {limits.timeout:g} s]"
    elif result.status != "ok" and result.stderr.strip():  # the error's last line: what a traceback ends with
        ending = result.stderr.strip().splitlines()[-1]
    elif result.status != "ok":  # killed without a word: a signal or a limit (CPU seconds, memory, output)
        ending = (
            f"[stopped ({result.status}, exit code {result.returncode}): a crash or a limit of the sandbox: "
            f"{limits.cpu_seconds} CPU s, {limits.memory_mb} MiB, {limits.output_bytes} bytes of output]"
        )
    else:
        ending = ""
    ending = ending[:max_chars]
    room = max_chars - len(ending)
    output = result.stdout
    if len(output) > room:
        output = output[: room - 1] + "…" if room > 0 else ""
    return output + ending


def python_tool_from_spec(spec: Mapping[str, Any], position: int = 0) -> Callable[[str], str]:
    """A run file's ``{name: python, sandbox: ..., max_chars: ..., <a SandboxLimits field>: ...}``."""
    limit_names = [field.name for field in fields(SandboxLimits)]
    params = {key: value for key, value in spec.items() if key != "name"}
    unknown = sorted(set(params) - {"sandbox", "max_chars", *limit_names})
    if unknown:
        accepted = ", ".join(["sandbox", "max_chars", *limit_names])
        raise ValueError(
            f"`tools[{position}]`: the python tool does not take {', '.join(unknown)}; it takes {accepted}"
        )
    limits = SandboxLimits(**{key: params[key] for key in limit_names if key in params})
    return python_tool(limits, params.get("sandbox", "auto"), params.get("max_chars", MAX_ANSWER_CHARS))
