"""The optimizers ``RLOOConfig.optim`` names and the ``optim_args`` each takes, as transformers'
optimizer factory reads them (:mod:`rloo.training.setup.optimization` builds them)."""

from __future__ import annotations

from rloo.suggest import did_you_mean

# transformers' OptimizerNames that rloo's optimizer step supports (rloo.training.setup.optimization builds them)
OPTIMIZERS: tuple[str, ...] = (
    "adamw_torch",
    "adamw_torch_fused",
    "adafactor",
    "sgd",
    "adagrad",
    "rmsprop",
    "adamw_8bit",
    "paged_adamw_8bit",
)
# the optim_args keys transformers' optimizer factory reads, by optimizer (it ignores the others)
OPTIM_ARGS: dict[str, tuple[str, ...]] = {
    "sgd": ("momentum", "dampening", "weight_decay", "nesterov"),
    "adagrad": ("lr_decay", "weight_decay", "eps"),
    "rmsprop": ("momentum", "alpha", "eps", "weight_decay", "centered"),
}
_FLAGS = ("nesterov", "centered")  # read as booleans: true/false, 1/0, yes/no


def parse_optim_args(optim: str, text: str) -> dict[str, str]:
    """``"momentum=0.9,nesterov=true"`` -> ``{"momentum": "0.9", "nesterov": "true"}``, each key one
    that transformers' factory reads for ``optim`` and each value of the type it converts to. A
    ``ValueError`` says what is wrong (the caller names the field)."""
    keys = OPTIM_ARGS.get(optim)
    if keys is None:
        raise ValueError(
            f"optim={optim!r} takes no optim_args (transformers ignores them for it); "
            f"optim_args apply to {', '.join(OPTIM_ARGS)}. Set the adam_*/weight_decay fields instead",
        )
    parsed: dict[str, str] = {}
    for item in filter(None, text.replace(" ", "").split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"{item!r} is not key=value; write e.g. 'momentum=0.9,nesterov=true'")
        if key not in keys:
            raise ValueError(f"{optim} reads {list(keys)}, not {key!r}{did_you_mean(key, keys)}")
        if key in _FLAGS and value.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ValueError(f"{key} is true or false, got {value!r}")
        if key not in _FLAGS:
            try:
                float(value)
            except ValueError:
                raise ValueError(f"{key} is a number, got {value!r}") from None
        parsed[key] = value
    return parsed
