"""How generation batches are drawn: asynchronous generation (``max_staleness``, ``weight_sync_steps``,
``rollout_workers``; :mod:`rloo.training.rollouts.source`, :mod:`rloo.training.rollouts.workers`) and dynamic
sampling (DAPO's; verl's ``algorithm.filter_groups``; TRL has none: train on groups whose rewards differ,
drawing more prompts until a batch is full of them; :mod:`rloo.training.rollouts.dynamic_sampling`).

What these cannot be combined with in other groups (vLLM, several optimizer steps per batch, an estimator
without a group baseline) is checked by :func:`rloo.config.validation.check_combinations`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from rloo.config.errors import fail
from rloo.config.field_types import NameList
from rloo.config.fields.declare import option

if TYPE_CHECKING:
    from rloo.config.rloo_config import RLOOConfig


@dataclass
class RolloutFields:
    """Asynchronous-generation and dynamic-sampling fields of ``RLOOConfig``, with their documentation."""

    max_staleness: int = option(
        0,
        "Sample each generation batch with the weights of this many optimizer steps before the ones it trains "
        "(an asynchronous pipeline's depth), >= 0; 0: the current weights (the synchronous loop). The lag is "
        "corrected with the vllm_importance_sampling_* weights.",
        trl="max_staleness",
    )
    weight_sync_steps: int = option(
        1,
        "With max_staleness >= 1: the sampling weights are updated every this many optimizer steps, >= 1; a batch "
        "samples with the last ones at least max_staleness steps old (so up to max_staleness + n - 1).",
        trl="weight_sync_steps",
    )
    rollout_workers: int = option(
        0,
        "With max_staleness >= 1: worker processes, each with its own copy of the policy, sample shares of each "
        "batch, overlapping the trainer's steps (the same batches as 0, in this process); >= 0.",
        trl=None,
    )
    free_running: bool = option(
        False,
        "With rollout_workers: a worker samples each batch with the newest weights it has when it starts it (still "
        "at most max_staleness + weight_sync_steps - 1 steps old) instead of exactly those of step t - "
        "max_staleness: less lag when generation is the bottleneck, but a run is no longer reproducible (which "
        "version samples which batch depends on timing).",
        trl=None,
    )
    heartbeat_stale_after_s: float = option(
        300.0,
        "With rollout_workers: seconds since a worker's last sign of life (it beats at every decoded token and "
        "every second it waits) after which the trainer treats it as hung, kills it and starts a new one that "
        "samples the same batches (a restart, of at most 3 a run); > 0.",
        trl="heartbeat_stale_after_s",
    )
    rollout_worker_devices: NameList = option(
        (),
        "With rollout_workers: the device each worker samples on, one per worker (cpu, cuda, cuda:1, ...); "
        "empty: the policy's. The weights go to a worker over torch.distributed: NCCL when it and the trainer are "
        "on two different GPUs, else gloo.",
        trl=None,
    )
    dynamic_sampling: bool = option(
        False,
        "Train only on groups whose task rewards differ (DAPO's dynamic sampling, verl's filter_groups.enable): "
        "a group whose K rewards are all equal has zero advantages, so it is dropped and more prompts are drawn, "
        "round after round, until the batch is full of groups with a signal. Needs a group baseline "
        "(advantage_estimator rloo, grpo, group_mean or reinforce_pp_baseline).",
        trl=None,
    )
    max_num_gen_batches: int = option(
        10,
        "With dynamic_sampling: generation rounds per batch, >= 1 (verl's filter_groups.max_num_gen_batches; "
        "no unbounded 0). When that many rounds found too few groups with a signal, the batch is completed with "
        "the earliest groups without one (a warning; dynamic_sampling/filled_groups counts them).",
        trl=None,
    )


def check_rollouts(config: RLOOConfig) -> None:
    """Staleness, weight syncs, the workers and their devices, dynamic sampling (``ValueError`` naming the field)."""
    _check_staleness(config)
    _check_worker_devices(config)
    if config.free_running and not config.rollout_workers:
        raise fail(
            "free_running",
            True,
            "workers run free of the trainer: set rollout_workers >= 1 (and max_staleness >= 1); the trainer's own "
            "process always samples the batch of step t with the weights of t - max_staleness",
        )
    stale = config.heartbeat_stale_after_s
    if isinstance(stale, bool) or not isinstance(stale, (int, float)) or stale <= 0:  # NaN, inf: checked before
        raise fail("heartbeat_stale_after_s", stale, "give the seconds without a sign of life that mean hung, > 0")

    if config.max_num_gen_batches < 1:
        raise fail(
            "max_num_gen_batches",
            config.max_num_gen_batches,
            "give the most generation rounds a batch may take, >= 1 (1: no refill, only the batch drawn)",
        )
    if config.dynamic_sampling and config.rollout_workers:
        raise fail(
            "dynamic_sampling",
            True,
            f"not built yet together with rollout_workers={config.rollout_workers} (workers sample one batch per "
            "step, ahead of the trainer; refill rounds would need more); use rollout_workers=0",
        )


def _check_staleness(config: RLOOConfig) -> None:
    """Sampling with older weights (``max_staleness``), how often they are synced, and the worker count."""
    if config.max_staleness < 0:
        raise fail("max_staleness", config.max_staleness, "must be >= 0 optimizer steps (0: the synchronous loop)")
    if isinstance(config.weight_sync_steps, bool) or not isinstance(config.weight_sync_steps, int):
        raise fail("weight_sync_steps", config.weight_sync_steps, "an integer >= 1 (optimizer steps between syncs)")
    if config.weight_sync_steps < 1:
        raise fail("weight_sync_steps", config.weight_sync_steps, "must be >= 1 optimizer steps between weight syncs")
    if config.weight_sync_steps > 1 and config.max_staleness < 1:
        raise fail(
            "weight_sync_steps",
            config.weight_sync_steps,
            "syncs an asynchronous pipeline's weights: set max_staleness >= 1 too (0 samples with the current ones)",
        )
    if isinstance(config.rollout_workers, bool) or not isinstance(config.rollout_workers, int):
        raise fail("rollout_workers", config.rollout_workers, "an integer: 0 (sample in the trainer's process) or more")
    if config.rollout_workers < 0:
        raise fail("rollout_workers", config.rollout_workers, ">= 0 (0: sample in the trainer's process)")
    if config.rollout_workers and config.max_staleness < 1:
        raise fail(
            "rollout_workers", config.rollout_workers, "workers sample ahead of the trainer: set max_staleness >= 1 too"
        )


def _check_worker_devices(config: RLOOConfig) -> None:
    """``rollout_worker_devices``: empty, or one CPU or CUDA device per worker (whether this machine has them is
    checked when training starts: :func:`available_worker_devices`)."""
    devices = config.rollout_worker_devices
    if not devices:
        return
    if len(devices) != config.rollout_workers:
        raise fail(
            "rollout_worker_devices",
            list(devices),
            f"give one device per worker: rollout_workers={config.rollout_workers} (or leave it empty: the policy's)",
        )
    for device in devices:
        try:
            kind = torch.device(device).type
        except (RuntimeError, TypeError):
            kind = None
        if kind not in ("cpu", "cuda"):
            raise fail("rollout_worker_devices", list(devices), f"{device!r} is not a device: use cpu, cuda or cuda:N")


def available_worker_devices(devices: Any) -> list[str] | None:
    """``rollout_worker_devices`` as strings, None when empty; a ``ValueError`` naming a CUDA device this machine
    does not have."""
    if not devices:
        return None
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for device in devices:
        parsed = torch.device(device)
        if parsed.type == "cuda" and (parsed.index or 0) >= have:
            raise ValueError(
                f"RLOOConfig.rollout_worker_devices names {device!r}, but this machine has {have} CUDA device(s): "
                "name one it has, or cpu"
            )
    return [str(device) for device in devices]


def staleness_caution(max_staleness: int, clip_ratio: bool) -> str | None:
    """A warning for asynchronous sampling (``max_staleness`` >= 1) with an unclipped ratio, else None: the
    lagged batches' ratios then move the policy without bound (tinker-cookbook#822: an unclipped loss
    collapsed at staleness 3 where a clipped one held; docs/async-and-dynamic-sampling.md)."""
    if max_staleness < 1 or clip_ratio:
        return None
    return (
        f"max_staleness={max_staleness} with clip_ratio=False: batches sampled by older weights train with an "
        "unclipped importance ratio, which has collapsed runs at a staleness of 3 (tinker-cookbook#822); set "
        "clip_ratio: true (epsilon bounds each step's move) or max_staleness: 0"
    )
