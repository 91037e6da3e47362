"""The table of ``RLOOConfig`` fields in docs/configuration.md, rendered from the documentation declared with
each field (``python -m rloo.config`` prints it; ``tests/config/test_docs.py`` checks the page)."""

from __future__ import annotations

import dataclasses

from rloo.config.fields.declare import default_value, trl_name
from rloo.config.rloo_config import RLOOConfig


def fields_markdown() -> str:
    """The table of the constructor fields, rendered from their metadata, in declaration order."""
    rows = ["| field | default | what it does | TRL |", "|---|---|---|---|"]
    for f in dataclasses.fields(RLOOConfig):
        if f.init:
            text = f.metadata["help"].replace("|", "\\|")
            trl = "—" if trl_name(f) is None else f"`{trl_name(f)}`"
            rows.append(f"| `{f.name}` | `{default_value(f)!r}` | {text} | {trl} |")
    return "\n".join(rows)
