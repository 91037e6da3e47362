"""Prompts in: the one dataset loader (objects, files, folders, hub ids), validated on load
(:mod:`rloo.data.prompt_checks`).

``RLOOTrainer(train_dataset=...)``, the run file's ``dataset:`` (:class:`DatasetSource`)
and ``rloo eval`` all load through :func:`load_prompt_dataset`. A prompt dataset has a
``prompt`` column holding either plain text or a conversation (a list of
``{"role": str, "content": str}`` messages, rendered with the tokenizer's chat template).
Every other column is passed, by name, to the reward functions.

Where we depart from TRL:

- Every row is validated up front, so a bad row fails at start-up with its index rather
  than mid-run.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeAlias

import datasets

from rloo.data.prompt_checks import PROMPT_COLUMN, check_prompts, missing_prompt_column, validate_prompt_dataset
from rloo.suggest import unknown_name_error

ACCEPTED_DATA = (
    "a datasets.Dataset, a datasets.DatasetDict, a list of dicts, or a path to a .json, .jsonl or "
    ".parquet file, to a folder written by Dataset.save_to_disk or holding a dataset repository, or a hub dataset id"
)
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def load_prompt_dataset(
    data: Any, split: str = "train", name: str | None = None, key: str = "dataset"
) -> datasets.Dataset:
    """Load prompts from any accepted source and check that every row is usable.

    Args:
        data: a ``Dataset``; a ``DatasetDict`` (``split`` is taken); a list of dicts; or a
            path (``str`` / ``PathLike``) to a ``.json``, ``.jsonl`` or ``.parquet`` file, or to
            a folder written by ``save_to_disk`` (holding a ``Dataset`` or a ``DatasetDict``).
        split: the split taken from a ``DatasetDict`` or the hub. A single file always loads
            as one split.
        name: the hub dataset's configuration (e.g. ``"main"`` for GSM8K).
        key: what the messages call it (``dataset``, ``eval_dataset``, ``eval_dataset['hard']``):
            :func:`validate_prompt_dataset`.

    Raises:
        ValueError: unsupported ``data``, a missing split, an empty dataset, no ``prompt``
            column, or a row whose prompt is invalid (the first bad row is named).
        FileNotFoundError: ``data`` is a path that does not exist.
    """
    dataset = load_dataset(data, split, name, key)
    validate_prompt_dataset(dataset, key)
    return dataset


EvalSets: TypeAlias = "datasets.Dataset | dict[str, datasets.Dataset]"


def load_train_and_eval(
    train_dataset: Any, eval_dataset: Any, evaluates: str | None, prompt_only: bool = False
) -> tuple[datasets.Dataset, EvalSets | None]:
    """The trainer's datasets, checked: a train dataset is required, and an evaluation schedule
    (``evaluates``: e.g. ``eval_steps=10``) needs an eval dataset (as in transformers).
    ``eval_dataset`` may be a dict of named sets (a ``DatasetDict`` is one), as transformers takes
    it. ``prompt_only`` (``remove_unused_columns``) keeps only the columns the model reads: the
    prompt and an ``image``/``images`` column."""
    if train_dataset is None:
        raise ValueError("train_dataset is required: a datasets.Dataset, a list of dicts or a file path")
    if evaluates is not None and eval_dataset is None:
        raise ValueError(f"RLOOConfig.{evaluates} needs an eval_dataset; pass one, or turn evaluation off")
    train = load_prompt_dataset(train_dataset)
    evaluation = None if eval_dataset is None else load_eval_sets(eval_dataset)
    if not prompt_only:
        return train, evaluation
    if isinstance(evaluation, dict):
        return keep_model_columns(train), {name: keep_model_columns(data) for name, data in evaluation.items()}
    return keep_model_columns(train), None if evaluation is None else keep_model_columns(evaluation)


def load_eval_sets(eval_dataset: Any) -> EvalSets:
    """One eval set, or a dict of named ones (a ``DatasetDict`` or ``IterableDatasetDict`` too), each
    loaded and checked; a streaming set is kept as it is and read to its end at each evaluation
    (:func:`eval_rows`)."""
    if isinstance(eval_dataset, dict):
        if not eval_dataset:
            raise ValueError("eval_dataset is an empty dict; give one dataset, or a dict of named ones")
        return {str(name): _one_eval_set(data, f"eval_dataset[{str(name)!r}]") for name, data in eval_dataset.items()}
    return _one_eval_set(eval_dataset)


def _one_eval_set(eval_dataset: Any, key: str = "eval_dataset") -> datasets.Dataset:
    return load_prompt_dataset(eval_dataset, key=key)


def eval_rows(eval_set: datasets.Dataset | datasets.IterableDataset) -> datasets.Dataset:
    """The rows of an eval set by index: a streaming one is read to its end (as transformers' eval
    loop reads it; an endless stream never ends: give ``stream.take(n)``), its prompts checked."""
    if not isinstance(eval_set, datasets.IterableDataset):
        return eval_set
    rows = load_dataset(list(eval_set), key="eval_dataset")  # mixed prompts named before Arrow rejects them
    validate_prompt_dataset(rows, "eval_dataset")
    return rows


def keep_model_columns(dataset: datasets.Dataset) -> datasets.Dataset:
    return dataset.select_columns(model_columns(dataset))


def model_columns(dataset: datasets.Dataset) -> list[str]:
    """The columns the model reads (the rest only reach reward functions)."""
    return [name for name in column_names(dataset) if name in (PROMPT_COLUMN, "image", "images")]


def column_names(dataset: datasets.Dataset | datasets.IterableDataset) -> list[str]:
    """The dataset's columns; a streaming dataset without known features shows its first row's."""
    if dataset.column_names is not None:
        return list(dataset.column_names)
    return list(next(iter(dataset), {}).keys())


def load_dataset(data: Any, split: str = "train", name: str | None = None, key: str = "dataset") -> datasets.Dataset:
    """Like :func:`load_prompt_dataset`, without the ``prompt`` column checks (for renames first;
    ``key``: what a message about a list of rows calls it).

    A string or path that exists is read locally; one that does not and looks like a hub id
    (no suffix, not absolute) is loaded from the hub. A streaming ``IterableDataset`` is
    returned as is (its rows are checked as they are drawn: :class:`rloo.data.prompt_order.StreamedRows`).
    """
    if isinstance(data, datasets.Dataset | datasets.IterableDataset):
        return data
    if isinstance(data, datasets.DatasetDict):
        return _take_split(data, split)
    if isinstance(data, list) and all(isinstance(row, dict) for row in data):
        # check prompts before Arrow does: it rejects mixed types with messages naming no row
        if all(PROMPT_COLUMN in row for row in data):
            check_prompts([row[PROMPT_COLUMN] for row in data], key)
        try:
            return datasets.Dataset.from_list(data)
        except (TypeError, ValueError, ArithmeticError) as error:  # pyarrow's errors derive from these
            raise ValueError(
                f"the rows do not form a table ({type(error).__name__}: {error}); give every row the same "
                "columns with one type per column"
            ) from error
    if isinstance(data, str | os.PathLike):
        return _load_path(Path(data), split, name)
    raise ValueError(f"cannot load prompts from {type(data).__name__}; give {ACCEPTED_DATA}")


def _take_split(data: datasets.DatasetDict, split: str) -> datasets.Dataset:
    if split not in data:
        raise ValueError(f"split {split!r} not found; available splits: {', '.join(data.keys())}")
    return data[split]


def holds_one_split(path: str | os.PathLike[str]) -> bool:
    """Whether a local path holds one split (a file, a folder of a saved ``Dataset``), not several
    (a saved ``DatasetDict``); a hub id is neither local nor known to hold one split."""
    local = Path(path)
    return local.is_file() or (local.is_dir() and not (local / "dataset_dict.json").exists())


def _one_split(dataset: datasets.Dataset, split: str, what: str) -> datasets.Dataset:
    """A source holding one split (a file, a saved ``Dataset``) answers to its own split's name and
    to ``train`` (the default); any other name is a typo or a wrong guess, never silently ignored."""
    own = str(dataset.split) if dataset.split is not None else "train"
    if split not in (own, "train"):
        raise ValueError(
            f"split {split!r} not found; available splits: {own} ({what} holds one split): drop the split, "
            "or give a folder written by DatasetDict.save_to_disk (or a hub id) to choose among splits"
        )
    return dataset


def _load_path(path: Path, split: str, name: str | None) -> datasets.Dataset:
    if not path.exists() and (path.is_absolute() or path.suffix or str(path).startswith(".")):
        raise FileNotFoundError(f"prompt data path {str(path)!r} does not exist")
    if not path.exists():
        try:
            return datasets.load_dataset(str(path), name, split=split)
        except Exception as error:  # no such hub dataset, no network, a bad config name
            raise ValueError(
                f"could not load the dataset {str(path)!r}: it is not a local file or folder, and as a hub id it "
                f"failed ({type(error).__name__}: {error}). Check the path, or the hub id and network"
            ) from error
    if path.is_dir():
        if not any((path / marker).exists() for marker in ("dataset_info.json", "dataset_dict.json", "state.json")):
            return _load_repository(path, split, name)
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            return _take_split(loaded, split)
        return _one_split(loaded, split, f"{str(path)!r}, a saved Dataset,")
    builder = _FILE_BUILDERS.get(path.suffix.lower())
    if builder is None:
        raise ValueError(f"cannot load prompts from a {path.suffix or 'suffix-less'} file; give {ACCEPTED_DATA}")
    if path.stat().st_size == 0:
        raise ValueError(f"prompt data file {str(path)!r} is empty; give a file with one prompt per row")
    if builder == "json":
        check_utf8(path)
    try:
        loaded = datasets.load_dataset(builder, data_files=str(path), split="train")
    except Exception as error:  # malformed JSON lines, an empty file, a broken parquet file
        cause = error.__cause__ or error
        raise ValueError(
            f"could not read {str(path)!r} as {path.suffix[1:]} ({type(cause).__name__}: {cause}); "
            "check that it is a valid, non-empty file with a `prompt` column"
        ) from error
    return _one_split(loaded, split, f"{str(path)!r}, a single file,")


def _load_repository(path: Path, split: str, name: str | None) -> datasets.Dataset:
    """A dataset repository's folder (a clone of a hub dataset: its data files, or a README.md naming its
    configurations, e.g. ``--dataset_config standard_prompt_only``), read as ``datasets.load_dataset`` reads it."""
    try:
        loaded = datasets.load_dataset(str(path), name, split=split)
    except Exception as error:  # no data files, a bad config or split name, unreadable files
        raise ValueError(
            f"{str(path)!r} is a folder but not one written by Dataset.save_to_disk, and datasets.load_dataset "
            f"cannot read it as a dataset repository with name={name!r}, split={split!r} "
            f"({type(error).__name__}: {error}); give such a folder (a hub dataset's clone: its data files, or a "
            "README.md naming its configs), one written by Dataset.save_to_disk, or a .json, .jsonl or .parquet file"
        ) from error
    assert isinstance(loaded, datasets.Dataset)  # one split asked for
    return loaded


def check_utf8(path: Path) -> None:
    """A ``ValueError`` naming the file and the first line that is not UTF-8 (JSON files must be; pyarrow
    would otherwise fail on the first read of that row with a bare ``UnicodeDecodeError``, or, for
    UTF-16, a JSON parse error). Read line by line, so a large file is never held whole."""
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"prompt data file {str(path)!r} is not UTF-8 text (line {number}, byte {error.start + 1} of "
                    f"the line: {line[error.start]:#04x}, {error.reason}); save it as UTF-8, e.g. iconv -f ENCODING "
                    "-t utf-8 FILE > NEW with ENCODING the one it was written in (such as latin1 or utf-16)"
                ) from None


DATASET_KEYS = ("path", "name", "split", "columns", "as_chat", "system_prompt", "limit")
_DATASET_TYPES: dict[str, type] = {
    "path": str,
    "name": str,
    "split": str,
    "columns": dict,
    "as_chat": bool,
    "system_prompt": str,
    "limit": int,
}
_DATASET_RULES = {
    "path": "a file, folder or hub id (str)",
    "name": "a hub configuration name (str) or null",
    "split": "a split name (str)",
    "columns": "a mapping of old: new column names",
    "as_chat": "true or false",
    "system_prompt": "a string or null",
    "limit": "an int >= 1 or null",
}


@dataclass(frozen=True)
class DatasetSource:
    """A run file's ``dataset:`` entry: where the prompts are and how to prepare them.

    ``columns`` renames columns (``{question: prompt}``), ``limit`` keeps the first rows,
    ``as_chat`` turns text prompts into a user message (after ``system_prompt`` if given).
    """

    path: str
    name: str | None = None
    split: str = "train"
    columns: dict[str, str] | None = None
    as_chat: bool = False
    system_prompt: str | None = None
    limit: int | None = None

    @classmethod
    def parse(cls, value: Any, where: str) -> DatasetSource:
        """From a run file value: a path / hub id, or a mapping of :data:`DATASET_KEYS`."""
        if isinstance(value, str):
            return cls(path=value)
        if not isinstance(value, dict):
            raise ValueError(f"`{where}` must be a path/hub id or a mapping with keys {list(DATASET_KEYS)}")
        for key in value:
            if key not in DATASET_KEYS:
                raise unknown_name_error("key", key, DATASET_KEYS, where=f"{where}.", list_choices=True)
        if "path" not in value:
            raise ValueError(f"`{where}.path` is required: a local file/folder or a hub dataset id")
        for key, item in value.items():
            expected = _DATASET_TYPES[key]
            if item is None and key in ("name", "columns", "system_prompt", "limit"):
                continue
            ok = isinstance(item, expected) and not (expected is int and isinstance(item, bool))
            if key == "columns":
                ok = ok and all(isinstance(k, str) and isinstance(v, str) for k, v in item.items())
            if not ok or (key == "limit" and item < 1):
                raise ValueError(f"`{where}.{key}` expects {_DATASET_RULES[key]}, got {item!r} ({type(item).__name__})")
        return cls(**value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load(self, key: str = "dataset") -> datasets.Dataset:
        """The prompts, renamed, limited and (``as_chat``) turned into conversations, then checked;
        ``key``: where a rename goes (:func:`missing_prompt_column`)."""
        raw = load_dataset(self.path, self.split, self.name)
        if self.columns:
            missing = [c for c in self.columns if c not in raw.column_names]
            if missing:
                raise ValueError(f"dataset columns {missing} not found; the dataset has {raw.column_names}")
            raw = raw.rename_columns(self.columns)
        if self.limit is not None:
            raw = raw.select(range(min(self.limit, len(raw))))
        if self.as_chat:
            if PROMPT_COLUMN not in raw.column_names:
                raise missing_prompt_column(raw.column_names, key)
            raw = raw.map(lambda row: {PROMPT_COLUMN: self._as_chat(row[PROMPT_COLUMN])})
        validate_prompt_dataset(raw, key)
        return raw

    def _as_chat(self, text: str) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*messages, {"role": "user", "content": text}]
