"""Prompts in: load and validate a prompt dataset, render, tokenize and sample prompts.

A prompt dataset has a ``prompt`` column holding either plain text or a conversation (a
list of ``{"role": str, "content": str}`` messages, rendered with the tokenizer's chat
template). Every other column is passed, by name, to the reward functions.

Where we depart from TRL:

- Every row is validated up front, so a bad row fails at start-up with its index rather
  than mid-run.
- ``max_prompt_length`` exists (TRL has none): long prompts are truncated from the left,
  keeping their end (the question and the generation prompt), and the count is reported.
- Prompt order comes from :class:`PromptSampler`, a resumable sampler whose state goes into
  checkpoints, instead of a ``DataLoader`` with a repeat sampler.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import datasets
import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PROMPT_COLUMN = "prompt"
ACCEPTED_DATA = (
    "a datasets.Dataset, a datasets.DatasetDict, a list of dicts, or a path to a .json, .jsonl or "
    ".parquet file or to a folder written by Dataset.save_to_disk"
)
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


# ---------------------------------------------------------------------------- loading


def load_prompt_dataset(data: Any, split: str = "train") -> datasets.Dataset:
    """Load prompts from any accepted source and check that every row is usable.

    Args:
        data: a ``Dataset``; a ``DatasetDict`` (``split`` is taken); a list of dicts; or a
            path (``str`` / ``PathLike``) to a ``.json``, ``.jsonl`` or ``.parquet`` file, or to
            a folder written by ``save_to_disk`` (holding a ``Dataset`` or a ``DatasetDict``).
        split: the split taken from a ``DatasetDict``. A single file always loads as one split.

    Raises:
        ValueError: unsupported ``data``, a missing split, an empty dataset, no ``prompt``
            column, or a row whose prompt is invalid (the first bad row is named).
        FileNotFoundError: ``data`` is a path that does not exist.
    """
    dataset = _to_dataset(data, split)
    validate_prompt_dataset(dataset)
    return dataset


def _to_dataset(data: Any, split: str) -> datasets.Dataset:
    if isinstance(data, datasets.Dataset):
        return data
    if isinstance(data, datasets.DatasetDict):
        return _take_split(data, split)
    if isinstance(data, list) and all(isinstance(row, dict) for row in data):
        return datasets.Dataset.from_list(data)
    if isinstance(data, str | os.PathLike):
        return _load_path(Path(data), split)
    raise ValueError(f"cannot load prompts from {type(data).__name__}; give {ACCEPTED_DATA}")


def _take_split(data: datasets.DatasetDict, split: str) -> datasets.Dataset:
    if split not in data:
        raise ValueError(f"split {split!r} not found; available splits: {', '.join(data.keys())}")
    return data[split]


def _load_path(path: Path, split: str) -> datasets.Dataset:
    if not path.exists():
        raise FileNotFoundError(f"prompt data path {str(path)!r} does not exist")
    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            return _take_split(loaded, split)
        return loaded
    builder = _FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise ValueError(f"cannot load prompts from a {path.suffix or 'suffix-less'} file; give {ACCEPTED_DATA}")
    return datasets.load_dataset(builder, data_files=str(path), split="train")


# ---------------------------------------------------------------------------- validation


def validate_prompt_dataset(dataset: datasets.Dataset) -> None:
    """Raise ``ValueError`` if ``dataset`` is empty, has no ``prompt`` column or a bad prompt.

    All rows are checked; the message names the first bad one and how many are bad.
    """
    if len(dataset) == 0:
        raise ValueError("the prompt dataset is empty")
    if PROMPT_COLUMN not in dataset.column_names:
        columns = ", ".join(dataset.column_names)
        raise ValueError(f"dataset has no `prompt` column (columns: {columns}); rename the prompt column to `prompt`")
    first_error: str | None = None
    num_bad = 0
    for index, prompt in enumerate(dataset[PROMPT_COLUMN]):
        problem = prompt_problem(prompt)
        if problem is not None:
            num_bad += 1
            if first_error is None:
                first_error = f"row {index}: {problem}"
    if first_error is not None:
        raise ValueError(f"invalid prompt in {first_error} ({num_bad} of {len(dataset)} rows are invalid)")


def prompt_problem(prompt: Any) -> str | None:
    """What is wrong with one prompt, or None if it is a valid text or conversational prompt."""
    if isinstance(prompt, str):
        return "the prompt is an empty string" if prompt == "" else None
    if not isinstance(prompt, list):
        return (
            f"the prompt is a {type(prompt).__name__}; expected a non-empty str or a non-empty list "
            'of {"role": str, "content": str} messages'
        )
    if not prompt:
        return "the prompt is an empty list of messages"
    for position, message in enumerate(prompt):
        problem = _message_problem(message)
        if problem is not None:
            return f"message {position} {problem}"
    return None


def _message_problem(message: Any) -> str | None:
    if not isinstance(message, dict):
        return f"is a {type(message).__name__}, expected a dict with `role` and `content`"
    for key in ("role", "content"):
        if not isinstance(message.get(key), str):
            found = "is missing" if message.get(key) is None else f"is a {type(message[key]).__name__}"
            return f"`{key}` {found}; expected a str"
    return None


def is_conversational(prompt: Any) -> bool:
    """True for a non-empty list of messages that each have a ``role`` and a ``content``."""
    return (
        isinstance(prompt, list)
        and len(prompt) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)
    )


# ---------------------------------------------------------------------------- rendering


def render_prompt(prompt: str | list[dict[str, Any]], tokenizer: PreTrainedTokenizerBase) -> str:
    """Plain text as is; a conversation through the chat template, ending in the generation prompt."""
    if isinstance(prompt, str):
        return prompt
    if not is_conversational(prompt):
        raise ValueError(f"cannot render prompt {_preview(prompt)}: {prompt_problem(prompt)}")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "conversational prompts need a chat template, but the tokenizer has none; "
            "set `tokenizer.chat_template` or use plain-text prompts"
        )
    rendered = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    if not isinstance(rendered, str):
        raise ValueError(f"the chat template returned {type(rendered).__name__}, expected str")
    return rendered


@dataclass(frozen=True)
class TokenizedPrompts:
    """Prompt token ids, one list per prompt, after left truncation.

    ``num_truncated`` counts the prompts (not tokens) that were cut to ``max_prompt_length``.
    """

    ids: list[list[int]]
    num_truncated: int


def encode_prompts(
    prompts: list[Any], tokenizer: PreTrainedTokenizerBase, max_prompt_length: int | None
) -> TokenizedPrompts:
    """Render (chat template for conversations) and tokenize a batch of raw dataset prompts.

    Plain text gets the tokenizer's special tokens, as in TRL; a rendered chat template
    already carries its own, so none are added.
    """
    conversational = is_conversational(prompts[0])
    texts = [render_prompt(p, tokenizer) for p in prompts]
    return tokenize_prompts(texts, tokenizer, max_prompt_length, add_special_tokens=not conversational)


def tokenize_prompts(
    texts: list[str],
    tokenizer: PreTrainedTokenizerBase,
    max_prompt_length: int | None,
    add_special_tokens: bool = True,
) -> TokenizedPrompts:
    """Tokenize rendered prompts and keep the last ``max_prompt_length`` tokens of each.

    Use ``add_special_tokens=True`` for plain-text prompts (as TRL does) and ``False`` for
    prompts rendered by a chat template, which already carries its special tokens.
    Truncation is from the left, so a truncated prompt loses its start (and its BOS).

    Raises:
        ValueError: a prompt tokenizes to no tokens, or ``max_prompt_length < 1``.
    """
    if max_prompt_length is not None and max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be >= 1 or None, got {max_prompt_length}")
    encoded = tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
    ids: list[list[int]] = []
    num_truncated = 0
    for index, (text, prompt_ids) in enumerate(zip(texts, encoded, strict=True)):
        if len(prompt_ids) == 0:
            raise ValueError(f"prompt {index} ({_preview(text)}) tokenized to no tokens")
        if max_prompt_length is not None and len(prompt_ids) > max_prompt_length:
            prompt_ids = prompt_ids[-max_prompt_length:]
            num_truncated += 1
        ids.append(list(prompt_ids))
    return TokenizedPrompts(ids=ids, num_truncated=num_truncated)


def _preview(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------- sampling


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


# ---------------------------------------------------------------------------- reward columns


def gather_columns(dataset: datasets.Dataset, indices: Sequence[int], repeat: int) -> dict[str, list[Any]]:
    """Every column but ``prompt`` for rows ``indices``, each value repeated ``repeat`` times.

    The ``repeat`` (K) completions of a prompt are consecutive, so row ``i``'s value is at
    positions ``i*K .. i*K + K - 1``. The result is passed to reward functions by name.
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    names = [name for name in dataset.column_names if name != PROMPT_COLUMN]
    if not names:
        return {}
    rows = dataset.select_columns(names)[list(indices)]
    return {name: [value for value in rows[name] for _ in range(repeat)] for name in names}
