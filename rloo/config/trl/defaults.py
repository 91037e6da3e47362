"""TRL's defaults: a field of ``RLOOConfig`` (``GRPOConfig``) named as a field of TRL 1.16's ``RLOOConfig``
(``GRPOConfig``) has TRL's default, but for the deliberate differences listed here, each with its reason.

- :data:`DIFFERENCES`: the defaults that differ, TRL's value and why rloo's is another. ``tests/config/
  test_trl_defaults.py`` compares every shared field with the installed TRL's class (a field that differs and is
  not listed fails it, as does a listed TRL default TRL no longer has); ``docs/migrating-from-trl.md``'s table is
  :func:`differences_markdown` (``scripts/regen_docs.py`` writes it); the trainer prints the differences in effect
  once at start-up (:func:`start_up_note`).
- :data:`TRL_SPELLINGS`: TRL's default values rloo spells otherwise, read as rloo's when given (a TRL config
  that writes every default out works unchanged).

A default "as rloo has it" is the value a default config reads back (``beta`` is None in the declaration and
0.05 once the preset resolves it) or the declared one (``epsilon_high`` None: equal to ``epsilon``, in both);
a single name for a list field (``report_to='none'``) is that one-item list, as transformers reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rloo.config.fields.declare import default_value

__all__ = ["DIFFERENCES", "TRL_SPELLINGS", "DefaultDifference", "differences_markdown", "start_up_note"]


@dataclass(frozen=True)
class DefaultDifference:
    """One field whose default is not TRL's: ``trl``, TRL 1.16's default (in ``RLOOConfig`` and ``GRPOConfig``
    alike), ``reason``, and ``in_effect(config, precision)``: whether leaving the field at rloo's default makes
    this run differ from what TRL's default would have done (``precision``: accelerate's mixed precision)."""

    name: str
    trl: Any
    reason: str
    in_effect: Callable[[Any, str], bool] = lambda config, precision: True


DIFFERENCES: tuple[DefaultDifference, ...] = (
    DefaultDifference(
        "bf16",
        None,
        "both `None`, read differently: TRL's `None` is `True` unless `fp16` is set, an error on a CPU and on a "
        "GPU without bf16; rloo's is bf16 autocast where the GPU has it and fp32 elsewhere, so the default "
        "config runs anywhere",
        lambda config, precision: precision == "no" and not config.fp16,
    ),
    DefaultDifference(
        "disable_dropout",
        False,
        "the ratio and the KL compare log-probs of the policy that sampled with those of the policy being "
        "trained; with dropout on, each forward is another random network and the two differ on the same "
        "weights",
    ),
    DefaultDifference(
        "gradient_checkpointing",
        True,
        "it buys memory with about a fifth more time per training pass: rloo leaves that trade to runs that "
        "need the memory (`rloo plan` says when; the GPU recipe in docs/installation.md turns it on)",
    ),
    DefaultDifference(
        "num_train_epochs",
        3.0,
        "an online RL run samples new completions each time a prompt comes round, so a second pass over the "
        "prompts is a choice of run length, not a need: rloo's default run sees each prompt once (only with "
        "`max_steps=-1`, the default; a set `max_steps` decides the length)",
        lambda config, precision: config.max_steps == -1,
    ),
    DefaultDifference(
        "optim",
        "adamw_torch_fused",
        "rloo's runs and tests (the weights fingerprint, the performance guard's op counts) are pinned to "
        "torch's plain AdamW update; the fused kernel makes the same update up to float rounding, faster on a "
        "GPU: set `optim='adamw_torch_fused'` for TRL's",
    ),
    DefaultDifference(
        "per_device_eval_batch_size",
        8,
        "rloo evaluates whole prompts, each with all its completions; `None` evaluates as many prompts at "
        "once as a training generation batch samples, which the run has shown to fit in memory (8 completions "
        "are one prompt at GRPO's K = 8)",
        lambda config, precision: config.eval_strategy != "no",
    ),
)

# TRL's default values rloo spells otherwise: given as TRL writes them, they are read as rloo's spelling
TRL_SPELLINGS: Mapping[str, Mapping[Any, Any]] = {
    # 'auto' pads to a multiple of 128 on AWS Neuron only, where rloo does not run; elsewhere it pads nothing
    "pad_to_multiple_of": {"auto": None},
}


def as_rloo_spelling(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with TRL's spelling of a default replaced by rloo's (:data:`TRL_SPELLINGS`)."""
    out = dict(kwargs)
    for name, spellings in TRL_SPELLINGS.items():
        value = out.get(name)
        if isinstance(value, str) and value in spellings:
            out[name] = spellings[value]
    return out


def rloo_default(config_class: type, name: str) -> Any:
    """The declared default of field ``name`` of ``config_class`` (``RLOOConfig`` or ``GRPOConfig``)."""
    (declared,) = [f for f in dataclasses.fields(config_class) if f.name == name]
    return default_value(declared)


def differences_markdown(config_class: type) -> str:
    """The table of docs/migrating-from-trl.md: field, TRL's default, rloo's, and why."""
    rows = ["| field | TRL 1.16 default | rloo default | why |", "|---|---|---|---|"]
    for difference in DIFFERENCES:
        ours = rloo_default(config_class, difference.name)
        rows.append(f"| `{difference.name}` | `{difference.trl!r}` | `{ours!r}` | {difference.reason} |")
    return "\n".join(rows)


def start_up_note(config: Any, precision: str) -> str | None:
    """One line naming the differences in effect in this run (each field left at rloo's default, where the
    difference changes something), or None when there are none; printed once when training starts."""
    shown = []
    for difference in DIFFERENCES:
        ours = rloo_default(type(config), difference.name)
        if getattr(config, difference.name) == ours and difference.in_effect(config, precision):
            here = " (fp32 here)" if difference.name == "bf16" else ""
            shown.append(f"{difference.name}={ours!r}{here} (TRL: {difference.trl!r})")
    if not shown:
        return None
    return (
        "defaults that differ from TRL's in this run: " + ", ".join(shown) + "; set a field to TRL's value to "
        "match it (why each differs: docs/migrating-from-trl.md)"
    )
