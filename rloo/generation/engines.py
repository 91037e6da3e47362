"""The engine table: which :class:`~rloo.generation.rollout.SamplingEngine` a run samples with, and what the
rest of the step needs to know of it.

An engine is one file (rloo's own sampler: :mod:`rloo.generation.rollout`; vLLM: :mod:`rloo.generation.vllm`;
transformers' continuous batching: :mod:`rloo.generation.continuous_batching`)
and one entry in :data:`ENGINES`: a builder from the config, and the engine's declared properties, which
phases 3-4 read (:class:`rloo.training.experience.ExperienceMaker`) instead of asking which engine it is.
The config chooses the name (:func:`engine_name`: ``use_vllm`` and ``vllm_mode``, and
``use_transformers_continuous_batching``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rloo.generation.continuous_batching import continuous_batching_sampler
from rloo.generation.rollout import SamplingEngine
from rloo.generation.sampling import SamplingParams
from rloo.generation.vllm.sampler import colocated_sampler, server_sampler


@dataclass(frozen=True)
class EngineEntry:
    """One engine: ``build(config)`` gives it (None: rloo's own sampler, which the pipeline picks by
    ``sampler_cuda_graphs``); ``separate``: it samples with other kernels than rloo's forward (vLLM with its
    own copy of the weights too), so its log-probs never equal rloo's and every batch is off-policy;
    ``processed_logprobs``: the log-probs it returns are of the distribution after repetition penalty and
    truncation (top-k, top-p, min-p), as vLLM's and transformers' continuous batching's are."""

    build: Callable[[Any], SamplingEngine | None]
    separate: bool = False
    processed_logprobs: bool = False

    def logprobs_are_scored(self, params: SamplingParams) -> bool:
        """Whether its sampled tokens' log-probs are of the distribution rloo scores, ``log_softmax(logits / T)``:
        always for rloo's sampler; for an engine whose log-probs are processed, only without penalty or
        truncation (``params.plain``)."""
        return params.plain or not self.processed_logprobs


def _own_sampler(config: Any) -> None:
    return None


ENGINES: dict[str, EngineEntry] = {
    "rloo": EngineEntry(_own_sampler),
    "vllm_server": EngineEntry(server_sampler, separate=True, processed_logprobs=True),
    "vllm_colocate": EngineEntry(colocated_sampler, separate=True, processed_logprobs=True),
    "transformers_continuous_batching": EngineEntry(
        continuous_batching_sampler, separate=True, processed_logprobs=True
    ),
}


def engine_name(config: Any) -> str:
    """The engine a config asks for: ``vllm_<vllm_mode>`` with ``use_vllm``, ``transformers_continuous_batching``
    with ``use_transformers_continuous_batching``, else ``rloo``."""
    if getattr(config, "use_vllm", False):
        return f"vllm_{config.vllm_mode}"
    if getattr(config, "use_transformers_continuous_batching", False):
        return "transformers_continuous_batching"
    return "rloo"


def engine_entry(config: Any) -> EngineEntry:
    """The :data:`ENGINES` entry of the engine ``config`` asks for."""
    name = engine_name(config)
    if name not in ENGINES:
        raise ValueError(f"no sampling engine {name!r}; the engines are {sorted(ENGINES)}")
    return ENGINES[name]


def build_engine(config: Any) -> SamplingEngine | None:
    """The engine ``config`` asks for, built (None: rloo's own sampler)."""
    return engine_entry(config).build(config)
