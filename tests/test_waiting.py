"""What the run waits for (issue 42): nested and threaded waits, and the newest open one is the one named."""

from __future__ import annotations

import threading

from rloo import waiting
from rloo.waiting import Wait, current_wait, describe, waiting_for


def test_the_newest_open_wait_is_the_current_one_and_an_ended_one_is_forgotten() -> None:
    assert current_wait() is None
    with waiting_for("sampling (4 prompts x 2 completions)"):
        outer = current_wait()
        assert outer is not None and outer.what.startswith("sampling")
        with waiting_for("the vLLM server at http://127.0.0.1:8000 (/generate/)"):
            inner = current_wait()
            assert inner is not None and inner.what.endswith("(/generate/)") and inner.since >= outer.since
        assert current_wait() == outer
    assert current_wait() is None


def test_a_wait_ended_by_an_exception_is_forgotten_too() -> None:
    try:
        with waiting_for("reward function `judge`"):
            raise RuntimeError("judge failed")
    except RuntimeError:
        pass
    assert current_wait() is None


def test_waits_from_other_threads_are_seen_and_ended_in_any_order() -> None:
    started, release = threading.Event(), threading.Event()

    def tool() -> None:
        with waiting_for("tool `search`"):
            started.set()
            release.wait(10)

    thread = threading.Thread(target=tool)
    with waiting_for("sampling"):
        thread.start()
        assert started.wait(10)
        wait = current_wait()
        assert wait is not None and wait.what == "tool `search`"
        release.set()
        thread.join(10)
        wait = current_wait()
        assert wait is not None and wait.what == "sampling"
    assert not waiting._open


def test_the_words_name_the_wait_and_its_whole_seconds() -> None:
    assert describe(Wait("reward function `judge` (8 completions)", since=100.0), now=112.4) == (
        "waiting for reward function `judge` (8 completions) (12 s)"
    )
