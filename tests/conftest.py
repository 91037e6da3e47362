"""Shared test configuration: one hypothesis profile for the whole math suite, shared fixtures.

Examples are few (the machine is small) and there is no per-example deadline, so a slow
first call (torch warm-up) does not make a property test flaky.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

from rloo.tiny import build_char_tokenizer, save_tiny_model
from tests.helpers.models import peaked_tiny_llama, tiny_reward_model

# the tiers' durations and budgets, and the check that only system tests start processes (CONTRIBUTING.md)
pytest_plugins = ("tests.helpers.tiers",)

settings.register_profile(
    "rloo",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,  # the same examples on every run: CI cannot flake on a new draw
)
settings.load_profile("rloo")


@pytest.fixture(autouse=True)
def _report_only_where_read(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """``train()`` ends by writing report.html, about 1 s of matplotlib a run; tests that read it
    are marked ``report`` (``rloo report`` and ``build_report`` are tested directly), the others
    skip it. A module-scoped fixture's run happens before this one: it writes its report."""
    if request.node.get_closest_marker("report") is None:
        monkeypatch.setattr("rloo.training.trainer.write_report", lambda output_dir, warn: None)


@pytest.fixture(scope="session")
def char_tokenizer() -> Any:
    """The default character tokenizer (read-only: do not change its attributes)."""
    return build_char_tokenizer()


@pytest.fixture(scope="session")
def peaked_model(char_tokenizer: Any) -> Any:
    """:func:`tests.helpers.models.peaked_tiny_llama` for ``char_tokenizer``, in eval mode."""
    return peaked_tiny_llama(char_tokenizer)


@pytest.fixture(scope="session")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny sequence-classification reward model and its tokenizer (read-only)."""
    path = tmp_path_factory.mktemp("models") / "tiny-rm"
    tokenizer = build_char_tokenizer()
    tiny_reward_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny model folder and a JSONL dataset of one-digit additions (shared, read-only)."""
    root = tmp_path_factory.mktemp("inputs")
    model = save_tiny_model(root / "model", chars="0123456789+= ")
    data = root / "sums.jsonl"
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"model": model, "data": data}


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models gain nothing from a second thread, and run much slower with two when another
    process holds a core (torch's threads spin-wait on each other). Use with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fresh_accelerate_state() -> Any:
    """accelerate keeps one process-wide mixed-precision setting: a bf16 run needs it reset, before and after."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
