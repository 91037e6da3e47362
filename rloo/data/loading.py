"""Prompts in: the one dataset loader (objects, files, folders, hub ids) and its validation.

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
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeAlias

import datasets

from rloo.suggest import did_you_mean, unknown_name_error

PROMPT_COLUMN = "prompt"
ACCEPTED_DATA = (
    "a datasets.Dataset, a datasets.DatasetDict, a list of dicts, or a path to a .json, .jsonl or "
    ".parquet file, to a folder written by Dataset.save_to_disk, or a hub dataset id"
)
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


# ---------------------------------------------------------------------------- loading


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
        if not any((path / name).exists() for name in ("dataset_info.json", "dataset_dict.json", "state.json")):
            raise ValueError(
                f"{str(path)!r} is a folder but not one written by Dataset.save_to_disk; give such a folder "
                "or a .json, .jsonl or .parquet file"
            )
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


# ---------------------------------------------------------------------------- validation


def validate_prompt_dataset(dataset: datasets.Dataset, key: str = "dataset") -> None:
    """Raise ``ValueError`` if ``dataset`` is empty, has no ``prompt`` column or a bad prompt, or
    mixes text and conversational prompts.

    All rows are checked; the message names the first bad one and how many are bad. A streaming
    dataset is checked for its ``prompt`` column only (where its features are known). ``key``: the
    run-file key (``dataset``, ``eval_dataset``, a named eval set ``eval_dataset['hard']``) or option
    (``--column``) a rename goes under; a message about an eval set names it (:func:`dataset_name`).
    """
    if isinstance(dataset, datasets.IterableDataset):
        names = dataset.column_names
        if names is not None and PROMPT_COLUMN not in names:
            raise missing_prompt_column(list(names), key)
        return
    if len(dataset) == 0:
        raise ValueError("the prompt dataset is empty" + ("" if dataset_name(key) == "dataset" else f" ({key})"))
    if PROMPT_COLUMN not in dataset.column_names:
        raise missing_prompt_column(dataset.column_names, key)
    check_prompts(dataset[PROMPT_COLUMN], key)


def dataset_name(key: str) -> str:
    """What a message calls the dataset of ``key``: ``dataset`` (the train set, or ``rloo eval``'s
    ``--column`` option), else the key (``eval_dataset``, ``eval_dataset['hard']``)."""
    return "dataset" if key.startswith("--") else key


# where prompts are most often stored, for the rename a missing `prompt` column suggests
PROMPT_LIKE_COLUMNS = ("question", "problem", "query", "instruction", "input", "text", "messages", "conversations")


def missing_prompt_column(columns: list[str], key: str = "dataset") -> ValueError:
    """No ``prompt`` column: the columns, and the rename in Python and on the command line
    (``rloo eval --column old=prompt`` for ``key="--column"``, else the run file's ``key.columns``)."""
    old = next((name for name in PROMPT_LIKE_COLUMNS if name in columns), columns[0] if columns else "question")
    name, run_key = dataset_name(key), key.split("[")[0]  # a named eval set is renamed under eval_dataset
    if key.startswith("--"):
        command_line = f"{key} {old}=prompt on the command line"
    else:
        command_line = (
            f"'{run_key}.columns={{{old}: prompt}}' on rloo train's command line (in a run file: "
            f"`columns: {{{old}: prompt}}` under `{run_key}:`)"
        )
    return ValueError(
        f"{name} has no `prompt` column (columns: {', '.join(columns)}); rename the prompt column to `prompt`: "
        f"{command_line}, or {name}.rename_column({old!r}, 'prompt') in Python"
    )


def check_prompts(prompts: Sequence[Any], key: str = "dataset") -> None:
    """Raise ``ValueError`` naming the first bad prompt's row and how many rows are bad, or the first
    row whose kind (text or conversation) differs from row 0's: a batch is rendered as one kind.
    ``key``: the dataset named, where it is not the train set (:func:`dataset_name`)."""
    of = "" if dataset_name(key) == "dataset" else f" of {key}"
    bad = [(index, problem) for index, prompt in enumerate(prompts) if (problem := prompt_problem(prompt))]
    if bad:
        index, problem = bad[0]
        raise ValueError(
            f"invalid prompt in row {index}{of}: {problem} ({len(bad)} of {len(prompts)} rows are invalid)"
        )
    first = isinstance(prompts[0], str) if len(prompts) else True
    differ = [index for index, prompt in enumerate(prompts) if isinstance(prompt, str) != first]
    if differ:
        raise mixed_prompts_error(
            first, differ[0], f"the `prompt` column{of}", f" ({len(differ)} of {len(prompts)} rows differ from row 0)"
        )


def mixed_prompts_error(first_is_text: bool, row: int, where: str, count: str = "", first_row: int = 0) -> ValueError:
    """Row ``first_row`` (0) is text and ``row`` a conversation, or the other way round: one kind per dataset."""
    kinds = ("text (a str)", "a conversation (a list of messages)")
    first, other = kinds if first_is_text else kinds[::-1]
    return ValueError(
        f"{where} mixes text and conversational prompts: row {first_row} is {first} but row {row} is {other}{count}; "
        'give every row the same kind: a text prompt becomes [{"role": "user", "content": text}] as a '
        "conversation (rendered with the chat template), or make every prompt text"
    )


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


# the roles chat templates know (OpenAI's and Llama's tool roles included); a typo such as
# "usr" would otherwise be rendered as is, or dropped, by the template without a word
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function", "ipython")


def _message_problem(message: Any) -> str | None:
    if not isinstance(message, dict):
        return f"is a {type(message).__name__}, expected a dict with `role` and `content`"
    for key in ("role", "content"):
        if key == "content" and isinstance(message.get(key), list):
            return _parts_problem(message[key])
        if not isinstance(message.get(key), str):
            found = "is missing" if message.get(key) is None else f"is a {type(message[key]).__name__}"
            return f"`{key}` {found}; expected a str" + (" or a list of content parts" if key == "content" else "")
    if message["role"] not in CHAT_ROLES:
        hint = did_you_mean(message["role"], CHAT_ROLES).removeprefix("; ")
        return f"has role {message['role']!r}: use one of {', '.join(CHAT_ROLES)}" + (f" ({hint})" if hint else "")
    return None


def _parts_problem(parts: list[Any]) -> str | None:
    """What is wrong with a message's list of content parts (``{"type": "text", "text": str}`` or
    ``{"type": "image"}``, the image taken from the row's ``image``/``images`` column), or None."""
    if not parts:
        return "`content` is an empty list of parts"
    for position, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") not in ("text", "image"):
            return (
                f'content part {position} is {part!r}; expected {{"type": "text", "text": ...}} or {{"type": "image"}}'
            )
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            return f"content part {position} is a text part without a str `text`"
    return None


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
