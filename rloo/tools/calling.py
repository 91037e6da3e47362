"""Running the tool calls of a batch's episodes: every call at once, each within ``tool_timeout``.

A tool is a Python function (sync or ``async``) with typed arguments and a Google-style docstring, as
TRL and transformers' chat templates take it (``transformers.utils.get_json_schema`` builds its JSON
schema). A call's answer is the tool message ``{"role": "tool", "name": name, "content": str(result)}``;
a call that fails (an unknown tool, arguments the function does not take, an exception, a result whose
``str()`` raises, no answer within ``tool_timeout``) is answered with ``str({"error": message})``, as TRL
answers it, and counted as a failure: the model reads the error and the run goes on.

The calls of all episodes run concurrently, each in its own thread (an ``async`` tool in its own event
loop there), so one slow tool costs the batch its own time, not the sum. A call that outlives
``tool_timeout`` keeps its daemon thread (Python cannot kill one) but no longer holds the run, as a reward
function past ``reward_timeout`` does (:func:`rloo.rewards.threads.with_timeout`; here the calls start
together and share one deadline).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rloo.rewards.threads import in_thread
from rloo.waiting import waiting_for


@dataclass(frozen=True)
class ToolAnswer:
    """One call's tool message and whether the call failed."""

    message: dict[str, Any]
    failed: bool


class Toolbox:
    """The tools one episode may call, by name (a function's ``__name__``)."""

    def __init__(self, tools: Sequence[Callable[..., Any]]) -> None:
        self.tools: dict[str, Callable[..., Any]] = {}
        for tool in tools:
            name = getattr(tool, "__name__", None)
            if not callable(tool) or not isinstance(name, str):
                raise ValueError(f"tools: {tool!r} is not a function; give functions (or an environment's methods)")
            if name in self.tools and self.tools[name] != tool:  # a bound method is a new object each access
                raise ValueError(f"tools: two tools are named {name!r}; the model calls them by name, so rename one")
            check_describable(tool, name)
            self.tools[name] = tool

    @property
    def functions(self) -> list[Callable[..., Any]]:
        return list(self.tools.values())


def check_describable(tool: Callable[..., Any], name: str) -> None:
    """Refuse, naming it, a tool the chat template cannot describe to the model: its JSON schema (transformers'
    ``get_json_schema``, what ``apply_chat_template(tools=...)`` calls) needs a docstring with an ``Args:``
    section and a type hint on every argument. Checked when the trainer is built, not at the first rollout."""
    from transformers.utils.chat_template_utils import get_json_schema

    try:
        get_json_schema(tool)
    except Exception as error:  # transformers' DocstringParsingException / TypeHintParsingException
        raise ValueError(
            f"tools: {name!r} cannot be described to the model ({error}); give it a Google-style docstring (a "
            "summary line and an Args: section naming every argument) and a type hint on every argument"
        ) from None


def run_tool_calls(
    jobs: Sequence[tuple[Toolbox, Sequence[dict[str, Any]]]], timeout: float | None
) -> list[list[ToolAnswer]]:
    """The answers to each job's calls (TRL's ``{"type": "function", "function": {"name", "arguments"}}``),
    in order; every call of every job runs at once, each within ``timeout`` seconds (None: no limit)."""
    pending: list[tuple[int, int, _Call]] = []
    answers: list[list[ToolAnswer | None]] = [[None] * len(calls) for _, calls in jobs]
    for j, (toolbox, calls) in enumerate(jobs):
        for c, request in enumerate(calls):
            function = request.get("function") or {}
            name = str(function.get("name") or request.get("name") or "unknown")
            if request.get("type", "function") != "function":
                answers[j][c] = _error(name, f"Unsupported tool call type: {request.get('type')}")
                continue
            arguments, tool = function.get("arguments") or {}, toolbox.tools.get(name)
            if tool is None:
                answers[j][c] = _error(name, f"Tool {name} not found.")
            elif not isinstance(arguments, dict):
                answers[j][c] = _error(name, f"the arguments of {name} must be a JSON object, got {arguments!r}")
            else:
                pending.append((j, c, _Call(name, tool, dict(arguments))))
    for _, _, running in pending:
        running.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    for j, c, running in pending:
        with waiting_for(f"tool `{running.name}` ({len(pending)} calls running)"):
            answers[j][c] = running.answer(deadline, timeout)
    return [[answer for answer in row if answer is not None] for row in answers]


def _error(name: str, message: str) -> ToolAnswer:
    return ToolAnswer({"role": "tool", "name": name, "content": str({"error": message})}, failed=True)


class _Call:
    """One tool call running in a daemon thread (:func:`rloo.rewards.threads.in_thread`)."""

    def __init__(self, name: str, tool: Callable[..., Any], arguments: dict[str, Any]) -> None:
        self.name, self.tool, self.arguments = name, tool, arguments

    def start(self) -> None:
        self.thread, self.box = in_thread(self._run, name=f"rloo-tool-{self.name}")

    def _run(self) -> str:
        result = self.tool(**self.arguments)
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
        return str(result)  # a str() that raises is a failed call too

    def answer(self, deadline: float | None, timeout: float | None) -> ToolAnswer:
        self.thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self.thread.is_alive():
            return _error(self.name, f"tool {self.name} did not return within tool_timeout={timeout} s")
        if "error" in self.box:  # answered to the model, never raised into the run
            error = self.box["error"]
            return _error(self.name, str(error) or type(error).__name__)
        return ToolAnswer({"role": "tool", "name": self.name, "content": self.box["result"]}, failed=False)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
