"""Every RLOOConfig field is documented where it is declared, and the field table of docs/configuration.md is
generated from it."""

from __future__ import annotations

import dataclasses
import re

import pytest

from rloo.config import RLOOConfig
from rloo.config.docs import fields_markdown
from rloo.config.fields.declare import trl_name
from tests.helpers.paths import REPO

PAGE = REPO / "docs" / "configuration.md"
START, END = "<!-- config-fields:start -->", "<!-- config-fields:end -->"
REGENERATE = "regenerate it with `.venv/bin/python scripts/regen_docs.py`"


def constructor_fields() -> list[dataclasses.Field[object]]:
    return [f for f in dataclasses.fields(RLOOConfig) if f.init]


def table_block() -> str:
    text = PAGE.read_text()
    assert text.count(START) == 1 and text.count(END) == 1, f"{PAGE.name} needs one {START} ... {END} block"
    return text.split(START, 1)[1].split(END, 1)[0]


@pytest.mark.parametrize("f", constructor_fields(), ids=lambda f: f.name)
def test_every_field_is_documented(f: dataclasses.Field[object]) -> None:
    assert len(f.metadata.get("help", "").strip()) >= 20, f"{f.name}: declare it with option(default, help, trl=...)"
    assert set(f.metadata) == {"help"}, f"{f.name}: argparse (HfArgumentParser) takes help only, got {set(f.metadata)}"
    trl = trl_name(f)  # a KeyError: not declared with option(default, help, trl=...)
    assert trl is None or re.fullmatch(r"\w+( \(\w+\))?", trl), trl


def test_the_docs_table_is_generated_from_the_metadata() -> None:
    assert table_block() == "\n" + fields_markdown() + "\n", f"{PAGE.name}'s field table is stale: {REGENERATE}"


def test_the_docs_table_names_every_field() -> None:
    rows = {line.split("|")[1].strip().strip("`") for line in table_block().strip().splitlines()[2:]}
    assert rows == set(RLOOConfig.field_names())
    assert len(RLOOConfig.field_names()) == len(constructor_fields()) == fields_markdown().count("\n") - 1


def test_table_follows_declaration_order_and_marks_missing_counterparts() -> None:
    lines = fields_markdown().splitlines()
    assert lines[0] == "| field | default | what it does | TRL |"
    assert [line.split(" | ")[0].removeprefix("| `").rstrip("`") for line in lines[2:]] == RLOOConfig.field_names()
    by_name = {line.split(" | ")[0].removeprefix("| `").rstrip("`"): line for line in lines[2:]}
    assert by_name["beta"].endswith("| `beta` |") and "`None`" in by_name["beta"]
    assert by_name["preset"].endswith("| — |") and "`'trl'`" in by_name["preset"]
