"""The YAML run file of ``rloo train``: parsing, overrides, type checks, and building its parts.

A run file holds every :class:`rloo.config.RLOOConfig` field at the top level, plus:

- ``model``: a local folder or hub id;
- ``dataset``: a path or hub id, or ``{path, name, split, columns, as_chat, system_prompt, limit}``;
- ``eval_dataset``: the same shape (optional);
- ``reward_funcs``: a list of built-in names, ``module:function`` strings, reward-model
  folders, or ``{name: ..., weight: ..., <params>}``;
- ``peft``: ``peft.LoraConfig`` fields (optional).

Command-line overrides are ``dotted.key=value`` with YAML values (``peft.r=8``).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rloo.config import RLOOConfig
from rloo.suggest import unknown_name_error

RUN_KEYS = ("model", "dataset", "eval_dataset", "reward_funcs", "peft")
DATASET_KEYS = ("path", "name", "split", "columns", "as_chat", "system_prompt", "limit")
# names often written for LoraConfig fields, too far from them for difflib to suggest
PEFT_ALIASES = {"rank": "r", "alpha": "lora_alpha", "dropout": "lora_dropout", "target": "target_modules"}


def _unknown_key(key: str, valid: list[str] | tuple[str, ...], where: str = "") -> ValueError:
    aliases = PEFT_ALIASES if where == "peft." else None
    return unknown_name_error("key", key, valid, where=where, list_choices=True, aliases=aliases)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=1"`` -> ``(["a", "b"], 1)``; the value is parsed as YAML."""
    if "=" not in text:
        raise ValueError(f"override {text!r} must look like key=value (e.g. learning_rate=1e-5)")
    key, raw = text.split("=", 1)
    if not key:
        raise ValueError(f"override {text!r} has an empty key")
    return key.split("."), yaml.safe_load(raw) if raw else None


def apply_overrides(values: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of ``values`` with each ``dotted.key=value`` set (nested dicts created)."""
    result = dict(values)
    for text in overrides:
        path, value = parse_override(text)
        node = result
        for part in path[:-1]:
            child = node.get(part)
            if isinstance(child, str) and part in ("dataset", "eval_dataset"):
                child = {"path": child}
            node[part] = dict(child) if isinstance(child, dict) else {}
            node = node[part]
        node[path[-1]] = value
    return result


def _type_name(annotation: str) -> str:
    return annotation.replace(" | None", " or null")


def _as_float(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


_CONVERT: dict[str, Any] = {"float": _as_float}
_CHECK: dict[str, Any] = {
    "bool": lambda v: isinstance(v, bool),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, float),
    "str": lambda v: isinstance(v, str),
    "list": lambda v: isinstance(v, list | tuple),
    "tuple": lambda v: isinstance(v, list | tuple),
    "dict": lambda v: isinstance(v, dict),
}


def coerce_field(name: str, value: Any, annotation: str) -> Any:
    """Check a YAML value against an RLOOConfig annotation, converting where lossless.

    YAML reads ``1e-5`` as a string; a float field accepts it. A single string is accepted
    for ``list[str]``. A wrong type raises a ``ValueError`` naming the key and the type.
    """
    if value is None:
        if "None" in annotation:
            return None
        raise ValueError(f"`{name}` expects {_type_name(annotation)}, got null")
    base = annotation.replace(" | None", "").strip()
    kind = base.split("[")[0]
    if base == "list[str]" and isinstance(value, str):
        value = [value]
    value = _CONVERT.get(kind, lambda v: v)(value)
    if not _CHECK.get(kind, lambda v: True)(value):
        raise ValueError(f"`{name}` expects {_type_name(annotation)}, got {value!r} ({type(value).__name__})")
    return value


def _annotation_text(annotation: Any) -> str:
    """``int``, ``int | None``, ``list[str]``: the text of a resolved annotation.

    ``str(int)`` is ``"<class 'int'>"``, so a plain class is named by its ``__name__``.
    """
    text = annotation.__name__ if type(annotation) is type else str(annotation)
    return text.replace("typing.", "").replace("NoneType", "None")


def build_config(values: dict[str, Any]) -> RLOOConfig:
    """An ``RLOOConfig`` from the config part of a run file, with key and type checks."""
    annotations = typing.get_type_hints(RLOOConfig)
    fields = {f.name: f for f in dataclasses.fields(RLOOConfig) if f.init}
    valid = [*fields, *RUN_KEYS]
    checked = {}
    for key, value in values.items():
        if key not in fields:
            raise _unknown_key(key, valid)
        checked[key] = coerce_field(key, value, _annotation_text(annotations[key]))
    return RLOOConfig(**checked)


@dataclass
class DatasetSpec:
    path: str
    name: str | None = None
    split: str = "train"
    columns: dict[str, str] | None = None
    as_chat: bool = False
    system_prompt: str | None = None
    limit: int | None = None

    @classmethod
    def parse(cls, value: Any, where: str) -> DatasetSpec:
        if isinstance(value, str):
            return cls(path=value)
        if not isinstance(value, dict):
            raise ValueError(f"`{where}` must be a path/hub id or a mapping with keys {list(DATASET_KEYS)}")
        for key in value:
            if key not in DATASET_KEYS:
                raise _unknown_key(key, DATASET_KEYS, where=f"{where}.")
        if "path" not in value:
            raise ValueError(f"`{where}.path` is required: a local file/folder or a hub dataset id")
        return cls(**value)

    def load(self) -> Any:
        """The prompts as a ``datasets.Dataset`` (local file/folder, else the hub)."""
        import datasets

        from rloo.data.loading import load_prompt_dataset

        if Path(self.path).exists():
            raw = _load_local(self.path, self.split)
        else:
            raw = datasets.load_dataset(self.path, self.name, split=self.split)
        if self.columns:
            missing = [c for c in self.columns if c not in raw.column_names]
            if missing:
                raise ValueError(f"dataset columns {missing} not found; the dataset has {raw.column_names}")
            raw = raw.rename_columns(self.columns)
        if self.limit is not None:
            raw = raw.select(range(min(self.limit, len(raw))))
        if self.as_chat:
            raw = raw.map(lambda row: {"prompt": self._as_chat(row["prompt"])})
        return load_prompt_dataset(raw)

    def _as_chat(self, text: str) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*messages, {"role": "user", "content": text}]


def _load_local(path: str, split: str) -> Any:
    import datasets

    suffix = Path(path).suffix.lower()
    if suffix in (".json", ".jsonl"):
        return datasets.load_dataset("json", data_files=path, split="train")
    if suffix == ".parquet":
        return datasets.load_dataset("parquet", data_files=path, split="train")
    loaded = datasets.load_from_disk(path)
    return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded


@dataclass
class RunSpec:
    """Everything ``rloo train`` needs, checked."""

    model: str
    dataset: DatasetSpec
    eval_dataset: DatasetSpec | None
    reward_funcs: list[Any]
    peft: dict[str, Any] | None
    config: RLOOConfig

    def to_dict(self) -> dict[str, Any]:
        """The resolved run file, written to ``output_dir/config.yaml``."""
        return {
            "model": self.model,
            "dataset": dataclasses.asdict(self.dataset),
            "eval_dataset": None if self.eval_dataset is None else dataclasses.asdict(self.eval_dataset),
            # inline `weight:`s are already in reward_weights; keeping both would fail a re-run
            "reward_funcs": [
                {k: v for k, v in r.items() if k != "weight"} if isinstance(r, dict) else r for r in self.reward_funcs
            ],
            "peft": self.peft,
            **self.config.to_dict(),
        }


def parse_run(values: dict[str, Any]) -> RunSpec:
    """Check a run mapping (a loaded YAML file with overrides applied)."""
    for key in ("model", "dataset", "reward_funcs"):
        if values.get(key) in (None, "", []):
            raise ValueError(f"the run file needs `{key}`")
    if not isinstance(values["model"], str):
        raise ValueError(f"`model` expects a path or hub id (str), got {values['model']!r}")
    rewards = values["reward_funcs"]
    rewards = rewards if isinstance(rewards, list) else [rewards]
    config_values = {k: v for k, v in values.items() if k not in RUN_KEYS}
    weights = [r.get("weight") if isinstance(r, dict) else None for r in rewards]
    if any(w is not None for w in weights):
        if config_values.get("reward_weights") is not None:
            raise ValueError("give reward weights either as `weight:` in reward_funcs or as `reward_weights`, not both")
        config_values["reward_weights"] = [1.0 if w is None else float(w) for w in weights]
    peft = values.get("peft")
    if peft is not None and not isinstance(peft, dict):
        raise ValueError(f"`peft` expects a mapping of peft.LoraConfig fields, got {peft!r}")
    if peft is not None:
        build_peft_config(peft)  # checked now, so a typo fails before the model and data load
    return RunSpec(
        model=values["model"],
        dataset=DatasetSpec.parse(values["dataset"], "dataset"),
        eval_dataset=None
        if values.get("eval_dataset") is None
        else DatasetSpec.parse(values["eval_dataset"], "eval_dataset"),
        reward_funcs=rewards,
        peft=peft,
        config=build_config(config_values),
    )


def load_run_file(path: str | Path, overrides: list[str] | None = None) -> RunSpec:
    """Read a YAML run file, apply ``dotted.key=value`` overrides, and check everything."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"run file {str(file)!r} not found")
    loaded = yaml.safe_load(file.read_text()) or {}
    if not isinstance(loaded, dict):
        raise ValueError(f"run file {str(file)!r} must be a YAML mapping of keys to values")
    return parse_run(apply_overrides(loaded, overrides or []))


def build_peft_config(values: dict[str, Any]) -> Any:
    """A ``peft.LoraConfig`` from a mapping; an unknown key names the closest field."""
    from peft import LoraConfig

    names = [f.name for f in dataclasses.fields(LoraConfig)]
    for key in values:
        if key not in names:
            raise _unknown_key(key, names, where="peft.")
    return LoraConfig(**{"task_type": "CAUSAL_LM", **values})
