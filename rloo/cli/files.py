"""The files the CLI reads: UTF-8 text and YAML mappings (run files, TRL's ``--config``), with errors that name
the file, the line and the fix; and the text of a field's type annotation, as its messages print it.

The run-file reader (:mod:`rloo.cli.run_file`) and the TRL flag parser (:mod:`rloo.cli.trl_args`) both read
through here, so neither imports the other for it.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

import yaml


def utf8_text(file: Path, what: str) -> str:
    """The text of a UTF-8 file (a leading byte-order mark dropped), whatever the locale's encoding; a
    ``ValueError`` naming the file and the first line that is not UTF-8 (not Python's bare
    ``UnicodeDecodeError`` with a byte position)."""
    data = file.read_bytes().removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"{what} {str(file)!r} is not UTF-8 text (line {line}: byte {data[error.start]:#04x}, {error.reason}); "
            "save it as UTF-8, e.g. iconv -f ENCODING -t utf-8 FILE > NEW with ENCODING the one it was written in "
            "(such as latin1)"
        ) from None


def yaml_problem(error: yaml.YAMLError) -> str:
    """``line L, column C: <problem>`` of a YAML error, without PyYAML's multi-line context."""
    mark = getattr(error, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + str(getattr(error, "problem", None) or error)


def read_yaml_mapping(file: Path, what: str, label: str, entries: str) -> dict[str, Any]:
    """The mapping a UTF-8 YAML file holds (an empty file: ``{}``); ``what`` names the file in encoding errors
    (``"run file"``), ``label`` in the others (``"run file 'x.yaml'"``, ``"--config 'x.yaml'"``), and
    ``entries`` says what the mapping maps (``"keys to values"``)."""
    try:
        loaded = yaml.safe_load(utf8_text(file, what)) or {}
    except yaml.YAMLError as error:
        raise ValueError(f"{label} is not valid YAML: {yaml_problem(error)}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"{label} must be a YAML mapping of {entries}")
    return loaded


def annotation_text(annotation: Any) -> str:
    """``int``, ``int | None``, ``list[str]``: the text of a resolved annotation.

    ``str(int)`` is ``"<class 'int'>"``, so a plain class is named by its ``__name__``.
    """
    text = annotation.__name__ if type(annotation) is type else str(annotation)
    return text.replace("typing.", "").replace("NoneType", "None")
