"""The built-in sandboxed Python tool (rloo.tools.python_tool): what the model reads back from a program."""

from __future__ import annotations

import pytest

from rloo.rewards.sandbox import SandboxLimits
from rloo.tools.calling import Toolbox, run_tool_calls
from rloo.tools.python_tool import python_tool

RUN = python_tool(SandboxLimits(timeout=3.0, cpu_seconds=2))


def call(code: str) -> dict[str, object]:
    request = {"type": "function", "function": {"name": "run_python", "arguments": {"code": code}}}
    ((answer,),) = run_tool_calls([(Toolbox([RUN]), [request])], timeout=30.0)
    return {"content": answer.message["content"], "failed": answer.failed}


def test_a_program_answers_with_what_it_printed() -> None:
    assert call("print(6 * 7)") == {"content": "42\n", "failed": False}


def test_a_failing_program_answers_with_its_error_not_a_failed_call() -> None:
    answer = call("print('before')\n1 / 0")
    assert answer["content"] == "before\nZeroDivisionError: division by zero" and answer["failed"] is False


def test_a_program_that_runs_forever_is_stopped_at_a_limit() -> None:
    answer = call("while True:\n    pass")["content"]
    assert "stopped (error" in answer or answer.endswith("[timed out after 3 s]")  # CPU seconds, or wall time
    sleeper = python_tool(SandboxLimits(timeout=1.0))("import time\ntime.sleep(30)")
    assert sleeper.endswith("[timed out after 1 s]")


def test_a_long_answer_is_cut() -> None:
    short = python_tool(max_chars=10)
    assert short("print('x' * 100)") == "x" * 9 + "…"


def test_the_tool_has_a_schema_the_chat_template_can_render() -> None:
    from transformers.utils import get_json_schema

    schema = get_json_schema(RUN)
    assert schema["function"]["name"] == "run_python"
    assert schema["function"]["parameters"]["required"] == ["code"]


def test_a_bad_sandbox_setting_fails_when_the_tool_is_made() -> None:
    with pytest.raises(ValueError, match="sandbox='nope' is not one of"):
        python_tool(sandbox="nope")
