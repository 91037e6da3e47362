"""``rloo eval``: each reward function reported on its own, the combined threshold named for what it
is, and the evaluated split said out loud (tiny local model, CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest
import torch
import yaml

from rloo.cli.evaluate import eval_inputs, results_table, summarize
from tests.helpers.cli import flat, invoke

pytestmark = pytest.mark.usefixtures("one_thread")

ONE = "tests.helpers.models:always_one"
NAN = float("nan")


def test_summarize_reports_each_reward_and_the_combined_share_by_hand() -> None:
    # 2 prompts x K=2; `right` is 0/1, `length` is continuous; NaN: `right` does not apply there
    right = [[[1.0], [0.0]], [[NAN], [0.0]]]
    length = [[[0.5], [0.25]], [[0.75], [0.5]]]
    scores = torch.cat([torch.tensor(right), torch.tensor(length)], dim=2)  # (P=2, K=2, F=2)
    combined = torch.tensor([[1.5, 0.25], [0.75, 0.5]])
    summary = summarize(combined, scores, ["right", "length"], [True, False], threshold=0.75)
    assert summary["combined_mean"] == pytest.approx(3.0 / 4)
    assert summary["combined_at_least_threshold"] == 0.5  # 1.5 and 0.75 of 4
    assert summary["rewards"]["right"] == {"mean": pytest.approx(1 / 3), "scorable": 0.75, "fraction_of_ones": 0.25}
    assert summary["rewards"]["length"] == {"mean": 0.5, "scorable": 1.0}  # no share of 1s: not 0/1-valued
    assert summary["pass_at_k"] == {"combined_at_least_threshold": 1.0, "right": 0.5}
    # unbiased pass@1: each prompt's share of successes, averaged: (1/2 + 1/2) / 2 combined, (1/2 + 0) / 2 right
    assert summary["pass_at"] == {
        "1": {"combined_at_least_threshold": 0.5, "right": 0.25},
        "2": {"combined_at_least_threshold": 1.0, "right": 0.5},
    }
    greedy = summarize(combined[:, :1], scores[:, :1], ["right", "length"], [True, False], threshold=0.75)
    assert "pass_at_k" not in greedy and greedy["rewards"]["right"]["fraction_of_ones"] == 0.5


def test_each_reward_is_reported_and_the_threshold_is_no_accuracy(tmp_path: Path, files: dict[str, Path]) -> None:
    # before: "accuracy" was the share of completions with combined reward >= 1.0, so a reward that
    # is always 1 beside `accuracy` made any model 100% "accurate"; the rewards were not shown apart
    output = tmp_path / "eval.json"
    result = invoke(
        "eval",
        *("--model", files["model"], "--dataset", files["data"], "--limit", "4", "--max-completion-length", "4"),
        *("--reward", "accuracy", "--reward", ONE, "--reward", "tests.helpers.models:token_id_sum"),
        *("--reward-weight", "1", "--reward-weight", "1", "--reward-weight", "0", "--num-generations", "2"),
        *("--output", output),
    )
    assert result.exit_code == 0, result.output
    scores = json.loads(output.read_text())
    for decoding in ("greedy", "sampled"):
        rewards = scores[decoding]["rewards"]
        assert rewards["always_one"] == {"mean": 1.0, "scorable": 1.0, "fraction_of_ones": 1.0}
        assert rewards["accuracy"]["fraction_of_ones"] == rewards["accuracy"]["mean"]  # 0/1-valued
        assert "fraction_of_ones" not in rewards["token_id_sum"] and rewards["token_id_sum"]["mean"] > 1
        assert scores[decoding]["combined_at_least_threshold"] == 1.0  # always_one alone passes it
    assert scores["sampled"]["pass_at_k"]["always_one"] == 1.0 and "accuracy" in scores["sampled"]["pass_at_k"]
    assert scores["success_threshold"] == 1.0 and scores["reward_weights"] == [1.0, 1.0, 0.0]
    table = results_table(scores, "title")
    columns = {str(column.header).replace("\n", " "): list(column.cells) for column in table.columns}
    assert list(columns)[1:] == [
        *("accuracy (% = 1)", "always_one (% = 1)", "token_id_sum (mean)"),
        *("combined (mean)", "combined reward >= 1"),
    ]
    assert columns["decoding"] == ["greedy", "sampled (T=1)", "pass@2"]
    assert columns["always_one (% = 1)"] == ["100.0%", "100.0%", "100.0%"]
    assert columns["combined reward >= 1"] == ["100.0%", "100.0%", "100.0%"]
    assert "combined: the rewards' weighted sum (weights 1, 1, 0)" in str(table.caption)
    assert "combined reward" in flat(result.stdout) and "pass@2" in result.stdout


def test_the_success_threshold_sets_the_combined_share(tmp_path: Path, files: dict[str, Path]) -> None:
    output = tmp_path / "eval.json"
    base = ("eval", "--model", files["model"], "--dataset", files["data"], "--limit", "2", "--reward", ONE)
    result = invoke(*base, "--max-completion-length", "2", "--success-threshold", "1.5", "--output", output)
    assert result.exit_code == 0, result.output
    scores = json.loads(output.read_text())
    assert scores["success_threshold"] == 1.5 and scores["greedy"]["combined_at_least_threshold"] == 0.0
    assert "combined reward\n>= 1.5" in [str(column.header) for column in results_table(scores, "").columns]


def write_run_file(folder: Path, model: Path, dataset: Any, **values: Any) -> Path:
    run = {"model": str(model), "dataset": dataset, "reward_funcs": [ONE], "num_generations": 2}
    run.update(max_completion_length=2, output_dir=str(folder / "run"), **values)
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(run, sort_keys=False))
    return path


def test_a_run_file_without_an_eval_set_says_its_training_data_is_evaluated(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    # before: the run file's training prompts were evaluated without a word
    path = write_run_file(tmp_path, files["model"], {"path": str(files["data"]), "limit": 2})
    output = tmp_path / "eval.json"
    result = invoke("eval", "--model", files["model"], "--run-file", path, "--output", output)
    assert result.exit_code == 0, result.output
    assert (
        f"{path} has no eval_dataset: evaluating on its TRAINING data ({files['data']}); "
        "choose other prompts with --split NAME or --dataset PATH" in flat(result.stderr)
    )
    assert "(TRAINING data)" in flat(result.stdout)
    evaluated = json.loads(output.read_text())["dataset"]
    assert evaluated["training_data"] is True and evaluated["path"] == str(files["data"])
    # a file holds one split: another split name is refused, naming the ones there are
    other = invoke("eval", "--model", files["model"], "--run-file", path, "--split", "test")
    assert other.exit_code == 2
    assert "split 'test' not found; available splits: train" in flat(other.stderr)


def test_the_terminal_gets_a_table_and_the_json_goes_to_a_file_beside_the_run(
    tmp_path: Path, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ~70 lines of JSON followed the table on the terminal, and --output was the only file."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(files["model"], run / "final")
    path = write_run_file(tmp_path, files["model"], {"path": str(files["data"]), "limit": 2})
    shutil.copy(path, run / "config.yaml")
    monkeypatch.chdir(tmp_path)
    result = invoke("eval", "--model", run / "final", "--run-file", run / "config.yaml")
    assert result.exit_code == 0, result.output
    assert "combined reward" in flat(result.stdout) and '"greedy"' not in result.stdout
    assert len(result.stdout.splitlines()) < 20
    written = run / "eval-final.json"  # in the run folder of the model evaluated
    assert f"results (JSON): {written}" in flat(result.stderr)
    first = json.loads(written.read_text())
    assert first["model"] == str(run / "final") and set(first["greedy"]) >= {"combined_mean", "rewards"}
    # --json: the same JSON on stdout, for a pipe; an earlier file is never overwritten
    again = invoke("eval", "--model", run / "final", "--run-file", run / "config.yaml", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == json.loads((run / "eval-final-2.json").read_text()) == first
    assert "combined reward" not in again.stdout and json.loads(written.read_text()) == first
    # a model outside a run folder, no run file: runs/eval/ in the current folder
    plain = invoke("eval", "--model", files["model"], "--dataset", files["data"], "--reward", ONE, "--limit", "1")
    assert plain.exit_code == 0, plain.output
    assert (tmp_path / "runs" / "eval" / f"eval-{files['model'].name}.json").is_file()


def test_split_chooses_a_run_files_split_and_dataset_defaults_to_test(tmp_path: Path, files: dict[str, Path]) -> None:
    rows = [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(5)]
    splits = {"train": datasets.Dataset.from_list(rows[:3]), "test": datasets.Dataset.from_list(rows[3:])}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "sums"))
    path = write_run_file(tmp_path, files["model"], {"path": str(tmp_path / "sums")})
    output = tmp_path / "eval.json"
    chosen = invoke("eval", "--model", files["model"], "--run-file", path, "--split", "test", "--output", output)
    assert chosen.exit_code == 0, chosen.output
    assert "TRAINING" not in chosen.output
    scores = json.loads(output.read_text())
    assert scores["num_prompts"] == 2 and scores["dataset"]["split"] == "test"
    assert not scores["dataset"]["training_data"]
    given = invoke(
        "eval", "--model", files["model"], "--dataset", tmp_path / "sums", "--reward", ONE, "--output", output
    )
    assert given.exit_code == 0, given.output
    assert json.loads(output.read_text())["dataset"]["split"] == "test" and "split test" in flat(given.stdout)


def test_a_missing_prompt_column_names_the_column_option(tmp_path: Path, files: dict[str, Path]) -> None:
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+1=", "answer": str(a + 1)}) + "\n" for a in range(2)))
    result = invoke("eval", "--model", files["model"], "--dataset", data, "--reward", ONE)
    assert result.exit_code == 2
    assert "has no `prompt` column (columns: question, answer)" in flat(result.stderr)
    assert "--column question=prompt on the command line" in flat(result.stderr)
    # before: --column was ignored with --run-file
    path = write_run_file(tmp_path, files["model"], {"path": str(data)})
    inputs = eval_inputs(path, **eval_options(columns={"question": "prompt"}))
    assert inputs.data["prompt"] == ["0+1=", "1+1="]


def eval_options(**values: Any) -> dict[str, Any]:
    """``eval_inputs``' keyword arguments as the command's defaults give them, ``values`` replaced."""
    defaults: dict[str, Any] = dict(dataset=None, split=None, columns=None, limit=None, rewards=None, weights=None)
    defaults.update(num_generations=None, max_completion_length=None, temperature=None, success_threshold=1.0)
    return {**defaults, "batch_size": 4, "seed": 0, **values}


ANSWER_METRICS = "tests.helpers.models:answer_metrics"


def test_compute_metrics_reports_task_metrics_of_each_decoding(tmp_path: Path, files: dict[str, Path]) -> None:
    output = tmp_path / "eval.json"
    base = ("eval", "--model", files["model"], "--dataset", files["data"], "--limit", "4", "--reward", ONE)
    options = ("--max-completion-length", "4", "--num-generations", "2", "--reward", "accuracy", "--output", output)
    result = invoke(*base, *options, "--compute-metrics", ANSWER_METRICS)
    assert result.exit_code == 0, result.output
    scores = json.loads(output.read_text())
    for decoding, completions in (("greedy", 4), ("sampled", 8)):  # 4 prompts x 1, x K = 2
        task = scores[decoding]["compute_metrics"]
        assert set(task) == {"answer_rate", "completions_seen", "order_checksum", "reward_mean"}  # keys as returned
        assert task["completions_seen"] == completions
        assert task["reward_mean"] == pytest.approx(scores[decoding]["combined_mean"], rel=1e-6)
    table = results_table(scores, "title")
    columns = {str(column.header).replace("\n", " "): list(column.cells) for column in table.columns}
    answer_rate = [f"{scores[d]['compute_metrics']['answer_rate']:.4g}" for d in ("greedy", "sampled")]
    assert columns["answer_rate (compute_metrics)"] == [*answer_rate, ""]  # no pass@K of it
    assert "(compute_metrics): the hook's metrics of each decoding's completions" in str(table.caption)


def test_a_run_files_compute_metrics_is_used_and_a_failing_one_is_one_line(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    data = {"path": str(files["data"]), "limit": 2}
    path = write_run_file(tmp_path, files["model"], data, compute_metrics=ANSWER_METRICS)
    output = tmp_path / "eval.json"
    result = invoke("eval", "--model", files["model"], "--run-file", path, "--output", output)
    assert result.exit_code == 0, result.output
    assert json.loads(output.read_text())["sampled"]["compute_metrics"]["completions_seen"] == 4  # 2 prompts x K = 2
    # a reward function is no hook: it is called with one EvalPrediction, fails, and is named
    failed = invoke("eval", "--model", files["model"], "--run-file", path, "--compute-metrics", ONE)
    assert failed.exit_code == 1
    assert (
        "error: compute_metrics `always_one` failed on the 2 completions of 'greedy' (2 prompts x 1): TypeError:"
        in flat(failed.stderr)
    )
    assert "Traceback" not in failed.output


def test_evals_options_take_either_spelling() -> None:
    # rloo train takes --num_generations and --num-generations; eval took only the second
    from typer.main import get_command

    from rloo.cli.commands import app

    command = get_command(app).commands["eval"]  # type: ignore[attr-defined]
    context = command.make_context("eval", ["--model", "m", "--dataset", "d", "--num_generations", "3"])
    assert context.params["num_generations"] == 3
