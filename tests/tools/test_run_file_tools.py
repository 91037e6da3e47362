"""Tools in a run file (``tools: [...]``): ``rloo train`` runs multi-turn episodes and records them in
config.yaml; ``rloo eval --run-file`` evaluates with the same tools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rloo.cli.run_file import load_run_file
from tests.helpers.cli import flat, invoke
from tests.helpers.tools import question, taught_model, tool_tokenizer


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tools")
    taught_model().save_pretrained(root / "model")
    tool_tokenizer().save_pretrained(root / "model")
    rows = [{"prompt": question(a, b), "a": a, "b": b} for a, b in [(3, 4), (2, 5)] * 4]
    (root / "data.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root / "model", root / "data.jsonl"


def run_file(tmp_path: Path, model: Path, data: Path, **overrides: object) -> Path:
    values = {
        "model": str(model),
        "dataset": str(data),
        "reward_funcs": ["tests.helpers.tool_runs:product"],
        "tools": ["tests.helpers.tools:multiply"],
        "output_dir": str(tmp_path / "run"),
        "num_generations": 2,
        "per_device_train_batch_size": 4,
        "max_completion_length": 120,
        "max_tool_calling_iterations": 2,
        "max_steps": 1,
        "report_to": [],
        **overrides,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_train_and_eval_run_the_run_files_tools(tmp_path: Path, setup: tuple[Path, Path]) -> None:
    model, data = setup
    assert invoke("train", run_file(tmp_path, model, data)).exit_code == 0
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(row.get("tools/call_frequency", 0) > 0.5 for row in logged)
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert recorded["tools"] == ["tests.helpers.tools:multiply"]
    out = tmp_path / "eval.json"
    result = invoke(
        "eval", "--model", model, "--run-file", tmp_path / "run" / "config.yaml", "--split", "train",
        "--num-generations", "2", "--output", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    assert json.loads(out.read_text())["greedy"]["combined_mean"] > 0.5  # the taught model calls multiply


@pytest.mark.parametrize("tools", [["multiply"], [3]])
def test_a_tool_that_is_neither_python_nor_an_import_path_is_refused(
    tmp_path: Path, setup: tuple[Path, Path], tools: list[object]
) -> None:
    with pytest.raises(ValueError, match=r"`tools\[0\]`=.*give 'python' \(the sandboxed Python tool\)"):
        load_run_file(run_file(tmp_path, *setup, tools=tools))


def test_a_tool_that_does_not_import_names_its_module(tmp_path: Path, setup: tuple[Path, Path]) -> None:
    result = invoke("train", run_file(tmp_path, *setup, tools=["tests.helpers.nowhere:multiply"]))
    assert result.exit_code == 2 and "tool 'tests.helpers.nowhere:multiply': could not import" in flat(result.stderr)
