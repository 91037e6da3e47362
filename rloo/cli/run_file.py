"""The YAML run file of ``rloo train``: parsing, overrides, type checks, and building its parts.

A run file holds every :class:`rloo.config.RLOOConfig` field at the top level, plus:

- ``model``: a local folder or hub id;
- ``dataset``: a path or hub id, or ``{path, name, split, columns, as_chat, system_prompt, limit}``;
- ``eval_dataset``: the same shape (optional);
- ``reward_funcs``: a list of built-in names, ``module:function`` strings, reward-model
  folders, or ``{name: ..., weight: ..., <params>}``;
- ``peft``: ``peft.LoraConfig`` fields (optional);
- ``tools``: functions the model may call, multi-turn (optional): ``python`` (the sandboxed Python tool;
  ``{name: python, sandbox: none, timeout: ...}`` to set it) or ``package.module:function`` strings;
- ``compute_metrics``: a ``package.module:function`` string (optional): task metrics of each evaluation
  (:mod:`rloo.training.monitoring.compute_metrics`); ``rloo eval --run-file`` reports them too.

Command-line overrides are ``dotted.key=value`` with YAML values (``peft.r=8``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rloo.cli.files import annotation_text, read_yaml_mapping, yaml_problem
from rloo.cli.trl_args import TRL_SCRIPT_FIELDS
from rloo.config import RLOOConfig
from rloo.config.trl.grpo_names import GRPO_NAMES
from rloo.config.trl.legacy import REFUSED, RENAMED
from rloo.data.loading import DatasetSource
from rloo.suggest import unknown_name_error
from rloo.tools.agent import resolve_tools

RUN_KEYS = ("model", "dataset", "eval_dataset", "reward_funcs", "peft", "tools", "compute_metrics")
# the TRL flags that give a required key (rloo.cli.trl_args)
_TRL_FLAG = {
    "model": "--model_name_or_path",
    "dataset": "--dataset_name",
    "reward_funcs": "--reward_funcs or --reward_model_name_or_path",
}
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
    try:
        value = yaml.safe_load(raw) if raw else None
    except yaml.YAMLError as error:
        raise ValueError(f"override {text!r}: the value is not valid YAML: {yaml_problem(error)}") from None
    return key.split("."), value


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
    return annotation.replace(" | None", " or null").replace(" | ", " or ")


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

    YAML reads ``1e-5`` as a string; a float field accepts it. A value may be any alternative of
    the annotation (``list[str] | str``: a list, or one name). A wrong type raises a ``ValueError``
    naming the key and the type.
    """
    if value is None:
        if "None" in annotation:
            return None
        raise ValueError(f"`{name}` expects {_type_name(annotation)}, got null")
    kinds = [alternative.strip().split("[")[0] for alternative in annotation.split(" | ")]
    for kind in (kind for kind in kinds if kind != "None"):  # list[str] | str: a list, or one name
        converted = _CONVERT.get(kind, lambda v: v)(value)
        if _CHECK.get(kind, lambda v: True)(converted):
            return converted
    raise ValueError(f"`{name}` expects {_type_name(annotation)}, got {value!r} ({type(value).__name__})")


def build_config(values: dict[str, Any]) -> RLOOConfig:
    """An ``RLOOConfig`` from the config part of a run file, with key and type checks."""
    annotations = typing.get_type_hints(RLOOConfig)
    fields = {f.name: f for f in dataclasses.fields(RLOOConfig) if f.init}
    valid = [*fields, *RUN_KEYS]
    checked = {}
    for key, value in values.items():
        name = RENAMED.get(key, key)  # an older TRL name (kl_coef): RLOOConfig maps it and warns
        # a refused older name: RLOOConfig says what to set; a GRPO name (loss_type): RLOOConfig translates it
        if name not in fields and key not in REFUSED and key not in GRPO_NAMES:
            raise _unknown_key(key, valid)
        checked[key] = coerce_field(key, value, annotation_text(annotations[name])) if name in fields else value
    return RLOOConfig(**checked)


@dataclass
class RunFile:
    """Everything ``rloo train`` needs, checked."""

    model: str
    dataset: DatasetSource
    eval_dataset: DatasetSource | None
    reward_funcs: list[Any]
    peft: dict[str, Any] | None
    config: RLOOConfig
    tools: list[Any] = dataclasses.field(default_factory=list)  # names, or {name: python, <its settings>}
    compute_metrics: str | None = None  # package.module:function

    def to_dict(self) -> dict[str, Any]:
        """The resolved run file, written to ``output_dir/config.yaml``."""
        return {
            "model": self.model,
            "dataset": self.dataset.to_dict(),
            "eval_dataset": None if self.eval_dataset is None else self.eval_dataset.to_dict(),
            # inline `weight:`s are already in reward_weights; keeping both would fail a re-run
            "reward_funcs": [
                {k: v for k, v in r.items() if k != "weight"} if isinstance(r, dict) else r for r in self.reward_funcs
            ],
            "peft": self.peft,
            **({"tools": self.tools} if self.tools else {}),
            **({"compute_metrics": self.compute_metrics} if self.compute_metrics else {}),
            **self.config.to_dict(),
        }


def parse_run(values: dict[str, Any]) -> RunFile:
    """Check a run mapping (a loaded YAML file with overrides applied)."""
    for key in ("model", "dataset", "reward_funcs"):
        if values.get(key) in (None, "", []):
            raise ValueError(f"the run file needs `{key}` (on the command line: {_TRL_FLAG[key]})")
    if not isinstance(values["model"], str):
        raise ValueError(f"`model` expects a path or hub id (str), got {values['model']!r}")
    rewards = values["reward_funcs"]
    rewards = rewards if isinstance(rewards, list) else [rewards]
    config_values = {k: v for k, v in values.items() if k not in RUN_KEYS}
    weights = [r.get("weight") if isinstance(r, dict) else None for r in rewards]
    for position, weight in enumerate(weights):
        if weight is not None and (isinstance(weight, bool) or not isinstance(weight, int | float)):
            raise ValueError(f"`reward_funcs[{position}].weight` expects a number, got {weight!r}")
    if any(w is not None for w in weights):
        if config_values.get("reward_weights") is not None:
            raise ValueError("give reward weights either as `weight:` in reward_funcs or as `reward_weights`, not both")
        config_values["reward_weights"] = [1.0 if w is None else float(w) for w in weights]
    peft = values.get("peft")
    if peft is not None and not isinstance(peft, dict):
        raise ValueError(f"`peft` expects a mapping of peft.LoraConfig fields, got {peft!r}")
    if peft is not None:
        build_peft_config(peft)  # checked now, so a typo fails before the model and data load
    tools = values.get("tools") or []
    tools = tools if isinstance(tools, list) else [tools]
    resolve_tools(tools)  # checked now, as the rewards are
    compute_metrics = values.get("compute_metrics")
    check_compute_metrics(compute_metrics)
    return RunFile(
        model=values["model"],
        dataset=DatasetSource.parse(values["dataset"], "dataset"),
        eval_dataset=None
        if values.get("eval_dataset") is None
        else DatasetSource.parse(values["eval_dataset"], "eval_dataset"),
        reward_funcs=rewards,
        peft=peft,
        config=build_config(config_values),
        tools=tools,
        compute_metrics=compute_metrics,
    )


def check_compute_metrics(spec: Any) -> None:
    """A run file's ``compute_metrics``: None or a ``package.module:function`` string that imports (checked
    before anything loads, so a typo costs no model load)."""
    from rloo.rewards.resolve import import_callable

    if spec is None:
        return
    if not isinstance(spec, str):
        raise ValueError(
            f"`compute_metrics` expects a 'package.module:function' string, got {spec!r}; the function takes an "
            "EvalPrediction of the evaluation completions and returns a dict of metrics"
        )
    import_callable(spec, what="compute_metrics")


def load_run_file(
    path: str | Path | None, overrides: list[str] | None = None, flags: dict[str, Any] | None = None
) -> RunFile:
    """Read a YAML run file (None: none, everything comes from ``flags``), set ``flags`` (run-file
    keys from TRL's command-line flags: :mod:`rloo.cli.trl_args`), apply ``dotted.key=value``
    overrides, and check everything."""
    loaded = {} if path is None else read_run_file(path)
    refuse_trl_config(path, loaded)
    return parse_run(apply_overrides({**loaded, **(flags or {})}, overrides or []))


def refuse_trl_config(path: str | Path | None, loaded: dict[str, Any]) -> None:
    """A TRL config (``model_name_or_path:``, ``dataset_name:``...) given where a run file goes: say
    to pass it with ``--config``, as ``trl rloo`` takes it, rather than "needs `model`"; a model's
    ``config.json`` (its ``dtype`` is a TRL flag's name too): say to name the model instead."""

    if is_model_config(loaded):
        raise ValueError(
            f"{str(path)!r} is a model's config.json, not a run file: name the model in a run file (model: "
            f"{Path(str(path)).parent}) or on the command line (--model_name_or_path {Path(str(path)).parent})"
        )
    trl_keys = [key for key in loaded if key in TRL_SCRIPT_FIELDS and key not in RUN_KEYS]
    if trl_keys:
        raise ValueError(
            f"{str(path)!r} holds TRL's flags ({', '.join(trl_keys)}), not run-file keys: it is a TRL config; "
            f"give it with --config, as trl rloo takes it: rloo train --config {path}"
        )


def is_model_config(values: dict[str, Any]) -> bool:
    """Whether a loaded mapping is a model's ``config.json`` (transformers writes ``model_type`` and
    ``architectures``; a run file holds neither)."""
    return "model" not in values and ("model_type" in values or "architectures" in values)


def read_run_file(path: str | Path) -> dict[str, Any]:
    """The mapping of a YAML run file, or a ``ValueError`` saying what is wrong with the file."""
    file = Path(path)
    if file.is_dir():
        raise ValueError(f"run file {str(file)!r} is a folder; give the YAML file (e.g. {str(file / 'config.yaml')!r})")
    if not file.is_file():
        raise ValueError(f"run file {str(file)!r} not found")
    loaded = read_yaml_mapping(file, "run file", f"run file {str(file)!r}", "keys to values")
    # its module:function rewards, tools and hooks may live next to it (as a script's imports), wherever rloo runs
    folder = str(file.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    return loaded


def build_peft_config(values: dict[str, Any]) -> Any:
    """A ``peft.LoraConfig`` from a mapping; an unknown key names the closest field."""
    from peft import LoraConfig

    names = [f.name for f in dataclasses.fields(LoraConfig)]
    for key in values:
        if key not in names:
            raise _unknown_key(key, names, where="peft.")
    return LoraConfig(**{"task_type": "CAUSAL_LM", **values})


def build_trainer(run_file: RunFile) -> Any:
    """An ``RLOOTrainer`` for the run file; the resolved run file becomes its ``config.yaml``."""
    from rloo.rewards.resolve import resolve_rewards
    from rloo.training.trainer import RLOOTrainer

    trainer = RLOOTrainer(
        model=run_file.model,
        reward_funcs=resolve_rewards(run_file.reward_funcs),
        args=run_file.config,
        train_dataset=run_file.dataset.load(),
        eval_dataset=None if run_file.eval_dataset is None else run_file.eval_dataset.load("eval_dataset"),
        peft_config=None if run_file.peft is None else build_peft_config(run_file.peft),
        tools=resolve_tools(run_file.tools),
        compute_metrics=run_file.compute_metrics,
    )
    trainer.run_config = run_file.to_dict()
    return trainer


def train_from_run_file(run_file: RunFile, resume: bool | str, console: Any) -> Any:
    """Train (``train()`` writes the run report too)."""
    from rloo.training.checkpointing.run_folder import check_fresh_run

    output_dir = run_file.config.output_dir  # None: the trainer claims a fresh one
    if resume and output_dir is None:
        raise ValueError(
            "resuming needs the run's folder, and output_dir is not set: rloo train RUN_FOLDER/config.yaml --resume "
            "(its config.yaml names it), or add output_dir=RUN_FOLDER"
        )
    # under torchrun / accelerate launch every process runs this; only the first touches files
    main = os.environ.get("RANK", "0") == "0"
    if not resume and main and output_dir is not None:  # before the model loads: a refusal should be instant
        check_fresh_run(Path(output_dir), run_file.config.overwrite_output_dir)
    trainer = build_trainer(run_file)
    trainer.train(resume_from_checkpoint=resume or None)
    report = trainer.output_dir / "report.html"
    if trainer.ranks.is_main:
        built = f", report in {report}" if report.is_file() else ""  # else train() warned why
        console.print(f"done: model in {trainer.output_dir / 'final'}{built}", highlight=False)
    trainer.ranks.barrier()  # every process exits once the main one has written everything
    return trainer
