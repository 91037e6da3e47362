"""Executions per second of the code-execution sandbox: bubblewrap vs the rlimits alone (the unsafe
``sandbox="none"``), one at a time and through the reward's thread pool.

    .venv/bin/python benchmarks/sandbox.py              # 200 executions per figure
    .venv/bin/python benchmarks/sandbox.py --executions 50

Each execution runs a small correct program (read a number, print its double) in a fresh
interpreter. "sequential" calls ``run_in_sandbox`` in a loop; "pool" scores the same programs
with the ``code_execution`` reward (one test case each, ``os.cpu_count()`` workers). Run it
on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

from rloo.rewards.code_execution import code_execution_reward
from rloo.rewards.sandbox import bwrap_problem, run_in_sandbox

PROGRAM = "n = int(input())\nprint(2 * n)\n"


def sequential(executions: int, sandbox: str) -> float:
    start = time.perf_counter()
    for i in range(executions):
        result = run_in_sandbox(PROGRAM, f"{i}\n", sandbox=sandbox)
        assert result.stdout == f"{2 * i}\n", result
    return executions / (time.perf_counter() - start)


def pooled(executions: int, sandbox: str) -> float:
    reward = code_execution_reward(sandbox=sandbox)
    tests = [[{"input": f"{i}\n", "output": f"{2 * i}\n"}] for i in range(executions)]
    start = time.perf_counter()
    rewards = reward(completions=[PROGRAM] * executions, test_cases=tests)
    assert rewards == [1.0] * executions, rewards
    return executions / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=200)
    args = parser.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)  # sandbox='none' is warned: we ask for it here
    modes = [("bwrap", "bwrap"), ("rlimits only", "none")] if bwrap_problem() is None else [("rlimits only", "none")]
    print(f"{args.executions} executions per figure, {os.cpu_count()} CPU cores")
    print(f"{'sandbox':<14}{'sequential /s':>15}{'pool /s':>10}")
    for label, sandbox in modes:
        sequential(5, sandbox)  # warm the page cache and the bwrap check
        print(f"{label:<14}{sequential(args.executions, sandbox):>15.1f}{pooled(args.executions, sandbox):>10.1f}")


if __name__ == "__main__":
    main()
