"""Fail closed: without a working sandbox, running model-written code (the ``code_execution`` reward, the
python tool) is refused when it is set up, with a message saying how to get one and naming the unsafe
opt-out, ``sandbox="none"``; that opt-out is reachable wherever the sandbox is chosen (the Python API, a run
file, ``rloo train``'s flags), and it does what it says."""

from __future__ import annotations

import json
import re
import stat
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from rloo.cli.run_file import load_run_file
from rloo.cli.trl_args import run_values
from rloo.rewards import sandbox
from rloo.rewards.code_execution import code_execution_reward
from rloo.rewards.resolve import resolve_rewards
from rloo.rewards.sandbox import SandboxLimits, SandboxUnavailable, bwrap_problem, run_in_sandbox, sandbox_backend
from rloo.tools.python_tool import python_tool
from tests.helpers.cli import flat, invoke
from tests.helpers.sandbox import ATTACKS, CORRECT, DOUBLE, LIMITS, SANDBOX_LIMITS, SECRET, fenced, hide_bwrap

CODE_EXECUTION = [{"input": "2\n", "output": "4\n"}]
HOW_TO_GET_ONE = (
    "To get one, install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; `make sandbox` does it where it can); "
    "where it is installed but cannot run, allow it user namespaces: on Ubuntu 24.04 sysctl "
    "kernel.apparmor_restrict_unprivileged_userns=0 (or load AppArmor's bwrap-userns-restrict profile), on older "
    "Debian sysctl kernel.unprivileged_userns_clone=1, and in a Docker container --security-opt seccomp=unconfined "
    "--security-opt apparmor=unconfined (plus --cap-add SYS_ADMIN where it runs as root)."
)
UNSAFE = "runs model-written code with your user's rights (it can read and write your files, use the network and "


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    hide_bwrap(monkeypatch)


def fake_bwrap(folder: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    """A ``bwrap`` on PATH's place that runs ``body`` (Python, given ``args``) and counts its runs in ``runs``."""
    path = folder / "bwrap"
    path.write_text(
        f"#!{sys.executable}\nimport os, sys\nargs = sys.argv[1:]\n"
        f"open({str(folder / 'runs')!r}, 'a').write('x')\n{body}\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name, *a, **k: str(path) if name == "bwrap" else None)
    return path


# ---------------------------------------------------------------------------- refused, saying how to get one


@pytest.mark.usefixtures("no_bwrap")
def test_without_bubblewrap_the_reward_the_tool_and_an_execution_are_refused_saying_how_to_get_one() -> None:
    with pytest.raises(SandboxUnavailable) as refused:
        code_execution_reward()
    assert str(refused.value) == (
        "refusing to run the code_execution reward without a sandbox: bubblewrap (bwrap) is not installed. "
        f'{HOW_TO_GET_ONE} Or opt out, UNSAFE: code_execution_reward(sandbox="none") (in a run file: '
        f"{{name: code_execution, sandbox: none}}) {UNSAFE}signal your processes)."
    )
    with pytest.raises(SandboxUnavailable, match=r"^refusing to run the python tool without a sandbox: bubblewrap"):
        python_tool()
    with pytest.raises(SandboxUnavailable, match=r'UNSAFE: python_tool\(sandbox="none"\) \(in a run file: tools:'):
        python_tool(sandbox="bwrap")  # 'bwrap' (asking for it by name) is refused the same way
    with pytest.raises(SandboxUnavailable, match=r'^refusing to run model-written code .* UNSAFE: sandbox="none"'):
        run_in_sandbox("print(1)")
    with pytest.raises(ValueError, match=r"sandbox='off' is not one of auto, bwrap, none"):
        python_tool(sandbox="off")  # a mistyped opt-out is not an opt-out


def test_a_bwrap_that_cannot_run_here_is_refused_with_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    error = "bwrap: No permissions to create a new namespace, likely because the kernel does not allow it"
    fake = fake_bwrap(tmp_path, monkeypatch, f"sys.stderr.write({error!r})\nsys.exit(1)")
    with pytest.raises(SandboxUnavailable, match=rf"python tool without a sandbox: {fake} cannot run here \({error}\)"):
        python_tool()


def test_a_bwrap_that_runs_but_does_not_isolate_is_refused_and_probed_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 'bwrap' that starts the program without any isolation: the probe's program sees the host's file
    and processes, so it is no sandbox."""
    run_as_is = "command = args[args.index('--chdir') + 2 : -1] + ['-1']  # not even the uid is changed"
    fake_bwrap(tmp_path, monkeypatch, f"{run_as_is}\nos.execv(command[0], command)")
    for _ in range(3):
        with pytest.raises(SandboxUnavailable, match=r"runs here but does not isolate: the sandboxed program saw a "):
            code_execution_reward()
    problem = bwrap_problem()
    assert problem is not None and "a host file" in problem and "host processes" in problem
    assert (tmp_path / "runs").read_text() == "x"  # one probe for the process, however often it is asked


# ---------------------------------------------------------------------------- refused before the model loads


@pytest.mark.usefixtures("no_bwrap")
def test_the_trainer_refuses_a_code_execution_reward_before_loading_the_model(tmp_path: Path) -> None:
    from rloo.training.trainer import RLOOTrainer

    with pytest.raises(SandboxUnavailable, match="refusing to run the code_execution reward"):
        RLOOTrainer(model=str(tmp_path / "no-model-here"), reward_funcs=["accuracy", {"name": "code_execution"}])


@pytest.mark.usefixtures("no_bwrap")
def test_rloo_train_refuses_either_before_loading_anything_and_names_the_opt_out(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text(json.dumps({"prompt": "2", "test_cases": CODE_EXECUTION}) + "\n")
    base = {"model": str(tmp_path / "no-model-here"), "dataset": str(tmp_path / "data.jsonl")}
    for extra, message in [
        ({"reward_funcs": ["code_execution"]}, "the code_execution reward"),
        ({"reward_funcs": ["accuracy"], "tools": ["python"]}, "the python tool"),
    ]:
        (tmp_path / "run.yaml").write_text(yaml.safe_dump({**base, **extra, "output_dir": str(tmp_path / "out")}))
        result = invoke("train", tmp_path / "run.yaml")
        assert result.exit_code == 2, result.stderr
        assert flat(result.stderr).startswith(f"error: refusing to run {message} without a sandbox"), result.stderr
        assert "sandbox: none}" in flat(result.stderr) and not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------- the opt-out, wherever it is chosen


@pytest.mark.system
@pytest.mark.usefixtures("no_bwrap")
def test_the_opt_out_is_reachable_from_a_run_file_and_from_rloo_trains_flags(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text(json.dumps({"prompt": "2", "test_cases": CODE_EXECUTION}) + "\n")
    reward = {"name": "code_execution", "sandbox": "none", "timeout": 2}
    tool = {"name": "python", "sandbox": "none", "timeout": 2, "max_chars": 100}
    run = {"model": "m", "dataset": str(tmp_path / "data.jsonl"), "reward_funcs": [reward], "tools": [tool]}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    flags = ["--model_name_or_path", "m", "--dataset_name", str(tmp_path / "data.jsonl")]
    flags += ["--reward_funcs", json.dumps(reward), "--tools", json.dumps(tool)]
    with pytest.warns(RuntimeWarning, match=r"sandbox='none': model-written code runs UNSANDBOXED"):
        from_yaml = load_run_file(tmp_path / "run.yaml")
    from_flags = load_run_file(*run_values(flags))
    for run_file in (from_yaml, from_flags):
        assert run_file.reward_funcs == [reward] and run_file.tools == [tool]
        (code_execution,) = resolve_rewards(run_file.reward_funcs)
        assert code_execution(completions=[CORRECT], test_cases=[DOUBLE]) == [1.0]
    printed = invoke("train", *flags, "--print-config")
    assert printed.exit_code == 0 and yaml.safe_load(printed.stdout)["tools"] == [tool]
    with pytest.raises(
        ValueError, match=r"`tools\[0\]`: the python tool does not take memory; it takes sandbox, max_chars, timeout, "
    ):
        load_run_file(tmp_path / "run.yaml", ["tools=[{name: python, sandbox: none, memory: 1}]"])


@pytest.mark.system
@pytest.mark.usefixtures("no_bwrap")
def test_the_unsafe_opt_out_is_warned_once_and_keeps_only_the_rlimits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.warns(RuntimeWarning, match=r"sandbox='none': .* UNSANDBOXED with your user's rights") as warned:
        reward = code_execution_reward(**LIMITS, sandbox="none")
    assert "read and write your files, use the network and signal your processes" in str(warned[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would fail here
        # as root the process limit does not apply without bwrap (the warning says so); the disk is the host's
        names = [name for name in ATTACKS if "kill" not in name and name not in ("fork bomb", "disk flood")]
        for name in names:
            result = run_in_sandbox(ATTACKS[name][0], "", SANDBOX_LIMITS, sandbox="none")
            assert not result.isolated and result.status in ATTACKS[name][1], (name, result)
        hostile = [fenced(ATTACKS[name][0]) for name in names]
        rewards = reward(completions=[*hostile, CORRECT], test_cases=[DOUBLE[:1]] * len(hostile) + [DOUBLE])
        assert rewards == [0.0] * len(hostile) + [1.0]
        # what the warning says: the program reads your files; only the environment is emptied
        host_file = tmp_path / "host.txt"
        host_file.write_text(SECRET)
        monkeypatch.setenv("RLOO_TEST_SECRET", SECRET)
        reads = f"import os\nprint(open({str(host_file)!r}).read(), sorted(os.environ))"
        result = run_in_sandbox(reads, "", SANDBOX_LIMITS, sandbox="none")
    assert result.stdout.startswith(SECRET) and "RLOO_TEST_SECRET" not in result.stdout


def test_a_working_sandbox_needs_no_opt_out() -> None:
    """Where bubblewrap works, the default is it (here or on a machine without it, the default never runs
    unsandboxed: either a bwrap path or a refusal)."""
    try:
        backend = sandbox_backend()
    except SandboxUnavailable:
        assert bwrap_problem() is not None
        return
    assert backend is not None and bwrap_problem() is None
    assert run_in_sandbox("print(6 * 7)", "", SandboxLimits(timeout=10)).isolated


@pytest.mark.usefixtures("no_bwrap")
def test_the_docs_show_the_message_rloo_train_prints() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    (shown,) = re.findall(r"```\n(error: refusing to run the code_execution reward.*?)```", page, flags=re.S)
    with pytest.raises(SandboxUnavailable) as refused:
        code_execution_reward()
    assert flat(shown) == flat(f"error: {refused.value}")
