"""The code-execution reward and its sandbox, attacked with hostile programs.

Each attack must get the failure reward (0.0) while a correct solution in the same batch still
scores 1.0, and this test process (the "trainer") must survive. Short limits keep it fast. Every
test that runs a completion's code needs a working bubblewrap and is skipped, saying why, without
one (tests/rewards/test_fail_closed.py: what happens then).
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rloo.rewards.code_execution import code_execution_reward, extract_code, normalize_output, parse_test_cases
from rloo.rewards.resolve import resolve_reward
from rloo.rewards.sandbox import FIRST_UID, UID_SLOTS, processes_of, run_in_sandbox
from tests.helpers.models import trainer
from tests.helpers.sandbox import (
    ATTACKS,
    CORRECT,
    DOUBLE,
    FORK_BOMB,
    KILLERS,
    LIMITS,
    SANDBOX_LIMITS,
    SECRET,
    fenced,
    needs_bwrap,
)


def leftover_sandbox_processes() -> list[int]:
    return processes_of(range(FIRST_UID, FIRST_UID + UID_SLOTS))


# ---------------------------------------------------------------------------- scoring


@needs_bwrap
def test_correct_partial_and_missing_code_score_the_fraction_passed() -> None:
    reward = code_execution_reward(**LIMITS)
    partial = fenced("n = int(input())\nprint(2 * n if n > 0 else 0)")
    no_code = "I would loop over the input and double it.\n```bash\necho 4\n```"
    crash = fenced("raise SystemExit(3)")
    rewards = reward(completions=[CORRECT, partial, no_code, crash], test_cases=[DOUBLE] * 4)
    assert rewards == [1.0, pytest.approx(2 / 3), 0.0, 0.0]
    assert reward.__name__ == "code_execution"


@needs_bwrap
def test_assert_strings_mixed_lists_and_rows_without_tests() -> None:
    reward = code_execution_reward(**LIMITS)
    square = fenced("def square(x):\n    return x * x")
    asserts = "assert square(3) == 9\nassert square(-2) == 4"
    mixed = ["assert square(2) == 4", "assert square(2) == 5", {"input": "", "output": ""}]
    doubler = fenced("def square(x):\n    return x + x")
    chat = [{"role": "assistant", "content": square}]
    rewards = reward(
        completions=[square, doubler, square, square, chat],
        test_cases=[asserts, asserts, mixed, None, []],
        prompts=["p"] * 5,
    )
    assert rewards == [1.0, 0.0, pytest.approx(2 / 3), None, None]


def test_extract_code_prefers_the_last_python_or_plain_block() -> None:
    assert extract_code("```python\na = 1\n```\ntext\n```py\nb = 2\n```\n```bash\nls\n```") == "b = 2\n"
    assert extract_code("```\nx = 3\n```") == "x = 3\n"
    assert extract_code("print(1)") == "print(1)"
    assert extract_code("```bash\nrm -rf /\n```") is None
    assert extract_code("  \n") is None


def test_outputs_compare_without_trailing_whitespace_per_line() -> None:
    assert normalize_output("1  \n2\t\n\n\n") == normalize_output("1\n2") == "1\n2"
    assert normalize_output(" 1\n2") != normalize_output("1\n2")  # leading whitespace counts
    assert normalize_output("1\n\n2") != normalize_output("1\n2")


# ---------------------------------------------------------------------------- configuration mistakes


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"timeout": 0}, r"timeout=0 is invalid; give a positive, finite number of seconds"),
        ({"timeout": float("inf")}, r"timeout=inf is invalid"),
        ({"cpu_seconds": 1.5}, r"cpu_seconds=1.5 is invalid; give an integer >= 1"),
        ({"memory_mb": 10}, r"memory_mb=10 is invalid; give an integer >= 64"),
        ({"max_processes": True}, r"max_processes=True is invalid"),
        ({"output_bytes": -1}, r"output_bytes=-1 is invalid"),
        ({"disk_mb": 0}, r"disk_mb=0 is invalid"),
        ({"sandbox": "docker"}, r"sandbox='docker' is not one of auto, bwrap, none"),
        ({"workers": 0}, r"workers=0 is invalid; give an integer >= 1, or None"),
        ({"column": ""}, r"column='' is invalid"),
    ],
)
def test_bad_settings_are_named_when_the_reward_is_built(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_reward({"name": "code_execution", **params})


@needs_bwrap
@pytest.mark.parametrize(
    ("cell", "problem"),
    [
        (42, "is a int in row 1"),
        (b"assert True", "is a bytes in row 1"),
        ([{"input": "1"}], r"has \{'input': '1'\} at position 0 in row 1"),
        ([{"input": 1, "output": "1"}], r"has \{'input': 1, 'output': '1'\} at position 0 in row 1"),
        (["assert True", 7], "has 7 at position 1 in row 1"),
    ],
)
def test_a_test_case_cell_of_the_wrong_shape_names_the_column_and_row(cell: Any, problem: str) -> None:
    reward = code_execution_reward(column="tests", **LIMITS)
    with pytest.raises(ValueError, match=rf"column 'tests' {problem}; give a list of"):
        reward(completions=[CORRECT, CORRECT], tests=[DOUBLE, cell])
    with pytest.raises(KeyError, match="needs dataset column 'tests'"):
        reward(completions=[CORRECT], test_cases=[DOUBLE])
    assert parse_test_cases(None) is None


# ---------------------------------------------------------------------------- hostile code, under bubblewrap


@needs_bwrap
@pytest.mark.parametrize("attack", ATTACKS)
def test_an_attack_gets_the_failure_reward_and_a_correct_neighbour_still_passes(attack: str) -> None:
    code, statuses = ATTACKS[attack]
    result = run_in_sandbox(code, "", SANDBOX_LIMITS)
    assert result.isolated
    assert result.status in statuses, result
    assert result.seconds < 15  # the wall-clock limit (2 s) holds, with room for a slow machine
    assert len(result.stdout) <= LIMITS["output_bytes"] and len(result.stderr) <= LIMITS["output_bytes"]
    rewards = code_execution_reward(**LIMITS)(completions=[fenced(code), CORRECT], test_cases=[DOUBLE[:1], DOUBLE])
    assert rewards == [0.0, 1.0]
    assert leftover_sandbox_processes() == []  # the whole sandbox is gone; this process, the "trainer", is not


@needs_bwrap
def test_a_fork_bomb_meets_the_process_limit_and_does_not_starve_a_concurrent_forking_solution() -> None:
    count = (
        "import os, time\nn = 1\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n"
        "            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)"
    )
    assert int(run_in_sandbox(count, "", SANDBOX_LIMITS).stdout) == LIMITS["max_processes"]
    forking = fenced(
        "import os\nn = int(input())\nr, w = os.pipe()\nif os.fork() == 0:\n"
        "    os.write(w, str(2 * n).encode())\n    os._exit(0)\nos.wait()\nprint(os.read(r, 100).decode())"
    )
    reward = code_execution_reward(**LIMITS, workers=2)
    assert reward(completions=[fenced(FORK_BOMB), forking], test_cases=[DOUBLE[:1], DOUBLE[:1]]) == [0.0, 1.0]
    assert leftover_sandbox_processes() == []


@needs_bwrap
def test_the_sandbox_sees_no_environment_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLOO_TEST_SECRET", SECRET)
    steal = "import os\nprint(os.environ['RLOO_TEST_SECRET'])"
    reward = code_execution_reward(**LIMITS)
    assert reward(completions=[fenced(steal)], test_cases=[[{"input": "", "output": SECRET}]]) == [0.0]
    environ = (
        "import glob, os\nprint(dict(os.environ))\nfor p in glob.glob('/proc/*/environ'):\n    print(open(p).read())"
    )
    result = run_in_sandbox(environ, "", SANDBOX_LIMITS)
    assert SECRET not in result.stdout and SECRET not in result.stderr
    assert os.environ["RLOO_TEST_SECRET"] == SECRET  # it was there to steal


@needs_bwrap
def test_the_sandbox_cannot_write_or_read_host_files(tmp_path: Path) -> None:
    target = tmp_path / "escape" / "pwned.txt"
    write = f"import os\nos.makedirs({str(target.parent)!r})\nopen({str(target)!r}, 'w').write('x')\nprint('written')"
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(SECRET)
    reads = [f"print(open({str(path)!r}).read())" for path in (secret_file, Path(__file__), Path("/etc/passwd"))]
    reward = code_execution_reward(**LIMITS)
    written = reward(completions=[fenced(write)], test_cases=[[{"input": "", "output": "written"}]])
    read = reward(completions=[fenced(code) for code in reads], test_cases=[[{"input": "", "output": SECRET}]] * 3)
    assert written == [0.0] and read == [0.0] * 3
    assert not target.exists() and not target.parent.exists()
    assert "FileNotFoundError" in run_in_sandbox(reads[0], "", SANDBOX_LIMITS).stderr
    # its own working directory is writable, and the next execution gets a fresh one
    notes = "import os\nprint(os.listdir('.'))\nopen('notes', 'w').write('ok')"
    assert [run_in_sandbox(notes, "", SANDBOX_LIMITS).stdout for _ in range(2)] == ["['solution.py']\n"] * 2


@needs_bwrap
def test_the_sandbox_cannot_signal_a_host_process() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])  # a process of the "trainer's", by its host pid
    try:
        kill = f"import os, signal\nos.kill({sleeper.pid}, signal.SIGKILL)\nos.killpg({sleeper.pid}, 9)"
        result = run_in_sandbox(kill, "", SANDBOX_LIMITS)
        assert result.status == "error" and "ProcessLookupError" in result.stderr, result
        rewards = code_execution_reward(**LIMITS)(
            completions=[fenced(kill)], test_cases=[[{"input": "", "output": ""}]]
        )
        assert rewards == [0.0] and sleeper.poll() is None  # still asleep
    finally:
        sleeper.kill()
        sleeper.wait()


@needs_bwrap
def test_the_sandbox_has_no_network() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        connect = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
        reward = code_execution_reward(**LIMITS)
        assert reward(completions=[fenced(connect)], test_cases=[[{"input": "", "output": "connected"}]]) == [0.0]
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected


@needs_bwrap
def test_training_keeps_running_with_hostile_test_code(tmp_path: Path) -> None:
    """A tiny model writes digit strings; those that are valid Python also run the row's attack
    (which then exits 1, if it gets that far, so that every attack fails its test)."""
    attacks = [FORK_BOMB, KILLERS["parent"], "while True:\n    pass", KILLERS["every pid in /proc"]]
    attacks = [f"{attack}\nraise SystemExit(1)" for attack in attacks]
    data = [
        {"prompt": f"{a}+{b}=", "test_cases": [{"input": "", "output": ""}], "attack": attacks[(a + b) % len(attacks)]}
        for a in range(4)
        for b in range(4)
    ]
    seen: list[str] = []

    def spy(completions: list[str], **kwargs: Any) -> list[float]:
        seen.extend(completions)
        return [0.0] * len(completions)

    limits = {**LIMITS, "timeout": 1.0}
    rewards = [{"name": "code_execution", **limits}, {"name": "code_execution", "column": "attack", **limits}, spy]
    run = trainer(tmp_path, reward_funcs=rewards, reward_weights=[1.0, 1.0, 0.0], data=data, max_steps=2)
    run.train()
    logs = [row for row in run.state.log_history if "rewards/code_execution/mean" in row]
    valid = [c for c in seen if extract_code(c) is not None and _compiles(c)]
    assert len(logs) == 2 and len(seen) == 16 and valid, seen  # some completions ran their attack
    assert sum(row["rewards/code_execution/mean"] for row in logs) == pytest.approx(len(valid) / 8)
    assert [row["rewards/code_execution_2/mean"] for row in logs] == [0.0, 0.0]  # every attack failed
    assert leftover_sandbox_processes() == []


def _compiles(text: str) -> bool:
    try:
        compile(text, "completion", "exec")
    except (SyntaxError, ValueError):
        return False
    return True
