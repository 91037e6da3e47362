"""The ``RLOOConfig`` fields TRL and transformers scripts set that are about the run's plumbing
rather than the algorithm: sharing on the hub, ``torch.compile``, activation offloading, the sampler's
speed settings, and data-loader settings rloo accepts only where they describe what it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rloo.config.errors import fail
from rloo.config.field_types import KeywordMapping
from rloo.config.fields.declare import option
from rloo.suggest import did_you_mean

if TYPE_CHECKING:
    from rloo.config.rloo_config import RLOOConfig

COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# accelerate's data-loader settings, each with the value that describes what rloo does (it uses no
# accelerate data loader and accumulates gradients itself)
ACCELERATOR_CONFIG: dict[str, Any] = {
    "split_batches": False,
    "dispatch_batches": None,
    "even_batches": True,
    "use_seedable_sampler": True,
    "non_blocking": False,
    "gradient_accumulation_kwargs": None,
    "use_configured_state": False,
}


@dataclass
class PlumbingFields:
    """Hub, compilation, activation offloading and data-loader fields of ``RLOOConfig``, with their documentation."""

    dataloader_num_workers: int = option(
        0,
        "Accepted for TRL scripts, and only 0: rloo reads prompts by index in the training process (no DataLoader).",
        trl="dataloader_num_workers",
    )
    cache_implementation: str | None = option(
        None,
        "Accepted for TRL scripts: None or dynamic. rloo's sampler keeps its own preallocated KV cache.",
        trl="cache_implementation",
    )
    accelerator_config: KeywordMapping | None = option(
        None,
        "transformers' AcceleratorConfig, for TRL scripts: only values that match what rloo does are accepted "
        "(it uses no accelerate data loader: every process draws the same prompt order and keeps its share).",
        trl="accelerator_config",
    )
    torch_compile: bool = option(
        False,
        "Run the training passes with the model's decoder layers compiled (torch.compile of each layer, "
        "dynamic=True; the LM head stays rloo's chunked or fused one, and sampling, the reference and the no-grad "
        "passes run eagerly); the first steps pay the compilation. Set by torch_compile_backend or _mode too.",
        trl="torch_compile",
    )
    torch_compile_backend: str | None = option(
        None, "torch.compile backend (None = inductor); setting it turns torch_compile on.", trl="torch_compile_backend"
    )
    torch_compile_mode: str | None = option(
        None,
        "torch.compile mode: default, reduce-overhead, max-autotune or max-autotune-no-cudagraphs; setting it "
        "turns torch_compile on.",
        trl="torch_compile_mode",
    )
    activation_offloading: bool = option(
        False,
        "Training passes keep what their forward saves for the backward in CPU memory (pinned) until the backward "
        "needs it: less GPU memory, slower (each tensor crosses PCIe twice). Parameters stay on the GPU; no effect "
        "on a CPU (warned).",
        trl="activation_offloading",
    )
    sampler_compaction: float | None = option(
        0.25,  # rloo.generation.decoding.COMPACT_AT (tests/generation/test_decoding.py checks they agree)
        "On by default: finished rows leave the sampler's decode batch once they are this fraction of it, so "
        "they stop paying for decoding steps (attention over their cache, the MLPs, the LM head) while the "
        "longest completions finish: less sampling work when completion lengths vary (1.80x faster sampling in "
        "BENCHMARKS.md's fast-path run). Exact up to float rounding: a row decoded in a smaller batch can differ "
        "in the last bits, which can flip a rare sampled token, so runs are not bit-comparable with compaction "
        "off, or across process counts; to compare such runs, set it to null (None = off). In (0, 1].",
        trl=None,
    )
    sampler_cuda_graphs: bool | None = option(
        None,
        "rloo's sampler decodes with a static-shape step launched as one CUDA graph per batch-size bucket "
        "(rloo.generation.graph_decode), and under bf16 mixed precision samples through a bf16 copy of the policy, "
        "refreshed from it before every rollout (memory: the weights in bf16 once more, and the static cache, both "
        "kept between rollouts). True: for the rollouts it supports (Llama, Mistral, Qwen2, Qwen3 with full "
        "attention; per-completion seeds or greedy; no stop strings, images or FSDP), the eager loop for the rest; "
        "on a CPU the same step runs eagerly. None (default): rloo's choice, the eager loop until a GPU run has "
        "checked the captured step against it (not yet: BENCHMARKS.md); False: always the eager loop. The same "
        "distribution as the eager loop, not bit-comparable with it.",
        trl=None,
    )
    push_to_hub: bool = option(
        False,
        "At the end of training, upload the final model with a model card to hub_model_id (or trainer.push_to_hub()); "
        "the token comes from HF_TOKEN or `hf auth login`, never from config.yaml.",
        trl="push_to_hub",
    )
    hub_model_id: str | None = option(
        None, "The hub repo to push to, e.g. user/name; None = output_dir's folder name.", trl="hub_model_id"
    )
    hub_private_repo: bool | None = option(
        None, "Create the hub repo private (None: the hub's default).", trl="hub_private_repo"
    )
    resume_from_checkpoint: str | None = option(
        None,
        "A checkpoint folder to resume from, as transformers' field: scripts pass it on, "
        "trainer.train(resume_from_checkpoint=args.resume_from_checkpoint) (the trainer does not read it itself); "
        "rloo train resumes from it as from --resume-from.",
        trl="resume_from_checkpoint",
    )


def check_plumbing(config: RLOOConfig) -> None:
    """The compile mode (the backend is checked against torch's list when the trainer compiles: torch is not
    imported here), and TRL fields accepted only where they describe what rloo does."""
    if config.torch_compile_mode is not None and config.torch_compile_mode not in COMPILE_MODES:
        raise fail("torch_compile_mode", config.torch_compile_mode, f"choose one of {list(COMPILE_MODES)} or None")
    if config.dataloader_num_workers != 0:
        raise fail(
            "dataloader_num_workers",
            config.dataloader_num_workers,
            "only 0: rloo reads prompts by index in the training process, with no DataLoader to give workers",
        )
    if config.cache_implementation not in (None, "dynamic"):
        raise fail(
            "cache_implementation",
            config.cache_implementation,
            "only None or 'dynamic': rloo's sampler keeps its own preallocated KV cache",
        )
    if config.sampler_compaction is not None and not 0 < config.sampler_compaction <= 1:
        raise fail("sampler_compaction", config.sampler_compaction, "must be in (0, 1] (e.g. 0.25), or None for off")
    _check_accelerator_config(config)


def _check_accelerator_config(config: RLOOConfig) -> None:
    for key, value in (config.accelerator_config or {}).items():
        if key not in ACCELERATOR_CONFIG:
            raise fail(
                "accelerator_config",
                dict(config.accelerator_config or {}),
                f"unknown key {key!r}{did_you_mean(key, list(ACCELERATOR_CONFIG))}",
            )
        if value != ACCELERATOR_CONFIG[key] and not (key == "dispatch_batches" and value is False):
            raise fail(
                "accelerator_config",
                dict(config.accelerator_config or {}),
                f"{key}={value!r} has nothing to act on: rloo uses no accelerate data loader (every process draws "
                f"the same prompt order and keeps its share) and accumulates gradients itself; drop {key}",
            )
