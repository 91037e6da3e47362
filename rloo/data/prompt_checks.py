"""Which prompt datasets and prompts are valid: a ``prompt`` column of non-empty text or conversations (lists of
``{"role": str, "content": str | parts}`` messages with a known role), one kind per dataset. Every row is
checked when a dataset loads, and a message names the first bad row, how many are bad, and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import datasets

from rloo.suggest import did_you_mean

PROMPT_COLUMN = "prompt"


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
