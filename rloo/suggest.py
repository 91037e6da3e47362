""" "Did you mean ...?": the one helper every unknown-name error uses (config fields, run-file
keys, reward names, peft fields)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

# how alike a name must be to be suggested (difflib's ratio): typos score 0.8 and more; at difflib's
# default 0.6, names that only look alike were offered (loss_type -> lora_task_type, deepspeed -> seed)
SIMILAR = 0.75


def did_you_mean(name: object, choices: Iterable[str], aliases: Mapping[str, str] | None = None) -> str:
    """``"; did you mean `x`?"`` for the closest choice (or a known alias of one), else ``""``.

    ``aliases`` maps names people often write to the real one when they are too far apart
    for string similarity (``rank`` -> ``r``).
    """
    if aliases and str(name) in aliases:
        return f"; did you mean `{aliases[str(name)]}`?"
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=SIMILAR)
    return f"; did you mean `{close[0]}`?" if close else ""


def unknown_name_error(
    kind: str,
    name: object,
    choices: Iterable[str],
    *,
    where: str = "",
    list_choices: bool = False,
    aliases: Mapping[str, str] | None = None,
) -> ValueError:
    """``unknown <kind> `<where><name>`; did you mean `x`?``; with ``list_choices`` and no close
    match, the valid names are listed instead."""
    options = list(choices)
    hint = did_you_mean(name, options, aliases)
    if not hint and list_choices:
        hint = f"; valid {kind}s: {', '.join(sorted(options))}"
    return ValueError(f"unknown {kind} `{where}{name}`{hint}")
