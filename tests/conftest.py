"""Shared test configuration: one hypothesis profile for the whole math suite.

Examples are few (the machine is small) and there is no per-example deadline, so a slow
first call (torch warm-up) does not make a property test flaky.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "rloo",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,  # the same examples on every run: CI cannot flake on a new draw
)
settings.load_profile("rloo")
