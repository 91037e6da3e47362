"""TRL's command line on ``rloo train``: a ``trl rloo ...`` command line runs with the program name
changed (``rloo train --model_name_or_path M --dataset_name D --reward_funcs accuracy_reward ...``).

TRL parses ``trl rloo`` with ``HfArgumentParser`` over its script arguments, ``RLOOConfig`` and
``ModelConfig``: every flag is ``--field value`` or ``--field=value``; a bool alone means true
(``--use_peft``) or takes ``true``/``false``; a list takes the values up to the next flag
(``--reward_funcs a b``); a dict is JSON (rloo: a list item in braces too, so that
``--reward_funcs '{"name": "code_execution", "sandbox": "none"}'`` and ``--tools python`` set what a run
file's items do); ``--config FILE.yaml`` reads the same keys from a file
(flags win; its ``env:`` mapping sets environment variables). Here the flags become rloo's run file
(:mod:`rloo.cli.run_file`), so both are checked the same way:

==========================================================  ====================================
TRL                                                         run file
==========================================================  ====================================
``--model_name_or_path M``                                  ``model: M``
``--dataset_name D --dataset_config C``                     ``dataset: {path: D, name: C,``
``--dataset_train_split S`` (default train)                 ``split: S}``
``--dataset_test_split T`` (with an ``eval_strategy``        ``eval_dataset`` (the same, split T)
other than ``no``, as TRL's script, or ``--eval_steps N``
alone: rloo's eval_strategy follows eval_steps)
``--reward_model_name_or_path R --reward_funcs a b``        ``reward_funcs: [R, a, b]`` (TRL's
                                                            names and dotted import paths read)
``--use_peft --lora_r 16 --lora_alpha 32 ...``              ``peft:`` (TRL's LoRA defaults)
``--dtype --attn_implementation --model_revision``          ``model_init_kwargs``
``--load_in_4bit --bnb_4bit_quant_type --use_bnb_nested_quant`` ``model_init_kwargs.quantization_config``
(``--load_in_8bit``)                                        (QLoRA with ``--use_peft``, as TRL's)
``--gradient_checkpointing_use_reentrant``                  ``gradient_checkpointing_kwargs``
any ``RLOOConfig`` field, ``model``/``dataset``/... keys    itself
==========================================================  ====================================

Where we depart from TRL: an unknown flag is an error with the closest name (HfArgumentParser in
``trl rloo`` ignores unknown arguments); dataset mixtures (``--datasets``) and ``--dataset_streaming``
are refused naming the flag; LoRA flags without
``--use_peft``, and the bitsandbytes details without quantized loading, are ignored as in TRL, with a
warning.
"""

from __future__ import annotations

import dataclasses
import os
import typing
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rloo.cli.files import annotation_text, read_yaml_mapping
from rloo.config import RLOOConfig
from rloo.config.fields.declare import default_value, trl_name
from rloo.config.trl.grpo_names import GRPO_NAMES
from rloo.config.trl.legacy import REFUSED, RENAMED, refusal_reason
from rloo.suggest import unknown_name_error

# TRL's script and ModelConfig fields rloo reads, by kind: "bool", "list", "dict" or "value"
# (one token); the kind decides how many tokens a flag takes
TRL_SCRIPT_FIELDS = {
    "config": "value",
    "model_name_or_path": "value",
    "dataset_name": "value",
    "dataset_config": "value",
    "dataset_train_split": "value",
    "dataset_test_split": "value",
    "dataset_streaming": "bool",
    "datasets": "list",
    "reward_model_name_or_path": "value",
    "reward_funcs": "list",
    "model_revision": "value",
    "dtype": "value",
    "torch_dtype": "value",
    "attn_implementation": "value",
    "use_peft": "bool",
    "lora_r": "value",
    "lora_alpha": "value",
    "lora_dropout": "value",
    "lora_target_modules": "list",
    "lora_target_parameters": "list",
    "lora_modules_to_save": "list",
    "lora_task_type": "value",
    "use_rslora": "bool",
    "use_dora": "bool",
    "load_in_4bit": "bool",
    "load_in_8bit": "bool",
    "bnb_4bit_quant_type": "value",
    "use_bnb_nested_quant": "bool",
    "gradient_checkpointing_use_reentrant": "bool",
    "ignore_bias_buffers": "bool",
}
# TRL's reward names (trl.rewards, as its rloo script registers them) -> rloo's built-ins
TRL_REWARDS: dict[str, Any] = {
    "accuracy_reward": "accuracy",
    "reasoning_accuracy_reward": "reasoning_accuracy",
    "think_format_reward": "think_format",
    "get_soft_overlong_punishment": {
        "name": "soft_overlong_punishment",
        "max_completion_len": 1280,
        "soft_punish_cache": 256,
    },
}
# ModelConfig's LoRA flags -> peft.LoraConfig fields, and TRL's defaults under --use_peft
LORA_FLAGS = {
    "lora_r": "r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "lora_target_modules": "target_modules",
    "lora_target_parameters": "target_parameters",
    "lora_modules_to_save": "modules_to_save",
    "lora_task_type": "task_type",
    "use_rslora": "use_rslora",
    "use_dora": "use_dora",
}
TRL_LORA_DEFAULTS = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "task_type": "CAUSAL_LM"}
REFUSED_FLAGS = {
    "datasets": "dataset mixtures are not supported by rloo train; give one --dataset_name, or build the mixture "
    "with datasets and pass it to RLOOTrainer(train_dataset=...)",
    "dataset_streaming": "rloo train reads its dataset into memory; stream from the Python API instead: "
    "RLOOTrainer(train_dataset=load_dataset(..., streaming=True), args=RLOOConfig(max_steps=...))",
    "ignore_bias_buffers": "rloo sums gradients itself and never broadcasts buffers, so there are none to ignore; "
    "drop the flag",
}
_TRUE, _FALSE = ("true", "yes", "1", "t", "y"), ("false", "no", "0", "f", "n")


def flag_kinds() -> dict[str, str]:
    """Every flag ``rloo train`` takes in TRL's form and its kind: TRL's script and model fields,
    every ``RLOOConfig`` field (older TRL names and GRPO's names too) and the run file's own keys."""
    annotations = typing.get_type_hints(RLOOConfig)
    kinds = {"model": "value", "dataset": "value", "eval_dataset": "value", "peft": "dict", "tools": "list"}
    for field in dataclasses.fields(RLOOConfig):
        if field.init:
            kinds[field.name] = _kind(annotation_text(annotations[field.name]))
    kinds.update({old: kinds[new] for old, new in RENAMED.items() if new in kinds})
    kinds.update({old: "value" for old in [*REFUSED, *GRPO_NAMES]})
    return {**kinds, **TRL_SCRIPT_FIELDS}


def _kind(annotation: str) -> str:
    base = annotation.replace(" | None", "").replace("Optional[", "").strip()
    if base == "bool":
        return "bool"
    if base.startswith(("list", "tuple", "Sequence", "collections.abc.Sequence")):
        return "list"
    if base.startswith(("dict", "Mapping", "collections.abc.Mapping")):
        return "dict"
    return "value"


def unknown_flag(name: str, kinds: Mapping[str, str], where: str) -> ValueError:
    """A flag that is no field: TRL's reason where rloo refuses a known TRL name (``--use_vllm``,
    an older TRL name), else the closest flag."""
    reason = refusal_reason(name)
    if reason is not None:
        return ValueError(f"`{where}{name}` is a TRL setting rloo does not support: {reason}")
    return unknown_name_error("flag", name, kinds, where=where)


def parse_tokens(tokens: list[str]) -> tuple[str | None, list[str], dict[str, Any]]:
    """``rloo train``'s arguments -> ``(run file, key=value overrides, TRL flags)``: a ``--flag``
    takes the tokens its kind says; ``key=value`` is an override; any other token is the run file."""
    kinds = flag_kinds()
    run_file: str | None = None
    overrides: list[str] = []
    flags: dict[str, Any] = {}
    position = 0
    while position < len(tokens):
        token = tokens[position]
        position += 1
        if token.startswith("--"):
            name, sep, inline = token[2:].partition("=")
            name = name.replace("-", "_")
            if name not in kinds:
                raise unknown_flag(name, kinds, where="--")
            values = [inline] if sep else []
            if not sep:
                position, values = _take_values(tokens, position, kinds[name])
            flags[name] = _flag_value(name, kinds[name], values)
        elif "=" in token:
            overrides.append(token)
        elif run_file is None:
            run_file = token
        else:
            raise ValueError(
                f"override {token!r} must look like key=value (e.g. learning_rate=1e-5); the run file is "
                f"{run_file!r}, and flags are --field value"
            )
    return run_file, overrides, flags


def _take_values(tokens: list[str], position: int, kind: str) -> tuple[int, list[str]]:
    """The tokens a flag of ``kind`` takes from ``position``; the next position."""
    following = tokens[position:]
    if kind == "list":
        taken = next((i for i, t in enumerate(following) if t.startswith("--")), len(following))
        return position + taken, following[:taken]
    if kind == "bool":
        if following and following[0].lower() in _TRUE + _FALSE:
            return position + 1, following[:1]
        return position, []
    if not following or following[0].startswith("--"):
        return position, []
    return position + 1, following[:1]


def _flag_value(name: str, kind: str, values: list[str]) -> Any:
    """A flag's value from its tokens: a bool, a list (each item YAML; one in braces a mapping), a mapping
    (JSON/YAML), or one YAML value (``1e-5`` stays text here; the run file's type check reads it as a float)."""
    if kind == "bool":
        if not values:
            return True
        if values[0].lower() not in _TRUE + _FALSE:
            raise ValueError(f"--{name} takes true or false, got {values[0]!r}")
        return values[0].lower() in _TRUE
    if kind == "list":  # an item in braces is a mapping: --reward_funcs '{"name": "code_execution", ...}'
        return [_yaml(name, value) if value.lstrip().startswith("{") else _item(value) for value in values]
    if not values:
        raise ValueError(f"--{name} needs a value, e.g. --{name} VALUE or --{name}=VALUE")
    if kind == "dict":
        parsed = _yaml(name, values[0])
        if not isinstance(parsed, dict):
            raise ValueError(f"--{name} takes a JSON object, e.g. --{name} '{{\"key\": 1}}', got {values[0]!r}")
        return parsed
    return _scalar(values[0])


def _scalar(text: str) -> Any:
    """A YAML scalar, except that text YAML would read as something else (``a: b``, ``[x``) stays text."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if text in ("None", "none"):
        return None  # HfArgumentParser's spelling of an unset optional
    return value if isinstance(value, str | int | float | bool) or value is None else text


def _item(text: str) -> Any:
    """A list flag's item: a scalar, but never None: ``--report_to none`` is the name ``none`` (no tracker)."""
    return text if text in ("None", "none") else _scalar(text)


def _yaml(name: str, text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(f"--{name}: {text!r} is not valid JSON/YAML ({error})") from None


def read_config_file(path: str) -> dict[str, Any]:
    """TRL's ``--config FILE.yaml``: a mapping of the same keys as the flags; its ``env:`` mapping is
    set in the environment (as TRL's parser does) and not returned."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--config {path!r}: no such file; give a YAML file of TRL flags (model_name_or_path: ...)")
    values = read_yaml_mapping(file, "--config", f"--config {path!r}", "flags to values")
    env = values.pop("env", None) or {}
    if not isinstance(env, dict):
        raise ValueError(f"--config {path!r}: `env` must map variable names to values")
    os.environ.update({str(key): str(value) for key, value in env.items()})
    kinds = flag_kinds()
    for key in values:
        if key not in kinds:
            raise unknown_flag(key, kinds, where=f"--config {path}: ")
    return values


def trl_to_run(values: Mapping[str, Any]) -> dict[str, Any]:
    """TRL's script and model flags -> run-file keys; every other key as given."""
    values = dict(values)
    for name, reason in REFUSED_FLAGS.items():
        if values.pop(name, None) not in (None, False, []):
            raise ValueError(f"--{name}: {reason}")
    if values.get("load_in_4bit") and values.get("load_in_8bit"):
        raise ValueError("--load_in_4bit and --load_in_8bit: give one (TRL's script would take 4 bits)")
    quantization = [flag for flag in ("bnb_4bit_quant_type", "use_bnb_nested_quant") if values.get(flag)]
    if quantization and not values.get("load_in_4bit"):  # TRL reads them only with --load_in_4bit
        flags = ", ".join(f"--{flag}" for flag in quantization)
        warnings.warn(f"{flags} ignored: they only apply to --load_in_4bit", stacklevel=2)
    run = {key: value for key, value in values.items() if key not in TRL_SCRIPT_FIELDS}
    _set_once(run, "model", values.get("model_name_or_path"), "--model_name_or_path")
    if values.get("dataset_name") is not None:
        _datasets(run, values)
    rewards = [values["reward_model_name_or_path"]] if values.get("reward_model_name_or_path") else []
    rewards += [_reward(name) for name in values.get("reward_funcs") or []]
    if rewards:
        _set_once(run, "reward_funcs", rewards, "--reward_funcs / --reward_model_name_or_path")
    _model_init_kwargs(run, values)
    _peft(run, values)
    if values.get("gradient_checkpointing_use_reentrant") is not None:
        kwargs = dict(run.get("gradient_checkpointing_kwargs") or {})
        kwargs["use_reentrant"] = values["gradient_checkpointing_use_reentrant"]
        run["gradient_checkpointing_kwargs"] = kwargs
    return run


def _set_once(run: dict[str, Any], key: str, value: Any, flag: str) -> None:
    if value is None:
        return
    if run.get(key) not in (None, value):
        raise ValueError(f"{flag} and `{key}` give two different values ({value!r}, {run[key]!r}); give one")
    run[key] = value


def _datasets(run: dict[str, Any], values: Mapping[str, Any]) -> None:
    """TRL's script: the train split, and the test split when the run evaluates: an eval_strategy other
    than 'no', or (rloo's rule: RLOOConfig.evaluation_strategy) eval_steps without an eval_strategy."""
    source = {"path": values["dataset_name"], "name": values.get("dataset_config")}
    _set_once(run, "dataset", {**source, "split": values.get("dataset_train_split") or "train"}, "--dataset_name")
    strategy = values.get("eval_strategy")
    if strategy not in (None, "no") or (strategy is None and values.get("eval_steps") is not None):
        split = values.get("dataset_test_split") or "test"
        _set_once(run, "eval_dataset", {**source, "split": split}, "--dataset_test_split")
    elif values.get("dataset_test_split") is not None:
        warnings.warn(
            f"--dataset_test_split {values['dataset_test_split']} ignored: nothing asks for evaluation; "
            "add --eval_steps N to evaluate on it every N steps",
            stacklevel=3,
        )


def _reward(name: Any) -> Any:
    """A ``--reward_funcs`` item: TRL's name, a dotted import path (``my_lib.rewards.f`` ->
    ``my_lib.rewards:f``), or whatever a run file takes (built-in names, ``module:function``, folders)."""
    if not isinstance(name, str):
        return name
    if name in TRL_REWARDS:
        return TRL_REWARDS[name]
    from rloo.rewards.builtins import BUILTIN_REWARDS

    if "." in name and ":" not in name and name not in BUILTIN_REWARDS and not Path(name).exists():
        module, _, function = name.rpartition(".")
        return f"{module}:{function}"
    return name


def _model_init_kwargs(run: dict[str, Any], values: Mapping[str, Any]) -> None:
    given = {
        "revision": values.get("model_revision"),
        "dtype": values.get("dtype") or values.get("torch_dtype"),
        "attn_implementation": values.get("attn_implementation"),
    }
    given = {key: value for key, value in given.items() if value is not None}
    if values.get("load_in_4bit"):  # TRL's get_quantization_config: QLoRA (with --use_peft)
        dtype = given.get("dtype", "float32")
        given["quantization_config"] = {
            "load_in_4bit": True,
            "bnb_4bit_compute_dtype": dtype,
            "bnb_4bit_quant_type": values.get("bnb_4bit_quant_type") or "nf4",
            "bnb_4bit_use_double_quant": bool(values.get("use_bnb_nested_quant")),
            "bnb_4bit_quant_storage": dtype,
        }
    elif values.get("load_in_8bit"):
        given["quantization_config"] = {"load_in_8bit": True}
    if given:  # model_init_kwargs given as well win, as in TRL's script
        run["model_init_kwargs"] = {**given, **(run.get("model_init_kwargs") or {})}


def _peft(run: dict[str, Any], values: Mapping[str, Any]) -> None:
    lora = {LORA_FLAGS[flag]: values[flag] for flag in LORA_FLAGS if values.get(flag) is not None}
    if not values.get("use_peft"):
        if lora:
            flags = ", ".join(f"--{flag}" for flag in LORA_FLAGS if values.get(flag) is not None)
            warnings.warn(f"{flags} ignored without --use_peft (as in TRL); add --use_peft to train LoRA", stacklevel=2)
        return
    _set_once(run, "peft", {**TRL_LORA_DEFAULTS, **lora}, "--use_peft")


def run_values(tokens: list[str]) -> tuple[str | None, list[str], dict[str, Any]]:
    """``(run file, overrides, run-file keys from --config and the flags)`` of ``rloo train``'s
    arguments; flags win over ``--config``."""
    run_file, overrides, flags = parse_tokens(tokens)
    config = read_config_file(flags.pop("config")) if flags.get("config") else {}
    return run_file, overrides, trl_to_run({**config, **flags})


def fields_help() -> str:
    """``rloo train --help``'s list of every config field: ``--name (default): what it does``, one
    paragraph each, then TRL's script and model flags."""
    paragraphs = ["Config fields: each is a run-file key, a key=value override and a --field value flag."]
    for field in dataclasses.fields(RLOOConfig):
        if field.init:
            trl = "" if trl_name(field) in (None, field.name) else f" TRL: {trl_name(field)}."
            paragraphs.append(f"--{field.name} (default {default_value(field)!r}): {field.metadata['help']}{trl}")
    paragraphs.append(
        "TRL's script and model flags: "
        + ", ".join(f"--{name}" for name in TRL_SCRIPT_FIELDS if name not in REFUSED_FLAGS)
        + " (see docs/migrating-from-trl.md)."
    )
    return "\n\n".join(paragraphs)
