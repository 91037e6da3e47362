"""How a reward (or tool) call is run so a slow or hung one cannot hold the run silently: in a daemon thread,
waited for ``timeout`` seconds (:func:`with_timeout`) or watched without a limit, reporting at each doubling
(:func:`watched`); ``async def`` calls awaited together in one event loop (:func:`run_async`), a fresh thread's
when the caller already runs one (a notebook).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any


def in_thread(call: Callable[[], Any], name: str = "rloo-reward") -> tuple[threading.Thread, dict[str, Any]]:
    """``call()`` started in a daemon thread; its result (``box["result"]``) or exception (``box["error"]``)
    lands in the returned box. Reward calls and tool calls (:mod:`rloo.tools.calling`) run this way."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as error:  # handed to the caller's thread
            box["error"] = error

    thread = threading.Thread(target=run, daemon=True, name=name)
    thread.start()
    return thread, box


def outcome(box: dict[str, Any]) -> Any:
    if "error" in box:
        raise box["error"]
    return box["result"]


def watched(call: Callable[[], Any], watch_after: float, report: Callable[[float], None]) -> Any:
    """``call()`` in a daemon thread, waited for without a limit; ``report(seconds)`` after ``watch_after``
    seconds, then at each doubling, while it runs (from this thread: the console is not thread-safe)."""
    thread, box = in_thread(call)
    waited, wait = 0.0, watch_after
    while True:
        thread.join(wait)
        if not thread.is_alive():
            return outcome(box)
        waited += wait
        report(waited)
        wait = waited  # the next report when the time so far has doubled


def with_timeout(call: Callable[[], Any], timeout: float) -> Any:
    """``call()`` in a daemon thread, waited for ``timeout`` seconds: a hung function keeps its
    thread (Python cannot kill one) but no longer holds the run, nor the interpreter's exit."""
    thread, box = in_thread(call)
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError
    return outcome(box)


def run_async(
    funcs: Sequence[Callable[..., Any]],
    kwargs: Sequence[dict[str, Any]],
    timeout: float | None,
    watch: Callable[..., None] | None = None,
    names: Sequence[str] = (),
    watch_after: float | None = None,
) -> list[Any]:
    """Await every ``funcs[i](**kwargs[i])`` together in one event loop; exceptions are returned, not raised.
    ``watch(name, seconds=...)``: the watchdog's report of a call still running after ``watch_after`` seconds
    (then at each doubling)."""
    if not funcs:
        return []

    async def call(func: Callable[..., Any], arguments: dict[str, Any]) -> Any:
        # Called inside the coroutine so a bad signature is caught per function, too.
        return await asyncio.wait_for(func(**arguments), timeout)

    async def gather() -> list[Any]:
        calls = [call(f, a) for f, a in zip(funcs, kwargs, strict=True)]
        if watch is None or watch_after is None:
            return await asyncio.gather(*calls, return_exceptions=True)
        tasks = [asyncio.ensure_future(c) for c in calls]
        waited, wait = 0.0, watch_after
        while True:
            _, pending = await asyncio.wait(tasks, timeout=wait)
            if not pending:
                break
            waited += wait
            for task, name in zip(tasks, names, strict=True):
                if task in pending:
                    watch(name, seconds=waited)
            wait = waited
        return [task.exception() or task.result() for task in tasks]

    return run_coroutine(gather)


def run_coroutine(make: Callable[[], Coroutine[Any, Any, list[Any]]]) -> list[Any]:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    # This thread's loop is blocked by our synchronous caller, so use a fresh thread and loop.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()
