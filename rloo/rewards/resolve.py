"""The one reward resolver: whatever names a reward function -> a callable.

Both entry points use it: ``RLOOTrainer(reward_funcs=...)`` (TRL's items: callables, reward
model paths or hub ids, ``PreTrainedModel`` instances with their tokenizer in
``reward_processing_classes``) and the run file's ``reward_funcs`` (built-in names,
``module:function`` strings, reward-model folders, ``{name: ..., weight: ..., <params>}``).

Where we depart from TRL: a string is first a built-in name, then an import string, then
a local folder or hub id of a reward model (TRL: always a model id); a string that is none
of these gets a "did you mean" error instead of a failed download.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rloo.config.trl.legacy import reward_funcs_or_reward_model
from rloo.data.loading import column_names
from rloo.rewards.builtins import BUILTIN_REWARDS, RUNS_MODEL_CODE
from rloo.rewards.calling import CallPolicy, RewardFunc, RewardFunctions
from rloo.suggest import unknown_name_error

_IMPORT_STRING = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
# owner/name: what a hub id looks like (a local path that does not exist is not one)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def resolve_rewards(reward_funcs: Any, reward_processing_classes: Any = None) -> list[RewardFunc]:
    """TRL-style ``reward_funcs`` (one item or a list) -> a list of callables.

    ``reward_processing_classes`` gives the tokenizer of a reward model at the same position
    (a single item or a list; ``None`` entries where not needed).
    """
    specs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    if not specs:
        raise ValueError("give at least one reward function")
    tokenizers = _per_function(reward_processing_classes, len(specs))
    return [
        resolve_reward(spec, tokenizer, position)
        for position, (spec, tokenizer) in enumerate(zip(specs, tokenizers, strict=True))
    ]


def check_code_rewards(reward_funcs: Any) -> None:
    """Build now the named built-ins that run completions' code (``code_execution``), so that a missing
    sandbox (:class:`rloo.rewards.sandbox.SandboxUnavailable`) or a bad setting of theirs is refused before
    the policy loads; the trainer resolves every reward function after it."""
    specs = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    for position, spec in enumerate(specs):
        name = spec.get("name") if isinstance(spec, Mapping) else spec
        if isinstance(name, str) and name in RUNS_MODEL_CODE:
            resolve_reward(spec, position=position)


def _per_function(reward_processing_classes: Any, n: int) -> list[Any]:
    if reward_processing_classes is None:
        return [None] * n
    if isinstance(reward_processing_classes, list | tuple):
        items = list(reward_processing_classes)
    else:
        items = [reward_processing_classes]
    if len(items) != n:
        raise ValueError(
            f"reward_processing_classes has {len(items)} entries for {n} reward functions: the counts must match; "
            "give one per reward function (None where not needed)"
        )
    return items


def processing_classes(funcs: list[RewardFunc]) -> list[Any]:
    """Each reward function's tokenizer (a reward model's, given or loaded with it), None for the
    others: TRL's ``trainer.reward_processing_classes``."""
    return [getattr(func, "tokenizer", None) for func in funcs]


def resolve_reward(spec: Any, tokenizer: Any = None, position: int = 0) -> RewardFunc:
    """Build one reward function.

    - a ``PreTrainedModel``: a reward model, its tokenizer from ``tokenizer``;
    - a built-in name (a key of :data:`rloo.rewards.builtins.BUILTIN_REWARDS`), built with
      default parameters, or ``{"name": <built-in>, **params}``. A ``"weight"`` key is ignored
      here: the run file reads it into ``reward_weights``;
    - ``"package.module:function"``: imported and returned as is; in the dict form with
      parameters it is a factory, called with them;
    - a local folder holding ``config.json``, or a hub id (``owner/name``): a reward model
      (``tokenizer`` or the dict form's ``tokenizer`` / ``batch_size`` params apply);
    - a callable: returned as is.

    Built-in names win over a folder of the same name. Anything else raises ``ValueError``
    listing the built-in names, with a "did you mean" suggestion.
    """
    from transformers import PreTrainedModel

    if isinstance(spec, PreTrainedModel):  # callable too, so it is checked first
        if tokenizer is None:
            raise ValueError(
                f"reward function {position} is a {type(spec).__name__} instance; pass its tokenizer "
                f"in reward_processing_classes at position {position}"
            )
        return _build("reward_model", BUILTIN_REWARDS["reward_model"], {"path_or_model": spec, "tokenizer": tokenizer})
    if isinstance(spec, Mapping):
        params = dict(spec)
        params.pop("weight", None)
        if "name" not in params:
            raise ValueError(f"reward spec {dict(spec)!r} has no 'name'; {_choices()}")
        return _resolve_name(params.pop("name"), params, tokenizer)
    if isinstance(spec, str | os.PathLike):
        return _resolve_name(spec, {}, tokenizer)
    if callable(spec):
        return spec  # type: ignore[no-any-return]
    raise ValueError(
        f"reward function {position} ({spec!r}) is a {type(spec).__name__}; give a callable, a name, a dict, "
        f"a reward model path or hub id, or a PreTrainedModel. {_choices()}"
    )


def _resolve_name(name: Any, params: dict[str, Any], tokenizer: Any) -> RewardFunc:
    if isinstance(name, str) and name in BUILTIN_REWARDS:
        return _build(name, BUILTIN_REWARDS[name], params)
    if isinstance(name, str) and _IMPORT_STRING.fullmatch(name):
        target = import_callable(name)
        return _build(name, target, params) if params else target
    if tokenizer is not None:
        params = {"tokenizer": tokenizer, **params}
    if isinstance(name, str | os.PathLike) and Path(name).is_dir():
        if not (Path(name) / "config.json").is_file():
            raise ValueError(f"reward folder {os.fspath(name)!r} has no config.json, so it is not a reward model")
        return _build("reward_model", BUILTIN_REWARDS["reward_model"], {"path_or_model": os.fspath(name), **params})
    if isinstance(name, str) and _HUB_ID.fullmatch(name) and not Path(name).exists():
        return _build("reward_model", BUILTIN_REWARDS["reward_model"], {"path_or_model": name, **params})
    raise ValueError(f"{unknown_name_error('reward', name, BUILTIN_REWARDS)}. {_choices()}")


def _build(name: str, factory: Callable[..., Any], params: dict[str, Any]) -> RewardFunc:
    """Call ``factory(**params)``, naming the reward and its parameters if they do not fit."""
    try:
        signature: inspect.Signature | None = inspect.signature(factory)
    except (TypeError, ValueError):  # a callable without a signature checks its own arguments
        signature = None
    if signature is not None:
        try:
            signature.bind(**params)
        except TypeError as error:
            accepted = ", ".join(signature.parameters) or "none"
            raise ValueError(f"reward {name!r}: bad parameters {params!r} ({error}); it accepts: {accepted}") from None
    func = factory(**params)
    if not callable(func):
        raise ValueError(f"reward {name!r} built a {type(func).__name__}, not a callable")
    return func  # type: ignore[no-any-return]


def import_callable(spec: str, what: str = "reward") -> Any:
    """The callable a ``package.module:attribute`` string names (``what``: the word errors use)."""
    if not _IMPORT_STRING.fullmatch(spec):
        raise ValueError(f"{what} {spec!r} is not an import string: write 'package.module:function'")
    module_name, _, attr_path = spec.partition(":")
    # a module in the current directory is importable without PYTHONPATH=. (as in TRL's CLI); one next to a run
    # file is too (rloo.cli.run_file.read_run_file puts its folder on the path)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"{what} {spec!r}: could not import module {module_name!r}: {error}") from error
    for attr in attr_path.split("."):
        if not hasattr(obj, attr):
            raise ValueError(f"{what} {spec!r}: module {module_name!r} has no attribute {attr_path!r}")
        obj = getattr(obj, attr)
    if not callable(obj):
        raise ValueError(f"{what} {spec!r} is a {type(obj).__name__}, not a callable")
    return obj


def _choices() -> str:
    return (
        f"Built-in rewards: {', '.join(BUILTIN_REWARDS)}; or give 'package.module:function' "
        "or a reward model folder (with config.json)"
    )


def run_rewards(
    args: Any,
    reward_funcs: Any,
    reward_model: Any,
    reward_processing_classes: Any,
    dataset: Any,
    warn: Callable[[str], None] | None = None,
    extra: Sequence[Any] = (),
    extra_columns: Sequence[str] = (),
) -> RewardFunctions:
    """The run's :class:`RewardFunctions`: TRL's ``reward_funcs`` (or the older ``reward_model``) and ``extra``
    ones (environments' ``get_reward``, weight 1 as TRL's, which then make ``reward_funcs`` optional); every
    function's arguments checked against the training ``dataset``'s columns and ``extra_columns`` (None: not
    checked; a ``rollout_func`` adds columns of its own). ``warn``: where the reward watchdog reports a call
    that runs long (:class:`rloo.rewards.calling.CallPolicy`)."""
    funcs = []
    if reward_funcs is not None or reward_model is not None or not extra:
        funcs = resolve_rewards(reward_funcs_or_reward_model(reward_funcs, reward_model), reward_processing_classes)
    weights = None if args.reward_weights is None else list(args.reward_weights)
    if extra and weights is not None:
        if len(weights) != len(funcs):
            raise ValueError(
                f"RLOOConfig.reward_weights has {len(weights)} entries but there are {len(funcs)} reward functions "
                "(the environments' get_reward weigh 1 and need none); give one weight per function"
            )
        weights += [1.0] * len(extra)
    rewards = RewardFunctions(
        [*funcs, *extra], weights, CallPolicy(args.reward_timeout, args.reward_error_policy, warn=warn)
    )
    if dataset is not None:
        rewards.check_arguments([*column_names(dataset), *extra_columns])
    return rewards
