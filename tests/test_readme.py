"""The README's Python example runs as written, on a tiny local model folder."""

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
