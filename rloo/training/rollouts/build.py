"""The run's rollout source, built from its config: synchronous, pipelined (``max_staleness`` >= 1), sampled by
worker processes (``rollout_workers`` >= 1), and wrapped in dynamic sampling (``dynamic_sampling``).

The factory lives apart from the sources so that :mod:`rloo.training.rollouts.source` (the protocol and the
in-process sources) knows none of its subclasses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from rloo.config.fields.rollouts import available_worker_devices
from rloo.data.images import is_processor
from rloo.training.parallel.distributed import Ranks
from rloo.training.rollouts.dynamic_sampling import DynamicSampling, task_signal
from rloo.training.rollouts.source import PipelinedRollouts, RolloutSource, SynchronousRollouts
from rloo.training.rollouts.workers import WorkerRollouts
from rloo.training.setup.models import resolve_mixed_precision


def rollout_source(
    args: Any,
    ranks: Ranks,
    policy: Callable[[], nn.Module],
    worker: tuple[Any, Any],
    *,
    reward_weights: Tensor,
    **source: Any,
) -> RolloutSource:
    """The run's rollout source: :class:`PipelinedRollouts` with ``max_staleness`` >= 1 (:class:`WorkerRollouts`
    with ``rollout_workers`` >= 1: ``worker`` is the processing class and rollout settings it needs), else
    synchronous; each batch of ``prompts_per_generation`` prompts per process. With ``dynamic_sampling``,
    wrapped in :class:`rloo.training.rollouts.dynamic_sampling.DynamicSampling` (``reward_weights``: the
    reward functions', which say which groups have a signal)."""
    drawn = _batches(args, ranks, policy, worker, prompts_per_batch=args.prompts_per_generation, **source)
    if not args.dynamic_sampling:
        return drawn
    processing_class = worker[0]
    tokenizer = processing_class.tokenizer if is_processor(processing_class) else processing_class
    signal = task_signal(args, reward_weights)
    return DynamicSampling(
        drawn, signal=signal, max_rounds=args.max_num_gen_batches, pad_token_id=tokenizer.pad_token_id
    )


def _batches(
    args: Any, ranks: Ranks, policy: Callable[[], nn.Module], worker: tuple[Any, Any], **source: Any
) -> SynchronousRollouts:
    if args.max_staleness == 0:
        return SynchronousRollouts(ranks=ranks, **source)
    if ranks.lockstep:
        raise ValueError(
            f"RLOOConfig.max_staleness={args.max_staleness} with FSDP2-sharded training is not built yet (the "
            "stale sampling copy would be a second sharded model); train data-parallel, or with max_staleness=0"
        )
    if args.rollout_workers:
        processing_class, settings = worker
        if args.rollout_workers > 1 and is_processor(processing_class):
            raise ValueError(
                f"RLOOConfig.rollout_workers={args.rollout_workers} with a vision-language policy is not built yet "
                "(sampling image prompts in several workers is untested); use rollout_workers=1"
            )
        if settings.custom is not None or (settings.agent is not None and settings.agent.environments is not None):
            raise ValueError(
                f"RLOOConfig.rollout_workers={args.rollout_workers} with a rollout_func or an environment_factory is "
                "not built yet (the workers would need them in their processes); use rollout_workers=0"
            )
        return WorkerRollouts(
            ranks=ranks,
            policy=policy,
            staleness=args.max_staleness,
            processing_class=processing_class,
            settings=settings,
            seed=args.seed,
            workers=args.rollout_workers,
            devices=available_worker_devices(args.rollout_worker_devices),
            stale_after=args.heartbeat_stale_after_s,
            free=args.free_running,
            mixed_precision=resolve_mixed_precision(args.bf16) != "no",  # bf16=None: bf16 where the GPU has it
            sync_every=args.weight_sync_steps,
            **source,
        )
    return PipelinedRollouts(
        ranks=ranks, policy=policy, staleness=args.max_staleness, sync_every=args.weight_sync_steps, **source
    )
