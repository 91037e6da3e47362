"""A real ``rloo vllm-serve`` process for tests (from ``.venv-vllm``: ``make vllm``; tests skip without it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from rloo.generation.vllm.client import serving, vllm_python
from tests.helpers.launch import free_port


@contextlib.contextmanager
def vllm_server(model_dir: Path, *extra: str) -> Iterator[str]:
    """Serve ``model_dir`` (float32, 256 positions; ``extra``: more flags) on a free port of 127.0.0.1; yields
    its URL."""
    try:
        vllm_python()
    except ValueError as error:
        pytest.skip(str(error))
    args = ("--dtype", "float32", "--max_model_len", "256", "--log_level", "warning", *extra)
    with serving(model_dir, *args, port=free_port()) as url:
        yield url
