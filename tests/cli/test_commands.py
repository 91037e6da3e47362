"""The ``rloo`` command line, end to end, on a tiny local model and a local JSONL dataset (offline, CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import Result

from tests.helpers.cli import flat, invoke
from tests.helpers.paths import REPO

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.report]  # rloo train ends with its report


def succeeded(result: Result) -> bool:
    """Exit code 0; otherwise fail with the output and the traceback, which CliRunner swallows."""
    if result.exit_code != 0:
        import traceback

        error = result.exception
        trace = "" if error is None or isinstance(error, SystemExit) else "".join(traceback.format_exception(error))
        pytest.fail(f"exit code {result.exit_code}\n{result.output}\n{trace}")
    return True


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def metrics_steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def run_file(folder: Path, files: dict[str, Path], **values: Any) -> Path:
    """Write a tiny run file to ``folder/run.yaml``; ``values`` replace or add top-level keys."""
    run: dict[str, Any] = {
        "model": str(files["model"]),
        "dataset": {"path": str(files["data"])},
        "reward_funcs": ["accuracy", {"name": "length", "min_words": 1, "max_words": 3, "weight": 0.5}],
        "num_generations": 2,
        "per_device_train_batch_size": 4,
        "max_completion_length": 4,
        "max_steps": 2,
        "logging_steps": 1,
        "save_steps": 2,
        "output_dir": str(folder / "run"),
    }
    run.update(values)
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(run, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, files: dict[str, Path]) -> Path:
    """One 2-step ``rloo train`` run, shared by the tests that read its output folder."""
    folder = tmp_path_factory.mktemp("trained")
    assert succeeded(invoke("train", run_file(folder, files)))
    return folder / "run"


# ---------------------------------------------------------------------------- help
def test_help_lists_every_command() -> None:
    result = invoke("--help")
    assert succeeded(result)
    for command in ("train", "eval", "report", "demo", "bandit"):
        assert command in result.output


# ---------------------------------------------------------------------------- train
def test_train_writes_the_run_folder(trained: Path) -> None:
    for name in ("config.yaml", "metrics.jsonl", "report.html", "checkpoint-2", "final"):
        assert (trained / name).exists(), name
    assert metrics_steps(trained)[-1] == 2
    resolved = yaml.safe_load((trained / "config.yaml").read_text())
    assert {"model", "dataset", "reward_funcs", "peft"} <= resolved.keys()
    assert {"num_generations", "learning_rate", "beta", "max_steps", "output_dir"} <= resolved.keys()
    assert resolved["dataset"]["path"].endswith("sums.jsonl")
    assert resolved["reward_weights"] == [1.0, 0.5]
    assert [r if isinstance(r, str) else r["name"] for r in resolved["reward_funcs"]] == ["accuracy", "length"]


def test_the_resolved_config_yaml_runs_again(trained: Path, tmp_path: Path) -> None:
    result = invoke("train", trained / "config.yaml", f"output_dir={tmp_path / 'again'}")
    assert succeeded(result)
    again = yaml.safe_load((tmp_path / "again" / "config.yaml").read_text())
    assert again["reward_weights"] == [1.0, 0.5]
    assert metrics_steps(tmp_path / "again")[-1] == 2


def test_overrides_set_floats_nested_keys_and_lora(tmp_path: Path, files: dict[str, Path]) -> None:
    peft = {"r": 8, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    path = run_file(tmp_path, files, max_steps=1, save_steps=1, peft=peft)
    result = invoke("train", path, "learning_rate=1e-5", "dataset.limit=4", "peft.r=4")
    assert succeeded(result)
    resolved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert isinstance(resolved["learning_rate"], float)
    assert resolved["learning_rate"] == 1e-05
    assert resolved["dataset"]["limit"] == 4
    assert resolved["peft"] == {**peft, "r": 4}
    assert (tmp_path / "run" / "final" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize(
    ("values", "overrides", "expected"),
    [
        ({"num_generation": 2}, [], "unknown key `num_generation`; did you mean `num_generations`?"),
        ({}, ["dataset.splt=test"], "unknown key `dataset.splt`; did you mean `split`?"),
        ({"num_generations": "four"}, [], "`num_generations` expects int, got 'four'"),
        ({"peft": {"r": 8}}, ["peft.rank=4"], "unknown key `peft.rank`; did you mean `r`?"),
        ({"model": None}, [], "the run file needs `model`"),
        ({"num_generations": 1}, [], "the leave-one-out baseline needs at least 2 completions per prompt"),
        ({}, ["learning_rate"], "must look like key=value"),
        ({"reward_weights": [1.0, 1.0]}, [], "either as `weight:` in reward_funcs or as `reward_weights`, not both"),
        ({"peft": {"target_modules": ["q_proj"], "rank": 4}}, [], "did you mean `r`?"),
        ({"reward_clip_range": 5}, [], "`reward_clip_range` expects list[float] or null, got 5"),
    ],
    ids=[
        *("top-level", "nested", "type", "peft-override", "no-model", "config", "no-equals", "two-weights", "peft"),
        "brackets-are-not-markup",
    ],
)
def test_run_file_errors_exit_2_with_a_message(
    tmp_path: Path, files: dict[str, Path], values: dict[str, Any], overrides: list[str], expected: str
) -> None:
    result = invoke("train", run_file(tmp_path, files, **values), *overrides)
    assert result.exit_code == 2, result.output
    assert expected in flat(result.stderr)
    assert not (tmp_path / "run").exists()


def test_a_missing_run_file_exits_2(tmp_path: Path) -> None:
    result = invoke("train", tmp_path / "nope.yaml")
    assert result.exit_code == 2
    assert "nope.yaml' not found" in flat(result.stderr)


def test_resume_continues_and_a_rerun_without_it_is_refused(tmp_path: Path, files: dict[str, Path]) -> None:
    path = run_file(tmp_path, files, save_steps=1)
    assert succeeded(invoke("train", path))
    run = tmp_path / "run"
    before = snapshot(run)

    refused = invoke("train", path, "max_steps=3")
    assert refused.exit_code == 2
    message = flat(refused.stderr)
    assert "already holds an earlier run (checkpoint-1, checkpoint-2, final, config.yaml" in message
    assert "--resume" in message and "overwrite_output_dir=True" in message and "Loading" not in message
    assert snapshot(run) == before

    assert succeeded(invoke("train", path, "max_steps=3", "--resume"))
    assert metrics_steps(run)[-1] == 3
    assert (run / "checkpoint-3").is_dir()
    # an older checkpoint by name; the newer ones are only replaced with the explicit opt-in
    behind = invoke("train", path, "max_steps=3", "--resume-from", "checkpoint-1")
    assert behind.exit_code == 2 and "newer than checkpoint-1 (checkpoint-2, checkpoint-3)" in flat(behind.stderr)
    assert succeeded(invoke("train", path, "max_steps=3", "overwrite_output_dir=true", "--resume-from", "checkpoint-1"))
    missing = invoke("train", path, "--resume-from", "checkpoint-9")
    assert missing.exit_code == 2 and "--resume-from 'checkpoint-9': no such checkpoint folder" in flat(missing.stderr)


def test_without_output_dir_each_run_gets_a_fresh_folder_and_resumes_by_its_config(
    tmp_path: Path, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run file (or TRL's flags) without output_dir: the second run was refused, runs/rloo holding
    the first (issue 24). --resume needs the folder, which the run's config.yaml names."""
    monkeypatch.chdir(tmp_path)
    path = run_file(tmp_path, files, output_dir=None, save_steps=1)
    for expected in ("runs/rloo", "runs/rloo-2"):
        result = invoke("train", path)
        assert succeeded(result)
        assert f"done: model in {expected}/final, report in {expected}/report.html" in flat(result.stderr)
    refused = invoke("train", path, "--resume")
    assert refused.exit_code == 2
    assert "resuming needs the run's folder, and output_dir is not set" in flat(refused.stderr)
    assert succeeded(invoke("train", "runs/rloo/config.yaml", "max_steps=3", "--resume"))
    assert metrics_steps(tmp_path / "runs" / "rloo")[-1] == 3


# ---------------------------------------------------------------------------- eval
def test_eval_prints_a_table_and_writes_json(tmp_path: Path, files: dict[str, Path], trained: Path) -> None:
    for model in (files["model"], trained / "checkpoint-2"):
        output = tmp_path / f"{model.name}.json"
        result = invoke(
            "eval",
            *("--model", model, "--dataset", files["data"], "--reward", "accuracy", "--split", "train"),
            *("--num-generations", "2", "--max-completion-length", "4", "--output", output),
        )
        assert succeeded(result)
        assert "greedy" in result.stdout
        assert "pass@2" in result.stdout
        scores = json.loads(output.read_text())
        assert scores["num_prompts"] == 16
        shares = scores["greedy"]["rewards"]["accuracy"]["fraction_of_ones"], scores["sampled"]["pass_at_k"]["accuracy"]
        assert all(0.0 <= share <= 1.0 for share in shares)


def test_eval_combines_rewards_with_the_run_files_weights(tmp_path: Path, files: dict[str, Path]) -> None:
    # before: `rloo eval` summed reward functions without their weights (and took no run file),
    # so one run file reported different rewards in `rloo train` and `rloo eval`
    one = "tests.helpers.models:always_one"
    rewards = [{"name": one, "weight": 2.0}, {"name": one, "weight": 0.5}]
    path = run_file(tmp_path, files, reward_funcs=rewards, max_steps=1, save_steps=1)
    assert succeeded(invoke("train", path))
    trained_reward = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])["reward"]
    output = tmp_path / "eval.json"
    result = invoke("eval", "--model", files["model"], "--run-file", path, "--output", output, "--limit", "4")
    assert succeeded(result)
    scores = json.loads(output.read_text())
    assert trained_reward == scores["greedy"]["combined_mean"] == scores["sampled"]["combined_mean"] == 2.5
    assert scores["reward_weights"] == [2.0, 0.5] and scores["num_generations"] == 2
    weighted = invoke(
        "eval",
        *("--model", files["model"], "--dataset", files["data"], "--split", "train", "--limit", "4"),
        *("--reward", one, "--reward", one, "--reward-weight", "3", "--reward-weight", "1", "--output", output),
    )
    assert succeeded(weighted)
    assert json.loads(output.read_text())["greedy"]["combined_mean"] == 4.0
    mismatched = invoke("eval", "--model", files["model"], "--run-file", path, "--reward-weight", "1")
    assert mismatched.exit_code == 2 and "1 --reward-weight values for 2 rewards" in flat(mismatched.stderr)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--batch-size", "0"], "--batch-size=0 is invalid: it must be >= 1"),
        (["--max-completion-length", "0"], "--max-completion-length=0 is invalid: it must be >= 1"),
        (["--temperature", "-1"], "--temperature=-1.0 is invalid: it must be finite and >= 0 (0 is greedy)"),
        (["--column", "question"], "--column 'question' is invalid: write old=new"),
    ],
)
def test_eval_options_are_checked_with_a_message(files: dict[str, Path], options: list[str], message: str) -> None:
    # before: a raw traceback (ZeroDivisionError, dict update error) or an empty run
    result = invoke("eval", "--model", files["model"], "--dataset", files["data"], "--reward", "accuracy", *options)
    assert result.exit_code == 2 and message in flat(result.stderr)


def test_eval_at_temperature_zero_is_greedy(tmp_path: Path, files: dict[str, Path]) -> None:
    output = tmp_path / "eval.json"
    result = invoke(
        "eval",
        *("--model", files["model"], "--dataset", files["data"], "--split", "train", "--limit", "4"),
        *("--reward", "tests.helpers.models:token_id_sum", "--temperature", "0", "--max-completion-length", "4"),
        *("--output", output),
    )
    assert succeeded(result)
    scores = json.loads(output.read_text())
    assert scores["sampled"]["combined_mean"] == scores["greedy"]["combined_mean"]  # every sample is the greedy one


def test_eval_of_a_missing_reward_exits_2(files: dict[str, Path]) -> None:
    result = invoke("eval", "--model", files["model"], "--dataset", files["data"], "--reward", "acuracy")
    assert result.exit_code == 2
    assert "unknown reward `acuracy`" in flat(result.stderr)


# ---------------------------------------------------------------------------- report
def test_report_rebuilds_the_html(trained: Path) -> None:
    (trained / "report.html").unlink()
    result = invoke("report", trained)
    assert succeeded(result)
    assert (trained / "report.html").stat().st_size > 1000


def test_report_without_metrics_exits_2(tmp_path: Path) -> None:
    result = invoke("report", tmp_path)
    assert result.exit_code == 2
    assert "metrics.jsonl is missing or empty" in flat(result.stderr)


# ---------------------------------------------------------------------------- demo
def test_tiny_demo_writes_results_and_refuses_a_used_folder(tmp_path: Path) -> None:
    output_dir = tmp_path / "demo"
    sizes = ("--steps", "3", "--prompts-per-step", "8", "--num-generations", "2", "--eval-problems", "20")
    result = invoke("demo", *sizes, "--hidden-size", "32", "--warm-start-steps", "20", "--output-dir", output_dir)
    assert succeeded(result)
    for row in ("warm start", "+ RLOO", "same steps", "same tokens"):
        assert row in result.stdout
    summary = json.loads((output_dir / "demo_results.json").read_text())
    assert {"warm start", "+ RLOO", "control: + SFT, same steps", "control: + SFT, same tokens"} <= summary[
        "accuracy"
    ].keys()
    # each control's training time is reported, under its row's name
    assert {"control: + SFT, same steps", "control: + SFT, same tokens"} <= summary["seconds"].keys()
    assert (output_dir / "report.html").is_file()
    # every budget is counted in steps, so a second run gives the same numbers (the control
    # used to train for RLOO's wall time, so its accuracy moved with the machine's load)
    twin = tmp_path / "twin"
    assert succeeded(invoke("demo", *sizes, "--hidden-size", "32", "--warm-start-steps", "20", "--output-dir", twin))
    assert json.loads((twin / "demo_results.json").read_text())["accuracy"] == summary["accuracy"]

    before = snapshot(output_dir)
    again = invoke("demo", *sizes, "--output-dir", output_dir)
    assert again.exit_code == 2
    assert "already exists and is not empty" in flat(again.stderr)
    assert snapshot(output_dir) == before


def test_the_demo_controls_take_rloos_steps_on_its_prompts_or_on_its_generated_sequences(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rloo.cli.demo as demo

    calls: list[dict[str, Any]] = []
    real = demo.supervised_train

    def recording(model: Any, tokenizer: Any, demonstrations: Any, **knobs: Any) -> int:
        calls.append({"demonstrations": demonstrations, **knobs})
        return real(model, tokenizer, demonstrations, **knobs)

    monkeypatch.setattr(demo, "supervised_train", recording)
    sizes = {"steps": 3, "prompts_per_step": 8, "num_generations": 2, "eval_problems": 20, "hidden_size": 32}
    options = demo.DemoOptions(**sizes, warm_start_steps=20, output_dir=str(tmp_path / "demo"))
    result = demo.run_demo(options, log=lambda text: None)
    warm, same_steps, same_tokens = calls
    assert same_steps["steps"] == same_tokens["steps"] == 3  # as many steps as RLOO
    assert same_steps["batch_size"] == 8  # RLOO's prompts per step
    assert same_tokens["batch_size"] == 16  # RLOO's generated completions per step: 8 prompts x K = 2
    # all three are taught the teacher's carry-less answers: 47+38= -> 75 (the true answer is 85)
    train, _ = demo.make_problems(0)
    assert same_tokens["demonstrations"] == warm["demonstrations"] == demo.demonstrations(train)
    assert ("47+38=", "75") in demo.demonstrations([demo.Problem(47, 38, "+")])
    assert set(result.rows) >= {demo.CONTROL, demo.CONTROL_TOKENS}


@pytest.mark.slow
def test_the_default_demo_beats_the_warm_start_by_15_points(tmp_path: Path) -> None:
    """The real-size demo, in a fresh process as a user runs it (about 2 minutes on 2 CPU cores)."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "rloo", "demo", "--output-dir", str(tmp_path / "demo")]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - start
    assert finished.returncode == 0, finished.stdout + finished.stderr
    accuracy = json.loads((tmp_path / "demo" / "demo_results.json").read_text())["accuracy"]
    gain = accuracy["+ RLOO"]["greedy"] - accuracy["warm start"]["greedy"]
    assert gain >= 0.15, accuracy
    assert seconds < 180, f"the demo took {seconds:.0f} s"
    # the README shows this run's table: same accuracies, row by row, and the same gain
    shown = readme_demo_table()
    assert set(shown) == set(accuracy), (shown, accuracy)
    for model, (greedy, pass_k, teacher) in shown.items():
        printed = [f"{accuracy[model][key]:.1%}" for key in ("greedy", "pass_at_k", "teacher_agreement")]
        assert printed == [greedy, pass_k, teacher], f"README's demo table, {model}: {printed} printed"
    assert f"RLOO: +{gain * 100:.1f} points of greedy accuracy" in (REPO / "README.md").read_text()


def readme_demo_table() -> dict[str, tuple[str, str, str]]:
    """The README demo table's rows: model -> (greedy, pass@k, = teacher) as printed."""
    text = (REPO / "README.md").read_text()
    block = text[text.index("Two-digit + and -: accuracy on held-out problems") :].split("```")[0]
    rows = {}
    for line in block.splitlines():
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        if len(cells) == 5 and cells[1].endswith("%"):
            rows[cells[0]] = (cells[1], cells[2], cells[3])
    return rows


def test_the_readme_demo_table_is_read_whole() -> None:
    rows = readme_demo_table()
    assert len(rows) == 5 and rows["+ RLOO"][0].endswith("%") and "warm start" in rows


def test_unexpected_errors_are_one_line_and_debug_shows_the_traceback(
    tmp_path: Path, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import rloo.report.page as report

    def broken(run_dir: Path) -> Path:
        raise KeyError("boom")

    monkeypatch.setattr(report, "build_report", broken)
    quiet = invoke("report", tmp_path)
    assert quiet.exit_code == 1 and "KeyError: 'boom' (rloo --debug ... shows the traceback)" in flat(quiet.stderr)
    assert "Traceback" not in quiet.output
    loud = invoke("--debug", "report", tmp_path)
    assert isinstance(loud.exception, KeyError)  # the traceback propagates


def test_an_error_that_stopped_a_run_keeps_its_resume_note_in_the_one_line_message(
    tmp_path: Path, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped mid-training (a lost vLLM server, a worker that keeps dying) names its newest checkpoint and
    the resume command (the trainer's exception note), also in the CLI's one line."""
    import rloo.report.page as report
    from rloo.generation.vllm.client import ServerLost
    from rloo.training.monitoring.signals import note_resume

    def stopped(run_dir: Path) -> Path:
        error = ServerLost("vLLM server http://127.0.0.1:1/generate/ cannot be reached")
        note_resume(error, tmp_path / "run" / "checkpoint-4", tmp_path / "run", cli=True)
        raise error

    monkeypatch.setattr(report, "build_report", stopped)
    result = invoke("report", tmp_path)
    message = flat(result.stderr)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert message.startswith("error: vLLM server http://127.0.0.1:1/generate/ cannot be reached The run's newest"), (
        message
    )
    assert f"checkpoint is {tmp_path / 'run' / 'checkpoint-4'}" in message
    assert f"resume with `rloo train {tmp_path / 'run' / 'config.yaml'} --resume`" in message
    note_resume(plain := RuntimeError("x"), None, tmp_path, cli=True)  # no checkpoint yet: nothing to offer
    assert not getattr(plain, "__notes__", None)


def test_user_mistakes_in_a_run_file_are_one_line(tmp_path: Path, files: dict[str, Path]) -> None:
    path = run_file(tmp_path, files)
    limit = invoke("train", path, "dataset.limit=abc")
    assert limit.exit_code == 2 and "`dataset.limit` expects an int >= 1 or null, got 'abc'" in flat(limit.stderr)
    missing = invoke("train", path, "dataset.path=nope/missing.jsonl")
    assert missing.exit_code == 2 and "prompt data path 'nope/missing.jsonl' does not exist" in flat(missing.stderr)
    assert "Traceback" not in missing.output


# ---------------------------------------------------------------------------- --version, --print-config, help text
def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"rloo {version('rloo')}"


def test_print_config_prints_the_resolved_run_and_loads_nothing(tmp_path: Path, files: dict[str, Path]) -> None:
    path = run_file(tmp_path, files)
    result = invoke("train", str(path), "learning_rate=3e-4", "reward_clip_range=[-1,1]", "--print-config")
    assert result.exit_code == 0, result.output
    printed = yaml.safe_load(result.stdout)
    assert printed["learning_rate"] == 3e-4 and printed["reward_clip_range"] == [-1, 1]
    assert printed["model"] == str(files["model"]) and "beta" in printed  # every field, resolved
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("**/config.yaml"))  # nothing written


def test_help_keeps_bracketed_defaults() -> None:
    """rich read ``[default: ...]`` in a help string as markup and dropped it."""

    def unboxed(text: str) -> str:  # the help panel's borders removed, lines joined
        return flat(text.replace("│", " "))

    assert "[default: runs/demo, or runs/demo-N if taken]" in unboxed(invoke("demo", "--help").stdout)
    assert "[default: 1 each]" in unboxed(invoke("eval", "--help").stdout)


def test_eval_formats_prompts_as_training_did(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--as-chat / --system-prompt turn text prompts into conversations; --name reaches the hub loader."""
    from rloo.cli.evaluate import eval_inputs

    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(3)))
    common: dict[str, Any] = {
        "split": "train",
        "columns": {"question": "prompt"},
        "limit": None,
        "rewards": ["accuracy"],
        "weights": None,
        "num_generations": 2,
        "max_completion_length": 4,
        "temperature": None,
        "success_threshold": 1.0,
        "batch_size": 4,
        "seed": 0,
    }
    loaded = eval_inputs(None, dataset=str(data), as_chat=True, system_prompt="Be brief.", **common).data
    assert loaded[0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "0+0="},
    ]
    plain = eval_inputs(None, dataset=str(data), **common).data
    assert plain[0]["prompt"] == "0+0="

    asked: dict[str, Any] = {}

    def hub(path: str, name: str | None = None, split: str | None = None, **kwargs: Any) -> Any:
        import datasets

        asked.update(path=path, name=name, split=split)
        return datasets.Dataset.from_list([{"prompt": "1+1=", "answer": "2"}])

    monkeypatch.setattr("datasets.load_dataset", hub)
    eval_inputs(None, dataset="org/sums", name="main", **{**common, "columns": None})
    assert asked == {"path": "org/sums", "name": "main", "split": "train"}


def test_every_subcommands_options_take_either_spelling() -> None:
    from typer.main import get_command

    from rloo.cli.commands import app

    commands = get_command(app).commands  # type: ignore[attr-defined]
    context = commands["demo"].make_context("demo", ["--num_generations", "3", "--hidden_size", "64"])
    assert (context.params["num_generations"], context.params["hidden_size"]) == (3, 64)
    assert commands["bandit"].make_context("bandit", ["--num_groups", "5"]).params["num_groups"] == 5
