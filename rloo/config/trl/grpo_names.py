"""GRPO's names for settings rloo has under its own: TRL's ``GRPOConfig`` ``loss_type``,
``scale_rewards`` and ``importance_sampling_level``, as ``RLOOConfig`` keywords.

A value that means what one of rloo's knobs does is translated to it (``config.yaml`` records the
knob); a value rloo has no equal for is refused with the reason, never approximated:

- ``loss_type`` is how the token losses are aggregated: ``grpo`` (each completion's token mean,
  then the mean over completions), ``dapo`` (the tokens of the whole optimizer step), ``dr_grpo``
  (the token sum over completions x ``max_completion_length``) are ``loss_aggregation``'s
  ``seq_mean_token_mean``, ``token_mean``, ``seq_mean_token_sum_norm``.
- ``scale_rewards`` is the advantage's standard-deviation scaling, around GRPO's group-mean
  baseline: ``group``/True, ``batch``, ``none``/False are ``advantage_estimator``'s ``grpo``,
  ``reinforce_pp_baseline``, ``group_mean``.
- ``importance_sampling_level='token'`` is ``ratio_level='token'``; GSPO's ``sequence`` ratio
  (the mean log-ratio over tokens) is not rloo's sequence ratio (their sum), so it is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# GRPO name -> (rloo knob, {GRPO value: rloo value}, {GRPO value: why rloo refuses it})
_LOSS_TYPES = {"grpo": "seq_mean_token_mean", "dapo": "token_mean", "dr_grpo": "seq_mean_token_sum_norm"}
_OTHER_OBJECTIVE = "rloo has no {} objective (it clips the ratio, PPO-style, or not at all); use loss_type in "
_REFUSED_LOSS_TYPES = {
    "bnpo": "it normalizes by the tokens of each micro-batch, so the loss depends on per_device_train_batch_size; "
    "loss_type='dapo' (loss_aggregation='token_mean') normalizes by the tokens of the whole optimizer step",
    **{
        name: _OTHER_OBJECTIVE.format(name.upper()) + str(sorted(_LOSS_TYPES))
        for name in ("cispo", "sapo", "luspo", "vespo")
    },
}
_SCALE_REWARDS = {
    "group": "grpo",
    "true": "grpo",
    "batch": "reinforce_pp_baseline",
    "none": "group_mean",
    "false": "group_mean",
}
GRPO_NAMES: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
    "loss_type": ("loss_aggregation", _LOSS_TYPES, _REFUSED_LOSS_TYPES),
    "scale_rewards": ("advantage_estimator", _SCALE_REWARDS, {}),
    "importance_sampling_level": (
        "ratio_level",
        {"token": "token"},
        {
            "sequence": "GSPO's sequence ratio is exp(mean_t log-ratio), rloo's ratio_level='sequence' is "
            "exp(sum_t log-ratio); use importance_sampling_level='token', or set ratio_level='sequence' "
            "knowing it differs"
        },
    ),
}


def translate_grpo_names(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``RLOOConfig`` keywords with each GRPO name replaced by rloo's knob (see the module docstring);
    a ``ValueError`` for a value rloo refuses, an unknown value, or the knob also given otherwise."""
    out = dict(kwargs)
    for name, (knob, values, refused) in GRPO_NAMES.items():
        if name not in out:
            continue
        given = out.pop(name)
        key = str(given).lower() if isinstance(given, bool | str) else given
        if key in refused:
            raise ValueError(f"RLOOConfig({name}={given!r}) is not supported: {refused[key]}")
        if key not in values:
            choices = sorted({*values, *refused} - {"true", "false"})
            raise ValueError(f"RLOOConfig({name}={given!r}) is not one of GRPO's values: choose one of {choices}")
        if out.get(knob) is not None and out[knob] != values[key]:
            raise ValueError(
                f"RLOOConfig got {name}={given!r} (GRPO's name for {knob}={values[key]!r}) and {knob}={out[knob]!r}; "
                f"give only one"
            )
        out[knob] = values[key]
    return out


def grpo_value(name: str, knob_value: Any) -> str | None:
    """GRPO's value of ``name`` (``loss_type``, ``scale_rewards``, ``importance_sampling_level``) for the rloo
    knob's ``knob_value``, as TRL scripts read it back from the config; None where GRPO has no equal."""
    _, values, _ = GRPO_NAMES[name]
    names = [grpo for grpo, knob in values.items() if knob == knob_value and grpo not in ("true", "false")]
    return str(names[0]) if names else None
