"""The ``code_execution`` reward: run each completion's Python against its test cases in the
sandbox of :mod:`rloo.rewards.sandbox` and score the fraction that pass.

Test cases come from a dataset column (``test_cases`` by default), one cell per prompt:

- a list of ``{"input": str, "output": str}``: the program reads ``input`` on stdin and
  passes if it exits 0 and its stdout equals ``output``, ignoring whitespace at the end of
  each line and blank lines at the end;
- a string of Python (asserts, say), appended after the solution: passes if the whole exits 0;
- a list mixing both kinds (each string is one test);
- ``None`` or an empty list: the reward does not apply (``None``).

The reward is ``passed / number of tests``: 1.0 for a correct solution, a fraction for a
partial one, 0.0 (the failure reward) for no code or code that crashes, times out or exceeds
a limit on every test. The code is the last fenced block tagged ``python``/``py``/``python3``
or untagged; a completion with no fenced block at all is code as a whole.

Nothing a completion does raises: hostile code fails its tests and training goes on. A cell of
the wrong shape is a dataset mistake and raises ``ValueError`` naming the column and row.
Executions (completions x tests) run concurrently in a thread pool, each its own process, so
a batch takes about ``executions / workers`` times one execution, and at most
``executions / workers * timeout`` seconds when every program hangs.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rloo.rewards.sandbox import SandboxLimits, SandboxResult, run_in_sandbox, sandbox_backend
from rloo.rewards.signatures import completion_text

if TYPE_CHECKING:
    from rloo.rewards.calling import RewardFunc

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = ("", "python", "py", "python3")
OPT_OUT = 'code_execution_reward(sandbox="none") (in a run file: {name: code_execution, sandbox: none})'


@dataclass(frozen=True)
class CodeTest:
    """One test: ``stdin`` and the ``expected`` stdout, or ``appended`` code that must exit 0."""

    stdin: str = ""
    expected: str | None = None
    appended: str | None = None

    def program(self, solution: str) -> str:
        return solution if self.appended is None else f"{solution}\n\n{self.appended}\n"

    def passed(self, result: SandboxResult) -> bool:
        if not result.ok:
            return False
        return self.expected is None or normalize_output(result.stdout) == normalize_output(self.expected)


def extract_code(text: str) -> str | None:
    """The last fenced block tagged python (``python``, ``py``, ``python3``) or untagged; the whole
    text when it has no fenced block; ``None`` when that is blank or only other languages are fenced."""
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(text)]
    if blocks:
        python = [body for tag, body in blocks if tag in _PYTHON_TAGS]
        code = python[-1] if python else ""
    else:
        code = text
    return code if code.strip() else None


def normalize_output(text: str) -> str:
    """``text`` without whitespace at the end of each line and without trailing blank lines."""
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def parse_test_cases(value: Any, column: str = "test_cases", row: int = 0) -> list[CodeTest] | None:
    """One cell of the test-case column -> its tests (``None`` or ``[]``: ``None``, does not apply)."""
    if value is None:
        return None
    if isinstance(value, str):
        return [CodeTest(appended=value)]
    if not isinstance(value, Sequence) or isinstance(value, bytes):
        raise ValueError(_bad_cell(column, row, f"is a {type(value).__name__}"))
    tests = []
    for position, item in enumerate(value):
        if isinstance(item, str):
            tests.append(CodeTest(appended=item))
        elif isinstance(item, Mapping) and isinstance(item.get("input"), str) and isinstance(item.get("output"), str):
            tests.append(CodeTest(stdin=item["input"], expected=item["output"]))
        else:
            raise ValueError(_bad_cell(column, row, f"has {item!r} at position {position}"))
    return tests or None


def _bad_cell(column: str, row: int, problem: str) -> str:
    return (
        f"code_execution: dataset column {column!r} {problem} in row {row}; give a list of "
        '{"input": str, "output": str} test cases, a string of Python test code (e.g. asserts), or None'
    )


def code_execution_reward(
    column: str = "test_cases",
    timeout: float = 5.0,
    cpu_seconds: int = 5,
    memory_mb: int = 512,
    max_processes: int = 32,
    output_bytes: int = 1 << 20,
    disk_mb: int = 16,
    sandbox: str = "auto",
    workers: int | None = None,
) -> RewardFunc:
    """A reward named ``code_execution``: the fraction of the row's test cases (dataset column
    ``column``) the completion's code passes, each run by :func:`rloo.rewards.sandbox.run_in_sandbox`
    under the limits given (see :class:`rloo.rewards.sandbox.SandboxLimits`), ``workers`` at a
    time (default ``os.cpu_count()``). ``sandbox``: ``auto``, ``bwrap`` or ``none`` (UNSAFE), as there.

    Bad limits, an unknown ``sandbox``, or no working bubblewrap without ``sandbox="none"``
    (:class:`rloo.rewards.sandbox.SandboxUnavailable`) raise here, when the reward is built.
    """
    limits = SandboxLimits(timeout, cpu_seconds, memory_mb, max_processes, output_bytes, disk_mb)
    if not isinstance(column, str) or not column:
        raise ValueError(f"code_execution: column={column!r} is invalid; give the name of the test-case column")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"code_execution: workers={workers!r} is invalid; give an integer >= 1, or None")
    sandbox_backend(sandbox, "the code_execution reward", OPT_OUT)  # refused now, not on the first batch
    pool_size = workers or os.cpu_count() or 1

    def code_execution(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        if column not in kwargs:
            raise KeyError(f"code_execution needs dataset column {column!r}; columns given: {sorted(kwargs)}")
        tests = [parse_test_cases(cell, column, row) for row, cell in enumerate(kwargs[column])]
        codes = [extract_code(completion_text(c)) for c in completions]
        jobs = [(n, code, test) for n, code in enumerate(codes) if code is not None for test in tests[n] or []]

        def run(job: tuple[int, str, CodeTest]) -> bool:
            _, code, test = job
            return test.passed(run_in_sandbox(test.program(code), test.stdin, limits, sandbox))

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(pool_size, len(jobs)))) as pool:
            outcomes = list(pool.map(run, jobs))
        passed = [0] * len(codes)
        for (n, _, _), ok in zip(jobs, outcomes, strict=True):
            passed[n] += ok
        return [None if t is None else passed[n] / len(t) for n, t in enumerate(tests)]

    code_execution.required_columns = (column,)  # type: ignore[attr-defined]  # checked when the trainer is built
    return code_execution
