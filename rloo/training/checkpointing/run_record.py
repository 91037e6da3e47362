"""What ``config.yaml`` records of a run built in Python (``RLOOTrainer(...)``, ``GRPOTrainer(...)``) besides
its config: the run file's keys (``model``, ``dataset``, ``eval_dataset``, ``reward_funcs``, ``peft``,
``tools``, ``compute_metrics``), so that ``rloo train RUN/config.yaml`` re-runs it as ``rloo train``'s own
config.yaml does (:meth:`rloo.cli.run_file.RunFile.to_dict`), and the report names the model.

An argument is recorded by the name a run file gives it: a path or hub id as given, a loaded model's
``name_or_path``, a function by its import path ``module:qualname`` (when importing that path gives the
same function back). One without such a name (a model built in memory, a list of rows, a lambda, a
function of the script being run) is left out, its key with it, and said at the top of the file as
comments: what it was and what to write instead; ``rloo train`` then names the missing key.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
from collections.abc import Mapping
from typing import Any

import yaml

REWRITE = "add it to re-run this file with `rloo train`"


class RunRecord(dict[str, Any]):
    """The run-file keys an object of the Python API has a name for; ``notes``: one line per argument
    that has none (``config.yaml`` writes them as comments above the keys)."""

    def __init__(self, values: Mapping[str, Any], notes: list[str]) -> None:
        super().__init__(values)
        self.notes = notes


def run_record(
    model: Any,
    rewards: tuple[Any, ...],
    datasets: tuple[Any, Any],
    peft_config: Any,
    compute_metrics: Any,
    agent: tuple[Any, Any, Any] = (None, None, None),
) -> RunRecord:
    """The record of ``RLOOTrainer``'s arguments: ``rewards`` starts ``(reward_funcs,
    reward_model)`` (TRL's older name), ``datasets`` is ``(train_dataset, eval_dataset)``, ``agent`` ``(tools,
    rollout_func, environment_factory)`` (the last two never in a run file)."""
    tools, *custom = agent
    values: dict[str, Any] = {}
    notes: list[str] = []

    def record(key: str, value: Any, note: str | list[str] | None) -> None:
        if note is None:
            values[key] = value
        else:
            notes.extend(note if isinstance(note, list) else [f"{key}: {note}"])

    record("model", *_model(model))
    record("dataset", *_dataset(datasets[0], "dataset"))
    if datasets[1] is not None:
        record("eval_dataset", *_dataset(datasets[1], "eval_dataset"))
    reward_funcs = rewards[0] if rewards[0] is not None else rewards[1]
    if reward_funcs is not None:
        record("reward_funcs", *_functions(reward_funcs, "reward_funcs", _reward))
    if peft_config is not None:
        record("peft", *_peft(peft_config))
    if tools:
        record("tools", *_functions(tools, "tools", _function))
    if compute_metrics is not None:
        value, note = _function(compute_metrics, "compute_metrics")  # its note names it
        record("compute_metrics", value, None if note is None else [note])
    for name, given in zip(("rollout_func", "environment_factory"), custom, strict=True):
        if given is not None:
            notes.append(f"{name}: {_describe(given)}, which a run file cannot give: re-run this run from Python")
    return RunRecord(values, notes)


def notes_header(notes: list[str]) -> str:
    """The comment lines above ``config.yaml``'s keys for what was not recorded (nothing when all was)."""
    if not notes:
        return ""
    lines = ["Written by the Python API. Not recorded here (a run file has no name for them):", *notes]
    return "".join(f"# {line}\n" for line in lines)


def import_path(func: Any) -> str | None:
    """``module:qualname`` of ``func`` when importing it gives ``func`` back, else None (a lambda, a local
    function, a function of the script being run, an object without a name)."""
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or module == "__main__" or "<" in qualname:
        return None
    if module not in sys.modules:  # imported by the caller; importing anything else could run its code
        return None
    found: Any = importlib.import_module(module)
    for attr in qualname.split("."):
        found = getattr(found, attr, None)
    same = found is func or (inspect.ismethod(func) and found == func)
    return f"{module}:{qualname}" if same else None


def _model(model: Any) -> tuple[Any, str | None]:
    if isinstance(model, str | os.PathLike):
        return os.fspath(model), None
    name = str(getattr(getattr(model, "config", None), "name_or_path", "") or "")
    if not name:
        return None, (
            f"{_describe(model)} built in memory (no name_or_path); save it with save_pretrained(FOLDER) and "
            f"write model: FOLDER ({REWRITE})"
        )
    if hasattr(model, "peft_config"):  # a PeftModel: its base's path alone would train every weight
        return None, f"a PEFT model of {name}; write model: {name} and its adapter's settings under peft: ({REWRITE})"
    return name, None


def _dataset(data: Any, key: str) -> tuple[Any, str | None]:
    if isinstance(data, str | os.PathLike):
        return os.fspath(data), None
    if data is None:
        return None, "none given (an environment_factory's reset() gave the prompts)"
    rows = getattr(data, "num_rows", None)
    if isinstance(data, list):
        rows = len(data)
    columns = getattr(data, "column_names", None) or (sorted(data[0]) if isinstance(data, list) and data else None)
    size = "" if not isinstance(rows, int) else f" of {rows} rows"
    shown = f"{_describe(data)}{size}" + (f" (columns: {', '.join(map(str, columns))})" if columns else "")
    return None, (
        f"{shown}, given in memory; save it (e.g. Dataset.to_json('prompts.jsonl')) and write {key}: "
        f"prompts.jsonl, or a hub dataset id ({REWRITE})"
    )


def _functions(given: Any, key: str, one: Any) -> tuple[Any, list[str] | None]:
    """A list of functions (or one) by their names; the key is left out if any has none (a re-run with
    fewer functions would be another run), a note for each that has none."""
    items = list(given) if isinstance(given, list | tuple) else [given]
    recorded = [one(item, f"{key}[{position}]") for position, item in enumerate(items)]
    missing = [note for _, note in recorded if note is not None]
    if missing:
        return None, missing
    return [value for value, _ in recorded], None


def _reward(spec: Any, where: str) -> tuple[Any, str | None]:
    """A reward function, reward model (path or instance), built-in name or ``{name: ..., <params>}``."""
    if isinstance(spec, str | os.PathLike):
        return os.fspath(spec), None
    if isinstance(spec, Mapping):
        try:
            yaml.safe_dump(dict(spec))
        except yaml.YAMLError:
            return None, f"{where}: {dict(spec)!r}, whose values YAML cannot hold"
        return dict(spec), None
    if hasattr(spec, "config") and not inspect.isroutine(spec):  # a reward model instance
        name = str(getattr(spec.config, "name_or_path", "") or "")
        return (name, None) if name else (None, f"{where}: {_describe(spec)} built in memory (no name_or_path)")
    return _function(spec, where)


def _function(func: Any, where: str) -> tuple[Any, str | None]:
    if isinstance(func, str):  # a run file's own spelling (a built-in name, module:function)
        return func, None
    path = import_path(func)
    if path is not None:
        return path, None
    name = getattr(func, "__qualname__", None) or _describe(func)
    module = getattr(func, "__module__", None)
    if module == "__main__" and "<" not in str(name):
        hint = f"defined in the script being run; move it into a module (e.g. rewards.py) and write rewards:{name}"
    else:
        hint = "it has no import path (a lambda, a local function, an object); define it at a module's top level"
    return None, f"{where}: {name}: {hint} ({REWRITE})"


def _peft(config: Any) -> tuple[Any, str | None]:
    """A ``LoraConfig``'s fields that differ from its defaults (the run file's ``peft:``)."""
    if type(config).__name__ != "LoraConfig":
        return None, f"a {_describe(config)}; a run file's peft: takes LoraConfig fields only"
    default = type(config)()
    skipped = ("task_type", "peft_type", "base_model_name_or_path", "revision")
    changed = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.init and field.name not in skipped and value != getattr(default, field.name):
            changed[field.name] = sorted(value) if isinstance(value, set | frozenset) else value
    try:
        yaml.safe_dump(changed)
    except yaml.YAMLError:
        return (
            None,
            f"a LoraConfig with values YAML cannot hold ({changed!r}); write its fields under peft: ({REWRITE})",
        )
    return changed, None


def _describe(obj: Any) -> str:
    kind = type(obj)
    module = kind.__module__.split(".")[0]
    return f"a {kind.__name__}" if module == "builtins" else f"a {module}.{kind.__name__}"
