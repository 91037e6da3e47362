"""Runs examples/trl_rloo.py offline: the hub stand-ins it needs, then the script as written.

Usage: ``python -m tests.helpers.trl_example WORKDIR``. The hub model id "Qwen/Qwen3-0.6B" resolves
to a tiny Qwen3 saved in a local hub cache (``HF_HUB_CACHE``, ``HF_HUB_OFFLINE=1``, set by the
test); ``datasets.load_dataset`` returns tiny NuminaMath-TIR-shaped splits; ``HfApi`` is a
recorder that writes ``WORKDIR/pushed.json``. Nothing reaches the network.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

import datasets
import huggingface_hub

from tests.helpers.paths import REPO


def numina_rows(n: int) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        problem = f"What is {i} + {i}?"
        solution = f"{i} + {i} = \\boxed{{{2 * i}}}"
        rows.append({"problem": problem, "solution": solution, "messages": [{"role": "user", "content": problem}]})
    return rows


def fake_load_dataset(path: str, split: Any = None, **kwargs: Any) -> Any:
    assert path == "AI-MO/NuminaMath-TIR", path
    assert split == ["train[:5%]", "test[:5%]"], split
    return [datasets.Dataset.from_list(numina_rows(4)), datasets.Dataset.from_list(numina_rows(2))]


class RecordingHub(huggingface_hub.HfApi):
    """``HfApi`` that records instead of uploading (a subclass: transformers annotates with the class)."""

    workdir = Path(".")

    def create_repo(self, repo_id: str, **kwargs: Any) -> None:  # type: ignore[override]
        (self.workdir / "created.json").write_text(json.dumps({"repo_id": repo_id}))

    def upload_folder(self, *, folder_path: str, repo_id: str, **kwargs: Any) -> str:  # type: ignore[override]
        files = sorted(p.name for p in Path(folder_path).iterdir())
        (self.workdir / "pushed.json").write_text(json.dumps({"repo_id": repo_id, "files": files}))
        return f"https://hub.local/{repo_id}"


def main(workdir: Path) -> None:
    datasets.load_dataset = fake_load_dataset
    RecordingHub.workdir = workdir
    huggingface_hub.HfApi = RecordingHub  # type: ignore[misc]
    sys.argv = ["trl_rloo.py"]
    runpy.run_path(str(REPO / "examples" / "trl_rloo.py"), run_name="__main__")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
