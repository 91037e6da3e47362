"""Run files (``rloo/cli/run_file.py``): the ``compute_metrics`` key, from the file to the logs. (The
run file's mistakes: tests/test_bad_inputs.py; its tools: tests/tools/test_run_file_tools.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rloo.cli.run_file import build_trainer, load_run_file
from tests.helpers.cli import invoke, run_file
from tests.helpers.models import answer_metrics

pytestmark = pytest.mark.usefixtures("one_thread")

ANSWER_METRICS = "tests.helpers.models:answer_metrics"


def write(folder: Path, files: dict[str, Path], **values: object) -> Path:
    """The tiny run file with an eval set of 3 prompts evaluated after its one step."""
    return run_file(folder, files, eval_dataset={"path": str(files["data"]), "limit": 3}, eval_steps=1, **values)


def test_a_run_files_compute_metrics_reaches_the_trainer_and_its_config(tmp_path: Path, files: dict[str, Path]) -> None:
    run = load_run_file(write(tmp_path, files, compute_metrics=ANSWER_METRICS))
    assert run.compute_metrics == ANSWER_METRICS and run.to_dict()["compute_metrics"] == ANSWER_METRICS
    assert "compute_metrics" not in load_run_file(write(tmp_path, files)).to_dict()  # none: no key
    assert build_trainer(run).compute_metrics is answer_metrics


def test_rloo_train_logs_the_hooks_metrics_and_records_it_for_a_rerun(tmp_path: Path, files: dict[str, Path]) -> None:
    result = invoke("train", write(tmp_path, files, compute_metrics=ANSWER_METRICS))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evaluated = [row for row in rows if "eval_reward" in row]
    assert len(evaluated) == 1 and evaluated[0]["eval_completions_seen"] == 6.0  # 3 eval prompts x K = 2
    assert evaluated[0]["eval_reward_mean"] == pytest.approx(evaluated[0]["eval_reward"], rel=1e-6)
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert recorded["compute_metrics"] == ANSWER_METRICS


def test_a_module_next_to_the_run_file_is_importable_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/reliability.md: "a module next to the run file is importable"; it was looked for in the cwd only
    import sys

    from rloo.cli.run_file import read_run_file
    from rloo.rewards.resolve import import_callable

    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "next_to_the_run_file.py").write_text(
        "def score(completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    (folder / "run.yaml").write_text("reward_funcs: [next_to_the_run_file:score]\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the run file's folder joins a copy, undone after
    read_run_file(folder / "run.yaml")
    assert import_callable("next_to_the_run_file:score")(["a", "b"]) == [1.0, 1.0]
