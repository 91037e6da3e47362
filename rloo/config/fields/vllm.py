"""The ``RLOOConfig`` fields of the other sampling engines (TRL's names and defaults): vLLM, where its server is,
and transformers' continuous batching (:mod:`rloo.generation.continuous_batching`).

``vllm_mode="server"``: a ``rloo vllm-serve`` process on its own devices (:mod:`rloo.generation.vllm.client`);
``colocate`` (TRL's default): vLLM inside the training process (:mod:`rloo.generation.vllm.colocate`), which
needs vLLM importable there (``.venv-vllm``). The fields only colocate reads are accepted and unread in
server mode, as TRL leaves them (a TRL recipe sets them either way); the server takes them as its flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from rloo.algo.importance import IMPORTANCE_SAMPLING_MODES
from rloo.config.errors import fail
from rloo.config.field_types import KeywordMapping
from rloo.config.fields.declare import option


@dataclass
class VLLMFields:
    """vLLM fields of ``RLOOConfig``, with their documentation."""

    use_vllm: bool = option(
        False,
        "Sample on vLLM instead of rloo's own sampler (vllm_mode: a `rloo vllm-serve` process, or in this one); "
        "the weights are sent to it after every optimizer step and checked.",
        trl="use_vllm",
    )
    vllm_mode: str = option(
        "colocate",
        "server (a `rloo vllm-serve` process, reached at vllm_server_base_url or host:port) or colocate (vLLM "
        "in the training process, which needs vLLM installed there: .venv-vllm).",
        trl="vllm_mode",
    )
    vllm_server_base_url: str | None = option(
        None,
        "The server's URL (http://host:port); None = http://vllm_server_host:vllm_server_port.",
        trl="vllm_server_base_url",
    )
    vllm_server_host: str = option(
        "0.0.0.0", "The server's host when vllm_server_base_url is None.", trl="vllm_server_host"
    )
    vllm_server_port: int = option(8000, "The server's port when vllm_server_base_url is None.", trl="vllm_server_port")
    vllm_server_timeout: float = option(
        240.0,
        "Seconds, > 0, to wait for the server to answer at the start (it may still be loading) or after it "
        "went away mid-run (then the weights are sent again), and the most one request may take.",
        trl="vllm_server_timeout",
    )
    vllm_group_port: int = option(
        51216,
        "TRL's port of the NCCL weight group; rloo sends weights over HTTP and does not read it.",
        trl="vllm_group_port",
    )
    vllm_gpu_memory_utilization: float = option(
        0.3,
        "colocate: vLLM's share of GPU memory. In server mode give it to rloo vllm-serve.",
        trl="vllm_gpu_memory_utilization",
    )
    vllm_tensor_parallel_size: int = option(
        1,
        "colocate: the engine's tensor parallelism. In server mode give --tensor_parallel_size to rloo vllm-serve.",
        trl="vllm_tensor_parallel_size",
    )
    vllm_enable_sleep_mode: bool = option(
        False,
        "colocate: let vLLM offload its memory between generations (vLLM's sleep mode).",
        trl="vllm_enable_sleep_mode",
    )
    vllm_model_impl: str = option(
        "vllm",
        "colocate: vLLM's model implementation (vllm or transformers); the server's --vllm_model_impl.",
        trl="vllm_model_impl",
    )
    vllm_max_model_length: int | None = option(
        None,
        "colocate: the engine's longest sequence (None: the model's); the server's --max_model_len.",
        trl="vllm_max_model_length",
    )
    vllm_importance_sampling_correction: bool = option(
        True,
        "Weigh each action's policy loss by the trainer's over vLLM's probability of the sampled tokens (the "
        "engines differ for the same weights); needs vLLM's log-probs of the full distribution: top_p 1, no "
        "top_k, min_p or repetition_penalty (else off, with a warning).",
        trl="vllm_importance_sampling_correction",
    )
    vllm_importance_sampling_mode: str = option(
        "sequence_mask",
        "token_truncate / token_mask (a weight per token) or sequence_truncate / sequence_mask (one per completion): "
        "*_truncate clamps it to [clip_min, clip_max], *_mask sets a weight outside the range to 0.",
        trl="vllm_importance_sampling_mode",
    )
    vllm_importance_sampling_clip_max: float | None = option(
        3.0, "The importance weights' upper bound C_max, > 0; None: none.", trl="vllm_importance_sampling_clip_max"
    )
    vllm_importance_sampling_clip_min: float | None = option(
        None,
        "The importance weights' lower bound C_min, >= 0 and < C_max; None: none.",
        trl="vllm_importance_sampling_clip_min",
    )
    use_transformers_continuous_batching: bool = option(
        False,
        "Sample with transformers' continuous batching (model.generate_batch: a paged KV cache, each prompt's K "
        "samples forked from its prefill, requests leaving the batch as they finish), as TRL's field does. rloo "
        "sizes its cache to the batch (unless transformers_continuous_batching_config sets num_blocks or "
        "max_memory_percent) and keeps the run's random state. Text prompts, no repetition_penalty or min_p "
        "(transformers' engine drops them); not with use_vllm or sampler_cuda_graphs.",
        trl="use_transformers_continuous_batching",
    )
    transformers_continuous_batching_config: KeywordMapping | None = option(
        None,
        "Keyword arguments of transformers' ContinuousBatchingConfig (e.g. {'page_size': 128, "
        "'use_cuda_graph': true}), checked against its fields when the engine is built.",
        trl="transformers_continuous_batching_config",
    )
    vllm_structured_outputs_regex: str | None = option(
        None,
        "Constrain completions to a regex (vLLM structured outputs); not supported yet: None only.",
        trl="vllm_structured_outputs_regex",
    )


def check_vllm(config: VLLMFields) -> None:
    """The vLLM fields' values, and what rloo cannot do with them yet; raises ``ValueError`` naming the field."""
    if config.vllm_mode not in ("server", "colocate"):
        raise fail("vllm_mode", config.vllm_mode, "use 'server' (a `rloo vllm-serve` process) or 'colocate'")
    if not config.vllm_server_timeout > 0:
        raise fail("vllm_server_timeout", config.vllm_server_timeout, "give the seconds to wait, > 0")
    if not 0 < config.vllm_server_port < 65536:
        raise fail("vllm_server_port", config.vllm_server_port, "give a TCP port, 1-65535")
    url = config.vllm_server_base_url
    if url is not None and not url.startswith(("http://", "https://")):
        raise fail("vllm_server_base_url", url, "give the server's URL, e.g. http://127.0.0.1:8000")
    _check_importance_sampling(config)
    if config.vllm_structured_outputs_regex is not None:
        raise fail(
            "vllm_structured_outputs_regex", config.vllm_structured_outputs_regex, "not supported yet: remove it"
        )


def _check_importance_sampling(config: VLLMFields) -> None:
    """The ``vllm_importance_sampling_*`` fields (TRL's rules: bounds ordered, a truncate mode needs one)."""
    mode, low, high = (
        config.vllm_importance_sampling_mode,
        config.vllm_importance_sampling_clip_min,
        config.vllm_importance_sampling_clip_max,
    )
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise fail("vllm_importance_sampling_mode", mode, f"choose one of {list(IMPORTANCE_SAMPLING_MODES)}")
    if high is not None and not high > 0:
        raise fail("vllm_importance_sampling_clip_max", high, "give an upper bound > 0, or None for none")
    if low is not None and not low >= 0:
        raise fail("vllm_importance_sampling_clip_min", low, "give a lower bound >= 0, or None for none")
    if low is not None and high is not None and not low < high:
        raise fail("vllm_importance_sampling_clip_min", low, f"must be below vllm_importance_sampling_clip_max={high}")
    if config.vllm_importance_sampling_correction and mode.endswith("truncate") and low is None and high is None:
        raise fail(
            "vllm_importance_sampling_clip_max", high, f"{mode} needs a bound: set clip_max (TRL: 3.0) or clip_min"
        )


def server_url(config: VLLMFields) -> str:
    """The vLLM server's base URL: ``vllm_server_base_url``, else ``http://host:port``."""
    return config.vllm_server_base_url or f"http://{config.vllm_server_host}:{config.vllm_server_port}"
