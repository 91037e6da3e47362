"""What the run is waiting for: the places that block (sampling, a reward function, a tool, the vLLM server, a
rollout worker) say so with :func:`waiting_for`, and the progress line
(:mod:`rloo.training.monitoring.progress`) shows the newest wait that has lasted a few seconds: ``waiting for
reward function `judge` (12 s)``, so a run that stands still says on what.

A leaf module (it imports nothing of rloo), so every stage can mark its waits. Waits nest (sampling, then the
vLLM server's answer inside it) and may come from several threads; the newest one still open is the most
specific. Marking costs a lock and a dict entry: nothing a step notices.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Wait:
    """An open wait: ``what`` (words: "the vLLM server at http://... (/generate/)") since ``since``
    (``time.monotonic()`` seconds)."""

    what: str
    since: float

    def seconds(self, now: float) -> float:
        return now - self.since


_lock = threading.Lock()
_open: dict[int, Wait] = {}  # insertion order is the order the waits began
_tickets = itertools.count()


@contextlib.contextmanager
def waiting_for(what: str) -> Iterator[None]:
    """Mark the block as a wait on ``what`` (read by :func:`current_wait` until the block ends)."""
    ticket = next(_tickets)
    with _lock:
        _open[ticket] = Wait(what, time.monotonic())
    try:
        yield
    finally:
        with _lock:
            _open.pop(ticket, None)


def current_wait(lasted: float = 0.0) -> Wait | None:
    """The newest open wait (the most specific) that has lasted ``lasted`` seconds, or None. An older one
    shows through a newer short one: a wait for a server to start is made of 5-second tries."""
    now = time.monotonic()
    with _lock:
        return next((wait for wait in reversed(_open.values()) if wait.seconds(now) >= lasted), None)


def describe(wait: Wait, now: float) -> str:
    """``waiting for WHAT (12 s)``: the words the progress line shows."""
    return f"waiting for {wait.what} ({wait.seconds(now):.0f} s)"
