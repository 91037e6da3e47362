"""Every shipped run file validates (nothing is loaded: no network needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rloo.cli.run_file import build_peft_config, load_run_file
from rloo.rewards.resolve import resolve_reward

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_run_file_validates(path: Path) -> None:
    spec = load_run_file(path)
    assert spec.config.completions_per_generation % spec.config.num_generations == 0
    for reward in spec.reward_funcs:
        assert callable(resolve_reward(reward))
    if spec.peft is not None:
        build_peft_config(spec.peft)


def test_there_is_an_example() -> None:
    assert EXAMPLES
