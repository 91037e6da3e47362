"""The order prompts are drawn in: deterministic, resumable row sources.

Where we depart from TRL: prompt order comes from :class:`PromptSampler` (map-style datasets)
or :class:`StreamedRows` (streaming ones), whose state (epoch, position) goes into checkpoints,
instead of a ``DataLoader`` with a repeat sampler.
"""

from __future__ import annotations

from collections.abc import Iterator
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


class IndexedRows:
    """Rows of a map-style dataset in :class:`PromptSampler`'s order (its state is this one's)."""

    def __init__(self, dataset: Any, seed: int, shuffle: bool = True) -> None:
        self.dataset = dataset
        self.sampler = PromptSampler(len(dataset), seed, shuffle)

    @property
    def epochs_completed_float(self) -> float:
        return self.sampler.epochs_completed_float

    def next_rows(self, n: int) -> list[dict[str, Any]]:
        """The next ``n`` rows (dicts of every column), crossing into the next epoch as needed."""
        return [self.dataset[i] for i in self.sampler.next_indices(n)]

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("streaming"):
            raise ValueError(
                "the checkpoint was saved training on a streaming dataset; resume with the same (streaming) dataset"
            )
        self.sampler.load_state_dict(state)


class StreamedRows:
    """Rows of a streaming ``datasets.IterableDataset``, read in order and restarted at its end.

    With ``shuffle``, epoch ``e`` reads ``dataset.shuffle(seed, buffer_size)`` after
    ``set_epoch(e)`` (datasets' buffered shuffle: the order depends only on seed and epoch), so
    resuming needs ``(epoch, position)``: the stream is re-read and ``position`` rows are skipped.
    Each row's prompt is checked when it is drawn (a stream cannot be checked up front); the
    error names its position in the stream.
    """

    def __init__(self, dataset: Any, seed: int, shuffle: bool = True, buffer_size: int = 1000) -> None:
        self.seed, self.shuffle = seed, shuffle
        self.dataset = dataset.shuffle(seed=seed, buffer_size=buffer_size) if shuffle else dataset
        self._epoch, self._position = 0, 0
        self._first: tuple[int, bool] | None = None  # the first row drawn and whether it is text: all must match
        self._rows = self._epoch_rows(0)

    @property
    def epochs_completed_float(self) -> float:
        """Completed epochs (a stream's length is unknown, so no fraction)."""
        return float(self._epoch)

    def _epoch_rows(self, epoch: int, skip: int = 0) -> Iterator[dict[str, Any]]:
        if self.shuffle:
            self.dataset.set_epoch(epoch)
        rows: Iterator[dict[str, Any]] = iter(self.dataset)
        for _ in range(skip):
            next(rows)
        return rows

    def next_rows(self, n: int) -> list[dict[str, Any]]:
        from rloo.data.prompt_checks import PROMPT_COLUMN, mixed_prompts_error, prompt_problem

        out: list[dict[str, Any]] = []
        while len(out) < n:
            row = next(self._rows, None)
            if row is None:
                if self._position == 0:
                    raise ValueError("the streaming train_dataset yielded no rows")
                self._epoch, self._position = self._epoch + 1, 0
                self._rows = self._epoch_rows(self._epoch)
                continue
            problem = prompt_problem(row.get(PROMPT_COLUMN)) if PROMPT_COLUMN in row else "it has no `prompt` column"
            if problem is not None:
                raise ValueError(f"invalid prompt in row {self._position} of the streaming train_dataset: {problem}")
            is_text = isinstance(row[PROMPT_COLUMN], str)
            if self._first is None:
                self._first = (self._position, is_text)
            elif is_text != self._first[1]:
                where = "the `prompt` column of the streaming train_dataset"
                raise mixed_prompts_error(self._first[1], self._position, where, first_row=self._first[0])
            self._position += 1
            out.append(row)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "streaming": True,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "epoch": self._epoch,
            "position": self._position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where the saved stream stopped; the dataset, seed and shuffle setting must match."""
        for key in ("streaming", "seed", "shuffle"):
            if state.get(key) != getattr(self, key, True):
                raise ValueError(
                    f"sampler state was saved with {key}={state.get(key)!r} but this run has "
                    f"{key}={getattr(self, key, True)!r}; resume with the same dataset, seed and shuffle setting"
                )
        self._epoch, self._position = int(state["epoch"]), int(state["position"])
        self._rows = self._epoch_rows(self._epoch, skip=self._position)


def row_source(dataset: Any, seed: int, shuffle: bool = True) -> IndexedRows | StreamedRows:
    """The prompt order of a train dataset: indexed for a map-style one, streamed for an iterable one."""
    import datasets

    if isinstance(dataset, datasets.IterableDataset):
        return StreamedRows(dataset, seed, shuffle)
    return IndexedRows(dataset, seed, shuffle)
