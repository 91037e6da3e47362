"""The engine table (rloo.generation.engines): which sampling engine a config asks for, what the step reads of
it, and that an entry is all a new engine needs to be sampled with."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from rloo.config import RLOOConfig
from rloo.generation import engines
from rloo.generation.engines import ENGINES, EngineEntry, build_engine, engine_entry, engine_name
from rloo.generation.rollout import Rollout, SamplingEngine, generate_rollouts
from rloo.generation.sampling import SamplingParams
from rloo.generation.vllm.sampler import VLLMSampler
from rloo.pipeline import RolloutSettings, generate_and_score
from rloo.rewards.calling import RewardFunctions
from tests.helpers.models import always_one

PLAIN, TRUNCATED = SamplingParams(), SamplingParams(top_p=0.9)


def test_the_config_names_the_engine(tmp_path: Path) -> None:
    assert engine_name(RLOOConfig(output_dir=str(tmp_path))) == "rloo"
    for mode in ("server", "colocate"):
        config = RLOOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_mode=mode)
        assert engine_name(config) == f"vllm_{mode}" and engine_entry(config) is ENGINES[f"vllm_{mode}"]
    assert build_engine(RLOOConfig(output_dir=str(tmp_path))) is None  # rloo's own: the pipeline picks the loop
    assert isinstance(
        build_engine(RLOOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_mode="server")), VLLMSampler
    )


def test_the_engines_declare_what_the_step_reads() -> None:
    """What ExperienceMaker asked of ``use_vllm`` before: off-policy by construction (vLLM), and log-probs of
    the scored distribution (rloo's always, vLLM's only without penalty or truncation)."""
    own, server, colocate = ENGINES["rloo"], ENGINES["vllm_server"], ENGINES["vllm_colocate"]
    assert not own.separate and server.separate and colocate.separate
    assert own.logprobs_are_scored(PLAIN) and own.logprobs_are_scored(TRUNCATED)
    for vllm in (server, colocate):
        assert vllm.logprobs_are_scored(PLAIN) and not vllm.logprobs_are_scored(TRUNCATED)


def test_an_unknown_engine_names_the_known_ones(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(engines, "engine_name", lambda config: "sglang")
    with pytest.raises(
        ValueError, match=r"no sampling engine 'sglang'; the engines are \['rloo', 'transformers_continuous_batching'"
    ):
        engine_entry(RLOOConfig(output_dir=str(tmp_path)))


class Recording:
    """An engine that samples with rloo's loop and records the step it was called at."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def __call__(
        self, model: nn.Module, prompt_ids: Sequence[Sequence[int]], group_ids: Sequence[int], **kwargs: Any
    ) -> Rollout:
        self.steps.append(kwargs.pop("step"))
        return generate_rollouts(model, prompt_ids, group_ids, **kwargs)


def test_an_entry_is_all_an_engine_needs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, peaked_model: Any, char_tokenizer: Any
) -> None:
    engine = Recording()
    declared: SamplingEngine = engine  # the contract, checked by mypy
    monkeypatch.setitem(ENGINES, "recording", EngineEntry(lambda config: declared))
    monkeypatch.setattr(engines, "engine_name", lambda config: "recording")
    settings = RolloutSettings.from_config(
        RLOOConfig(output_dir=str(tmp_path), num_generations=2, max_completion_length=4)
    )
    assert settings.engine is engine
    state = type("State", (), {"global_step": 7})()
    rewards = RewardFunctions([always_one])
    scored = generate_and_score(peaked_model, char_tokenizer, ["ab", "cd"], {}, rewards, settings, trainer_state=state)
    assert engine.steps == [7] and scored.rollout.completion_ids.shape[0] == 4
