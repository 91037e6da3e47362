"""The README's Python examples run as written, on a tiny local model folder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rloo.tiny import DEFAULT_CHARS, save_tiny_model

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_quickstart_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    example = python_blocks()[0]
    assert len([line for line in example.splitlines() if line.strip()]) <= 15
    save_tiny_model(tmp_path / "my-model", chars=DEFAULT_CHARS)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(example, "README.md", "exec"), namespace)
    assert (tmp_path / "runs" / "quickstart" / "model" / "model.safetensors").is_file()


def test_the_compute_metrics_example_logs_its_metric(tmp_path: Path) -> None:
    from textwrap import dedent

    from tests.helpers.models import dataset, trainer

    (block,) = [block for block in python_blocks() if "def compute_metrics" in block]
    namespace: dict[str, object] = {}
    exec(compile(dedent(block), "README.md", "exec"), namespace)
    run = trainer(tmp_path)
    run.compute_metrics = namespace["compute_metrics"]  # type: ignore[assignment]
    rows = dataset(3)
    metrics = run.evaluate(rows)
    assert 0.0 <= metrics["eval_exact_match"] <= 1.0
    # by hand on what it computes: the share of completions that are exactly their answer
    assert namespace["compute_metrics"](  # type: ignore[operator]
        type("EvalPrediction", (), {"completions": ["1", " 2", "0"], "columns": {"answer": ["1", "2", "3"]}})
    ) == {"exact_match": 2 / 3}
