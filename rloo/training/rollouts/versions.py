"""Which policy weights sample which batch: the version rule every rollout source keeps.

A batch carries the version of the weights that sampled it (the number of optimizer steps taken before
sampling). With ``max_staleness`` = s and ``weight_sync_steps`` = n, the batch trained at step t is sampled by
the last synced weights at least s steps old (:func:`sampling_version`); ``free_running`` allows any version from
that one to t (:func:`version_allowed`). The trainer checks every batch against the rule
(:func:`check_policy_version`).
"""

from __future__ import annotations

from torch import Tensor, nn

from rloo.pipeline import ScoredRollout


def trainable_weights(model: nn.Module) -> dict[str, Tensor]:
    """``model``'s trainable parameters, copied to the CPU."""
    return {name: p.detach().to("cpu", copy=True) for name, p in model.named_parameters() if p.requires_grad}


def sampling_version(step: int, staleness: int, sync_every: int = 1) -> int:
    """The weights that sample the batch trained at ``step``: the last synced ones (every ``sync_every`` =
    ``weight_sync_steps`` optimizer steps) at least ``staleness`` = ``max_staleness`` steps old,
    ``n x floor(max(0, step - s) / n)``; so a batch is between s and s + n - 1 steps stale (0 and 0 at s = 0,
    n = 1: the synchronous loop)."""
    return sync_every * (max(0, step - staleness) // sync_every)


def version_allowed(version: int | None, step: int, staleness: int, sync_every: int = 1, free: bool = False) -> bool:
    """Whether the batch trained at ``step`` may have been sampled by ``version``: exactly the one of
    :func:`sampling_version` (``max_staleness`` 0: the policy being trained), or with ``free`` (``free_running``)
    any from that one to ``step``."""
    expected = sampling_version(step, staleness, sync_every)
    return version == expected or (free and version is not None and expected <= version <= step)


def check_policy_version(
    scored: ScoredRollout, step: int, staleness: int = 0, sync_every: int = 1, free: bool = False
) -> None:
    """A batch trained at ``step`` must have been sampled by a version :func:`version_allowed`: anything else is a
    weight update the sampler missed."""
    expected = sampling_version(step, staleness, sync_every)
    if not version_allowed(scored.policy_version, step, staleness, sync_every, free):
        raise RuntimeError(
            f"the rollouts trained at step {step} were sampled by the policy of step {scored.policy_version}, not "
            f"{expected} (max_staleness={staleness}, weight_sync_steps={sync_every}): the rollout source missed a "
            "weight update (RolloutSource.policy_updated)"
        )
