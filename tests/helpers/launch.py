"""Launching real processes for the multi-process tests (``tests/training/parallel/test_distributed.py``,
``tests/training/parallel/test_fsdp.py``): ``torchrun`` and plain ``python`` children, and reading their results."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from rloo.tiny import save_tiny_model
from tests.helpers.paths import REPO
from tests.helpers.processes import child_env

BIN = Path(sys.executable).parent
TIMING = re.compile(
    r"^(timing/.*|tokens_per_second|step_time|train_runtime|train_samples_per_second|train_steps_per_second"
    r"|async/trainer_wait_seconds|async/worker_idle_seconds|async/weight_sync_seconds)$"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(
    *args: str, nproc: int = 2, extra_env: dict[str, str] | None = None, **rdzv: Any
) -> subprocess.CompletedProcess[str]:
    launcher = [str(BIN / "torchrun"), f"--nproc_per_node={nproc}"]
    if rdzv:
        launcher += [f"--{k}={v}" for k, v in rdzv.items()]
    else:
        launcher += ["--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    return subprocess.run(
        [*launcher, *args], cwd=REPO, env=child_env(**(extra_env or {})), capture_output=True, text=True, timeout=300
    )


def python(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=child_env(**(extra_env or {})),
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


def max_param_diff(a: Path, b: Path) -> float:
    x, y = load_file(str(a)), load_file(str(b))
    assert x.keys() == y.keys()
    return max(float((x[k] - y[k]).abs().max()) for k in x)


def metrics(path: Path) -> list[dict[str, float]]:
    rows = (
        json.loads(path.read_text())
        if path.suffix == ".json"
        else [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    )
    return [{k: v for k, v in row.items() if not TIMING.match(k)} for row in rows]


def assert_same_metrics(a: list[dict[str, float]], b: list[dict[str, float]]) -> None:
    assert len(a) == len(b)
    for row_a, row_b in zip(a, b, strict=True):
        assert row_a.keys() == row_b.keys()
        for key in row_a:
            assert row_a[key] == pytest.approx(row_b[key], rel=1e-5, abs=1e-6, nan_ok=True), key


def write_run_file(tmp_path: Path, output_dir: Path, **overrides: Any) -> Path:
    model = tmp_path / "model"
    if not model.exists():
        save_tiny_model(model, chars="0123456789+= ")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}="}) + "\n" for a in range(10) for b in range(10)))
    values = {
        "model": str(model),
        "dataset": str(data),
        "reward_funcs": ["tests.helpers.models:frac7_stopping"],
        "output_dir": str(output_dir),
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 6,
        "learning_rate": 0.03,
        "lr_scheduler_type": "constant",
        "save_steps": 2,
        "max_steps": 12,
        "logging_steps": 1,
        "seed": 0,
        **overrides,
    }
    run_file = tmp_path / f"{output_dir.name}.yaml"
    run_file.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in values.items()))
    return run_file
