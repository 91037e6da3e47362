"""Dynamic sampling (``dynamic_sampling``): batches of groups with a learning signal, refilled round by round.

:class:`DynamicSampling` wraps the run's rollout source. For each batch of ``G = prompts_per_generation x
world_size`` groups it asks the source for generation rounds, each an ordinary batch (the next G prompts of
the prompt order, every process its share, seeded by group id), until G groups whose task rewards differ are
found or ``max_num_gen_batches`` rounds ran (:func:`rloo.algo.dynamic_sampling.needs_another_round`), then
trains on :func:`rloo.algo.dynamic_sampling.select_groups`' choice: the first G groups with a signal in draw
order, completed with the earliest groups without one when the rounds found too few (warned, counted).

- **Which groups**: those whose task rewards (:func:`rloo.pipeline.task_rewards`: the weighted,
  clipped rewards before any KL penalty; verl's ``metric="score"``) differ among their scorable completions.
- **Processes**: every process's flags are gathered after each round, so all agree on the rounds and the
  choice, which is made over global group ids as one process would make it. Slot j of the batch belongs to
  process ``j // prompts_per_generation``; a group sampled on another process is sent there (on the CPU,
  with ``all_gather_object``), so N processes train exactly what one process trains.
- **Counting**: the prompt order, ``num_groups_seen``, the epoch, ``num_tokens`` and the
  ``dynamic_sampling/*`` metrics count every generated group; the batch's own metrics (``reward``,
  ``frac_reward_zero_std``, lengths) are of what it trains. Surplus groups with a signal are dropped, as verl
  drops them: the next batch samples afresh with the updated policy.
- **Resume**: rounds run within one generation batch and checkpoints fall between batches, where the prompt
  order and ``num_groups_seen`` are saved, so a resumed run draws what the uninterrupted one draws.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from rloo.algo.advantages import groups_with_signal
from rloo.algo.dynamic_sampling import needs_another_round, select_groups
from rloo.pipeline import ScoredRollout, task_rewards
from rloo.report import metric_names as names
from rloo.training.rollouts.groups import join, take_groups, to_device, with_totals
from rloo.training.rollouts.source import SynchronousRollouts


@dataclass(frozen=True)
class RoundSummary:
    """What every process needs of one process's round: each group's signal, in its order; and the sums
    behind the generated metrics (scorable rewards, their count)."""

    signal: list[bool]
    reward_sum: float
    scorable: int


class DynamicSampling:
    """A rollout source whose batches hold groups with a signal, drawn from ``source`` over several rounds.

    ``signal(scored)``: ``(P,)`` bool, whether each group of a round (in its order) has a learning signal;
    ``max_rounds``: ``max_num_gen_batches``; ``pad_token_id``: pads a batch joined from several rounds."""

    def __init__(
        self,
        source: SynchronousRollouts,
        *,
        signal: Callable[[ScoredRollout], Tensor],
        max_rounds: int,
        pad_token_id: int,
    ) -> None:
        self.source, self.ranks = source, source.ranks
        self.signal, self.max_rounds, self.pad_token_id = signal, max_rounds, pad_token_id

    @property
    def groups_drawn(self) -> int:
        return self.source.groups_drawn

    @groups_drawn.setter
    def groups_drawn(self, value: int) -> None:
        self.source.groups_drawn = value

    def next_batch(self) -> ScoredRollout:
        """Rounds from the source until the batch is full of groups with a signal (or the round limit), then this
        process's share of the chosen groups."""
        target = self.source.prompts_per_batch * self.ranks.world_size
        rounds: list[ScoredRollout] = []
        summaries: list[RoundSummary] = []  # every process's, round after round: global group order
        while needs_another_round(sum(sum(s.signal) for s in summaries), target, len(rounds), self.max_rounds):
            scored = self.source.next_batch()
            rounds.append(scored)
            summaries += self.ranks.gather_objects(self.summary(scored))
        signal = torch.tensor([flag for s in summaries for flag in s.signal], dtype=torch.bool)
        chosen = select_groups(signal, target).tolist()
        batch = with_totals(join(self.share(rounds, chosen), self.pad_token_id), rounds)
        k = len(rounds[0].completion_texts) // len(rounds[0].prompts)
        metrics = generated_metrics(summaries, len(rounds), target, k)
        return replace(batch, sampling_metrics=metrics, generated_tokens=sum(r.rollout.num_tokens for r in rounds))

    def summary(self, scored: ScoredRollout) -> RoundSummary:
        flags = self.signal(scored).cpu()
        if flags.numel() != len(scored.prompts):
            raise RuntimeError(f"{flags.numel()} signal flags for {len(scored.prompts)} groups")
        rewards = scored.rewards
        scorable = rewards.scorable
        return RoundSummary(flags.tolist(), float(rewards.rewards[scorable].double().sum()), int(scorable.sum()))

    def share(self, rounds: list[ScoredRollout], chosen: list[int]) -> list[ScoredRollout]:
        """This process's slots of the batch, one group each, in slot order: ``chosen[j]`` is the global position
        (round x G + group) of slot j's group; a group sampled on another process comes from it."""
        per_process, rank = self.source.prompts_per_batch, self.ranks.rank
        target = per_process * self.ranks.world_size
        mine: dict[int, ScoredRollout] = {}
        outgoing: list[tuple[int, ScoredRollout]] = []
        for slot, position in enumerate(chosen):
            round_index, group = divmod(position, target)
            sampled_by, local = divmod(group, per_process)
            owner = slot // per_process
            if sampled_by != rank:
                continue
            piece = take_groups(rounds[round_index], [local])
            if owner == rank:
                mine[slot] = piece
            else:
                outgoing.append((slot, to_device(piece, torch.device("cpu"))))
        if self.ranks.distributed:  # every process sends what the others own, once per batch
            device = rounds[0].rollout.completion_ids.device
            for sent in self.ranks.gather_objects(outgoing):
                mine.update({slot: to_device(piece, device) for slot, piece in sent if slot // per_process == rank})
        return [mine[slot] for slot in range(rank * per_process, (rank + 1) * per_process)]

    def policy_updated(self, version: int) -> None:
        self.source.policy_updated(version)

    def state(self) -> dict[str, Any]:
        """The source's: rounds never outlive a batch, and the prompt order is the trainer's."""
        return self.source.state()

    def restore(self, state: dict[str, Any]) -> None:
        self.source.restore(state)

    def close(self) -> None:
        self.source.close()

    def metrics(self) -> dict[str, float]:
        """The source's own (a worker's waits; the generated metrics travel with the batch)."""
        return self.source.metrics()


def generated_metrics(summaries: list[RoundSummary], rounds: int, target: int, k: int) -> dict[str, float]:
    """The ``dynamic_sampling/*`` metrics of one batch from every process's round summaries (the same on
    every process): rounds, completions generated, groups trained with and without a signal, and the
    mean reward and share of groups without a signal of everything generated."""
    flags = [flag for s in summaries for flag in s.signal]
    kept = min(sum(flags), target)
    scorable = sum(s.scorable for s in summaries)
    return {
        names.GEN_BATCHES: float(rounds),
        names.GENERATED_COMPLETIONS: float(len(flags) * k),
        names.KEPT_GROUPS: float(kept),
        names.FILLED_GROUPS: float(target - kept),
        names.GENERATED_REWARD: sum(s.reward_sum for s in summaries) / scorable if scorable else float("nan"),
        names.GENERATED_ZERO_STD: 1.0 - sum(flags) / len(flags),
    }


def task_signal(args: Any, reward_weights: Tensor) -> Callable[[ScoredRollout], Tensor]:
    """Whether each group of a batch has a learning signal: its task rewards
    (:func:`rloo.pipeline.task_rewards`) differ among its scorable completions."""

    def signal(scored: ScoredRollout) -> Tensor:
        rewards = task_rewards(scored, args, reward_weights)
        return groups_with_signal(rewards, scored.rollout.group_ids, scored.rewards.scorable)

    return signal
