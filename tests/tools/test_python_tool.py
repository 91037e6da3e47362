"""The built-in sandboxed Python tool (rloo.tools.python_tool): what the model reads back from a program, and
hostile programs the tool must contain while the run goes on, each answered with what happened. Every test
that runs a program needs a working bubblewrap and is skipped, saying why, without one."""

from __future__ import annotations

import functools
import socket
import subprocess
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rloo.rewards.sandbox import SandboxLimits, SandboxResult
from rloo.tools.calling import Toolbox, run_tool_calls
from rloo.tools.python_tool import MAX_ANSWER_CHARS, answer_text, python_tool
from tests.helpers.sandbox import DISK_FLOOD, FORK_BOMB, SANDBOX_LIMITS, SECRET, needs_bwrap


@functools.cache
def tool() -> Callable[[str], str]:
    return python_tool(SandboxLimits(timeout=3.0, cpu_seconds=2))


def call(code: str, run: Callable[[str], str] | None = None) -> dict[str, object]:
    request = {"type": "function", "function": {"name": "run_python", "arguments": {"code": code}}}
    ((answer,),) = run_tool_calls([(Toolbox([run or tool()]), [request])], timeout=30.0)
    return {"content": answer.message["content"], "failed": answer.failed}


@needs_bwrap
def test_a_program_answers_with_what_it_printed() -> None:
    assert call("print(6 * 7)") == {"content": "42\n", "failed": False}


@needs_bwrap
def test_a_failing_program_answers_with_its_error_not_a_failed_call() -> None:
    answer = call("print('before')\n1 / 0")
    assert answer["content"] == "before\nZeroDivisionError: division by zero" and answer["failed"] is False


@needs_bwrap
def test_a_program_that_runs_forever_is_stopped_at_a_limit() -> None:
    answer = call("while True:\n    pass")["content"]
    assert "stopped (error" in answer or answer.endswith("[timed out after 3 s]")  # CPU seconds, or wall time
    sleeper = python_tool(SandboxLimits(timeout=1.0))("import time\ntime.sleep(30)")
    assert sleeper.endswith("[timed out after 1 s]")


@needs_bwrap
def test_a_long_answer_is_cut() -> None:
    short = python_tool(max_chars=10)
    assert short("print('x' * 100)") == "x" * 9 + "…"


def test_a_cut_answer_keeps_what_stopped_the_program() -> None:
    """A flood of output used to push the note past the cut: the model never read why the program stopped."""
    limits = SandboxLimits(timeout=2.0)
    flood = SandboxResult("timeout", None, "spam" * 1000, "", True, 2.0)
    assert answer_text(flood, limits, 40) == "spam" * 4 + "sp…[timed out after 2 s]"  # 40 characters
    crash = SandboxResult("error", 1, "x" * 100, "Traceback ...\nMemoryError", True, 0.1)
    assert answer_text(crash, limits, 20) == "x" * 8 + "…MemoryError"
    assert answer_text(crash, limits, 5) == "Memor"  # the note alone, cut, when nothing else fits


def test_the_tool_has_a_schema_the_chat_template_can_render() -> None:
    from transformers.utils import get_json_schema

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # made for its schema, never called: no sandbox needed
        schema = get_json_schema(python_tool(sandbox="none"))
    assert schema["function"]["name"] == "run_python"
    assert schema["function"]["parameters"]["required"] == ["code"]


def test_a_bad_sandbox_setting_fails_when_the_tool_is_made() -> None:
    with pytest.raises(ValueError, match="sandbox='nope' is not one of"):
        python_tool(sandbox="nope")


# ---------------------------------------------------------------------------- hostile programs


@dataclass
class Host:
    """What a program must not reach: a file, a listening port, a sleeping process, an environment secret."""

    secret_file: Path
    outside: Path
    server: socket.socket
    sleeper: subprocess.Popen[bytes]

    @property
    def port(self) -> int:
        return int(self.server.getsockname()[1])


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    monkeypatch.setenv("RLOO_TEST_SECRET", SECRET)
    (tmp_path / "secret.txt").write_text(SECRET)
    sleeper = subprocess.Popen(["sleep", "60"])
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        try:
            yield Host(tmp_path / "secret.txt", tmp_path / "escape.txt", server, sleeper)
        finally:
            sleeper.kill()
            sleeper.wait()


# name -> (the program, given the host; what the answer says: any of these; what must still hold on the host)
HOSTILE: dict[str, tuple[Callable[[Host], str], tuple[str, ...], Callable[[Host], bool]]] = {
    "read a host file": (
        lambda h: f"print(open({str(h.secret_file)!r}).read())",
        ("FileNotFoundError",),
        lambda h: True,
    ),
    "write outside": (
        lambda h: f"open({str(h.outside)!r}, 'w').write('pwned')",
        ("FileNotFoundError",),
        lambda h: not h.outside.exists(),
    ),
    "write to the root": (lambda h: "open('/usr/pwned', 'w').write('x')", ("Read-only file system",), lambda h: True),
    "loopback network": (
        lambda h: f"import socket\nsocket.create_connection(('127.0.0.1', {h.port}), timeout=1)",
        ("ConnectionRefusedError", "Network is unreachable"),
        lambda h: _nobody_connected(h.server),
    ),
    "signal a host process": (
        lambda h: f"import os\nos.kill({h.sleeper.pid}, 9)",
        ("ProcessLookupError",),
        lambda h: h.sleeper.poll() is None,
    ),
    "fork bomb": (lambda h: FORK_BOMB, ("[timed out after 2 s]", "[stopped (error"), lambda h: True),
    "memory bomb": (
        lambda h: "blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))",
        ("MemoryError",),
        lambda h: True,
    ),
    "endless loop": (lambda h: "while True:\n    pass", ("[timed out after 2 s]", "[stopped (error"), lambda h: True),
    "output flood": (
        lambda h: "while True:\n    print('spam' * 1000)",
        ("OSError: [Errno 27] File too large", "[stopped (output_limit"),
        lambda h: True,
    ),
    "disk flood": (lambda h: DISK_FLOOD, ("OSError: [Errno 28] No space left on device",), lambda h: True),
    "environment secret": (
        lambda h: (
            "import glob, os\nprint(os.environ.get('RLOO_TEST_SECRET'))\n"
            "print([open(p).read() for p in glob.glob('/proc/*/environ')])"
        ),
        ("None\n",),
        lambda h: True,
    ),
}


def _nobody_connected(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
    except BlockingIOError:
        return True
    return False


@needs_bwrap
@pytest.mark.parametrize("attack", HOSTILE)
def test_a_hostile_program_is_contained_and_the_answer_says_what_happened(attack: str, host: Host) -> None:
    program, said, holds = HOSTILE[attack]
    run = python_tool(SANDBOX_LIMITS)
    answer = call(program(host), run)
    content = str(answer["content"])
    assert answer["failed"] is False and any(words in content for words in said), content[-300:]
    assert SECRET not in content and len(content) <= MAX_ANSWER_CHARS
    assert holds(host), attack
    assert call("print(6 * 7)", run)["content"] == "42\n"  # the run goes on
