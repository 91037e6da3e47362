"""The order prompts are drawn in: a deterministic, resumable sampler.

Where we depart from TRL: prompt order comes from :class:`PromptSampler`, whose state
(epoch, position) goes into checkpoints, instead of a ``DataLoader`` with a repeat sampler.
"""

from __future__ import annotations

from typing import Any

import torch


class PromptSampler:
    """A deterministic, resumable stream of dataset row indices.

    Epoch ``e`` visits the rows in the order ``torch.randperm(num_rows)`` drawn from a
    generator seeded with ``seed + e`` (``arange`` without shuffling), so the order depends
    only on ``(seed, epoch)`` and resuming needs just ``(epoch, position)``. A batch may span
    the end of one epoch and the start of the next.
    """

    def __init__(self, num_rows: int, seed: int, shuffle: bool = True) -> None:
        if num_rows < 1:
            raise ValueError(f"num_rows must be >= 1, got {num_rows}")
        self.num_rows = num_rows
        self.seed = seed
        self.shuffle = shuffle
        self._epoch = 0
        self._position = 0
        self._order = self._epoch_order(0)

    @property
    def epoch(self) -> int:
        """Completed epochs."""
        return self._epoch

    @property
    def position(self) -> int:
        """Rows already drawn in the current epoch."""
        return self._position

    @property
    def epochs_completed_float(self) -> float:
        """``epoch + position / num_rows``."""
        return self._epoch + self._position / self.num_rows

    def _epoch_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_rows))
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_rows, generator=generator).tolist()

    def next_indices(self, n: int) -> list[int]:
        """The next ``n`` row indices, moving into the next epoch when this one runs out."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        out: list[int] = []
        while len(out) < n:
            take = min(n - len(out), self.num_rows - self._position)
            out.extend(self._order[self._position : self._position + take])
            self._position += take
            if self._position == self.num_rows:
                self._epoch += 1
                self._position = 0
                self._order = self._epoch_order(self._epoch)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "num_rows": self.num_rows,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "epoch": self._epoch,
            "position": self._position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the saved sampler stopped; the dataset and seed must match."""
        for key in ("num_rows", "seed", "shuffle"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state was saved with {key}={state[key]!r} but this sampler has "
                    f"{key}={getattr(self, key)!r}; resume with the same dataset, seed and shuffle setting"
                )
        if not 0 <= state["position"] < self.num_rows or state["epoch"] < 0:
            raise ValueError(f"invalid sampler state: epoch={state['epoch']}, position={state['position']}")
        self._epoch = int(state["epoch"])
        self._position = int(state["position"])
        self._order = self._epoch_order(self._epoch)
