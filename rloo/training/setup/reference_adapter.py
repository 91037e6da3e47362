"""The KL reference of a PEFT policy whose adapter already changes the model: a frozen copy of
that adapter, as it was when training started.

With ``beta > 0`` the KL anchors the policy to where it started. A LoRA adapter fresh from its
init (every ``lora_B`` zero) adds exactly nothing, so the model with its adapters disabled *is*
that policy, at no extra memory (the path rloo's own ``peft_config`` takes). An adapter that was
already trained (an SFT LoRA loaded with ``PeftModel.from_pretrained(..., is_trainable=True)``),
or one whose init is not the identity (PiSSA, OLoRA, which also rewrite the base weights), is not:
disabling it would anchor the policy to the base model instead. Such a policy gets a second
adapter, :data:`REFERENCE_ADAPTER`, with the policy adapter's weights and no gradient, selected
only while reference log-probs are computed. TRL 1.16 does the same for every ``PeftModel`` it
is given (its adapter ``"ref"``); rloo skips the copy where it provably changes nothing.

The copy is part of the run's state (:mod:`rloo.training.reference_sync` checkpoints it, and
``sync_ref_model`` refreshes it); saved models and checkpoints' adapters never include it.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

REFERENCE_ADAPTER = "rloo_reference"
_LORA_FACTORS = {"lora_A", "lora_embedding_A"}
_LORA_OUTPUT_FACTORS = {"lora_B", "lora_embedding_B"}  # all zero: the adapter adds exactly 0


def adapter_state(model: Any, adapter: str) -> dict[str, Tensor]:
    """``adapter``'s weights keyed as peft saves them (the adapter's name left out), so that one
    adapter's state loads into another; the base model's embeddings are never included."""
    from peft import get_peft_model_state_dict

    state: dict[str, Tensor] = get_peft_model_state_dict(model, adapter_name=adapter, save_embedding_layers=False)
    return state


def load_adapter_state(model: Any, adapter: str, state: dict[str, Tensor]) -> None:
    """Copy ``state`` (keyed as :func:`adapter_state` keys it) into ``adapter``'s weights, in place."""
    from peft import set_peft_model_state_dict

    result: Any = set_peft_model_state_dict(model, state, adapter_name=adapter)
    if result.unexpected_keys:
        raise ValueError(f"adapter {adapter!r} has no weights named {sorted(result.unexpected_keys)[:3]}")


def adapters_are_identity(model: Any) -> bool:
    """True when the active adapters provably leave the model's outputs unchanged: LoRA whose
    weights are only ``lora_A`` and ``lora_B`` factors, every ``lora_B`` zero (``W x + B A x`` is
    then ``W x`` exactly). Proving this costs one look at each B; any other adapter (DoRA's magnitudes,
    ``modules_to_save``, IA3, prompt tuning, ...) is taken as changing the model."""
    for adapter in model.active_adapters:
        if model.peft_config[adapter].peft_type != "LORA":
            return False
        for key, value in adapter_state(model, adapter).items():
            parts = set(key.split("."))
            if parts & _LORA_OUTPUT_FACTORS:
                if value.any():
                    return False
            elif not parts & _LORA_FACTORS:
                return False
    return True


def add_reference_adapter(model: Any) -> None:
    """Add (or, for a model a previous trainer had, overwrite) :data:`REFERENCE_ADAPTER`: the active
    adapter's weights and dtype, frozen, dropout off. Its config is the policy's with LoRA's plain
    init (PiSSA's or OLoRA's would rewrite the base weights again); nothing else changes trainability."""
    active = model.active_adapters
    if len(active) != 1:
        raise ValueError(
            f"the PeftModel has {len(active)} active adapters {active}; rloo's KL reference is a frozen copy of one "
            "trained adapter: merge them into one (or activate one with model.set_adapter), or set beta=0"
        )
    policy_state = adapter_state(model, active[0])
    trainable = [(param, param.requires_grad) for param in model.parameters()]
    if REFERENCE_ADAPTER not in model.peft_config:
        config = copy.deepcopy(model.peft_config[active[0]])
        config.inference_mode = True
        if hasattr(config, "init_lora_weights"):
            config.init_lora_weights = True
        # peft's autocast makes bf16/fp16 adapter weights float32: only where the policy's are
        float32 = any(value.dtype == torch.float32 for value in policy_state.values())
        model.add_adapter(REFERENCE_ADAPTER, config, autocast_adapter_dtype=float32)
    load_adapter_state(model, REFERENCE_ADAPTER, policy_state)
    for param, requires_grad in trainable:
        param.requires_grad_(requires_grad)
    for name, param in model.named_parameters():
        if REFERENCE_ADAPTER in name.split("."):
            param.requires_grad_(False)
    for name, module in model.named_modules():
        if REFERENCE_ADAPTER in name.split(".") and isinstance(module, nn.Dropout):
            module.p = 0.0


def has_reference_adapter(model: nn.Module) -> bool:
    return REFERENCE_ADAPTER in (getattr(model, "peft_config", None) or {})


def saved_adapters(model: nn.Module) -> dict[str, Any]:
    """``save_pretrained``'s keyword that leaves the reference adapter out ({} without one): a saved
    model or checkpoint holds the trained policy's adapter(s) only."""
    if not has_reference_adapter(model):
        return {}
    return {"selected_adapters": [name for name in model.peft_config if name != REFERENCE_ADAPTER]}  # type: ignore[union-attr]


@contextlib.contextmanager
def reference_adapter_selected(model: Any) -> Iterator[Any]:
    """``model`` with :data:`REFERENCE_ADAPTER` active instead of the policy's adapter. peft's
    ``set_adapter`` also switches which adapter requires grad: every parameter's flag is put back."""
    policy_adapter = model.active_adapter
    trainable = [(param, param.requires_grad) for param in model.parameters()]
    model.set_adapter(REFERENCE_ADAPTER, inference_mode=True)
    try:
        yield model
    finally:
        model.set_adapter(policy_adapter)
        for param, requires_grad in trainable:
            param.requires_grad_(requires_grad)
