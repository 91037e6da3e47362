"""The test tiers and what they cost (a pytest plugin, loaded by ``tests/conftest.py``).

A test's tier is its marker: ``deps``, ``slow`` or ``system``, else ``fast`` (CONTRIBUTING.md, "Test tiers").
Every run records each test's seconds (setup, call and teardown) in ``build/test-durations/<tier>.json``,
one file per tier that ran, and ends with a line per tier: tests, minutes, and the tier's budget
(``tier_budgets`` in pyproject's pytest section, minutes of wall time on 2 CPU cores), so a change that
makes a tier slower says so where it happens.

Outside the ``system`` tier (and ``slow``, ``deps``) a test may not start a Python interpreter, a launcher
(torchrun, accelerate, the ``rloo`` command) or a browser, as a subprocess or a ``multiprocessing`` child:
those cost seconds each and a fast tier runs in parallel (pytest-xdist), so the test fails and says to mark
it. Light programs the library runs (the ``bwrap`` sandbox, ``git``, a compiler) are not counted.
"""

from __future__ import annotations

import json
import multiprocessing.process
import os
import re
import shlex
import sys
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

TIERS = ("deps", "slow", "system")  # the first marker found names the tier; unmarked tests are "fast"
HEAVY_PROGRAM = re.compile(r"^(python[0-9.]*|torchrun|accelerate|rloo|vllm|chromium.*|chrome|google-chrome.*)$")
_running: dict[str, str] = {}  # the test that is running and may not start a heavy process: {"nodeid": ...}
_starts: list[str] = []  # what it started anyway, reported at its end


def tier_of(keywords: Any) -> str:
    return next((name for name in TIERS if name in keywords), "fast")


def _heavy(program: str) -> bool:
    return program == sys.executable or bool(HEAVY_PROGRAM.match(os.path.basename(program)))


def _program(args: Any) -> str:
    """The program a ``subprocess.Popen`` audit event's args start, looking through ``sh -c COMMAND``."""
    if isinstance(args, (str, bytes, os.PathLike)):
        text = os.fsdecode(args)
        words = shlex.split(text) if " " in text else [text]
        return words[0] if words else text
    words = [os.fsdecode(word) for word in args]
    if len(words) > 2 and os.path.basename(words[0]) in ("sh", "bash") and words[1] == "-c":
        return _program(words[2])
    return words[0] if words else ""


def _refuse(what: str) -> None:
    if _running:
        _starts.append(what)
        raise RuntimeError(
            f"{_running['nodeid']} starts {what} but is not marked system: mark it @pytest.mark.system "
            "(CONTRIBUTING.md, Test tiers)"
        )


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "subprocess.Popen" and _running:
        program = _program(args[1] if args[1] is not None else args[0])
        if _heavy(program):
            _refuse(f"a process ({os.path.basename(program)})")


_start = multiprocessing.process.BaseProcess.start


def _guarded_start(self: multiprocessing.process.BaseProcess) -> None:
    _refuse(f"a multiprocessing child ({self.name})")
    _start(self)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("tier_budgets", "TIER = MINUTES of wall time on 2 CPU cores, one a line", type="linelist")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(TierRecorder(config), "tier-recorder")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch  # one thread per worker: two workers on two cores, no spin-waiting on each other

        torch.set_num_threads(1)


# the audit hook stays for the interpreter's life (they cannot be removed): it checks only while a test runs
sys.addaudithook(_audit)
multiprocessing.process.BaseProcess.start = _guarded_start  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    """Watch the test's setup, call and teardown (a module fixture's process is charged to its first test)."""
    if tier_of(item.keywords) == "fast":
        _running["nodeid"] = item.nodeid
    try:
        yield
    finally:
        _running.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A start that library code caught and hid (a thread, an ``except Exception``) still fails the test."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        _starts.clear()  # the test already fails, with the refusal's message where it was raised
    elif _starts and report.when == "teardown":
        report.outcome = "failed"
        started = ", ".join(_starts)
        report.longrepr = f"{item.nodeid} started {started} but is not marked system: mark it @pytest.mark.system"
    if report.when == "teardown":
        _starts.clear()


class TierRecorder:
    """Adds up each test's seconds by tier; on the controller (not an xdist worker) writes and prints them."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.started = time.monotonic()
        self.seconds: dict[str, float] = defaultdict(float)
        self.tiers: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration
        self.tiers[report.nodeid] = tier_of(report.keywords)

    def budgets(self) -> dict[str, float]:
        lines = self.config.getini("tier_budgets")
        return {tier.strip(): float(minutes) for tier, minutes in (line.split("=") for line in lines)}

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if hasattr(self.config, "workerinput") or not self.seconds:
            return
        wall = time.monotonic() - self.started
        by_tier: dict[str, dict[str, float]] = defaultdict(dict)
        for nodeid, seconds in self.seconds.items():
            by_tier[self.tiers[nodeid]][nodeid] = seconds
        folder = Path(str(self.config.rootpath)) / "build" / "test-durations"
        folder.mkdir(parents=True, exist_ok=True)
        workers = int(getattr(self.config.option, "numprocesses", 0) or 0)
        budgets = self.budgets()
        for tier, tests in sorted(by_tier.items()):
            total = sum(tests.values())
            record = {
                "args": self.config.invocation_params.args,
                "workers": workers,
                "run_wall_seconds": round(wall, 1),
                "tests_seconds": round(total, 1),
                "tests": {k: round(v, 2) for k, v in sorted(tests.items(), key=lambda kv: -kv[1])},
            }
            (folder / f"{tier}.json").write_text(json.dumps(record, indent=1) + "\n")
            # one tier in the run: its wall time is the run's; several: the tier's share is its tests' seconds
            minutes = (wall if len(by_tier) == 1 else total / max(workers, 1)) / 60
            budget = budgets.get(tier)
            over = " OVER BUDGET" if budget is not None and minutes > budget else ""
            terminalreporter.write_line(
                f"tier {tier}: {len(tests)} tests, {minutes:.1f} min"
                + (f" of its {budget:g}-min budget{over}" if budget is not None else "")
                + f" (tests' own seconds: {total:.0f}; {folder.relative_to(self.config.rootpath) / (tier + '.json')})"
            )
