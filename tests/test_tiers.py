"""The tiers' guard (``tests/helpers/tiers.py``): a fast test that starts a Python process, a launcher or a
browser fails and is told to mark itself ``system``; light programs are allowed. These tests are fast ones,
so the guard is watching them."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.helpers import tiers


@pytest.fixture
def forgiven() -> Iterator[None]:
    """The refusals below are on purpose: forget them, or the guard fails this test at its end."""
    yield
    tiers._starts.clear()


@pytest.mark.usefixtures("forgiven")
@pytest.mark.parametrize(
    "command",
    [[sys.executable, "-c", "pass"], ["torchrun", "--help"], "accelerate launch x.py", ["/usr/bin/chromium"]],
    ids=["python", "torchrun", "accelerate", "chromium"],
)
def test_a_fast_test_that_starts_a_heavy_process_is_told_to_mark_itself_system(command: object) -> None:
    with pytest.raises(RuntimeError, match=r"test_tiers\.py.* is not marked system: mark it @pytest\.mark\.system"):
        subprocess.run(command, shell=isinstance(command, str), check=False)  # type: ignore[call-overload]
    assert tiers._starts


@pytest.mark.usefixtures("forgiven")
def test_a_fast_test_that_starts_a_multiprocessing_child_is_told_to_mark_itself_system() -> None:
    process = multiprocessing.get_context("spawn").Process(target=print)
    with pytest.raises(RuntimeError, match="multiprocessing child"):
        process.start()
    assert process.pid is None  # refused before it started


def test_light_programs_are_allowed() -> None:
    assert subprocess.run(["true"], check=False).returncode == 0
    assert tiers.tier_of({"slow": 1, "system": 1}) == "slow"
    assert tiers.tier_of({"system": 1}) == "system"
    assert tiers.tier_of({"report": 1}) == "fast"
