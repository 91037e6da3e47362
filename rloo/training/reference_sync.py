"""``sync_ref_model``: TR-DPO's reference refresh (Gorbatovski et al., 2024), as TRL's
``SyncRefModelCallback`` does it.

Every ``ref_model_sync_steps`` optimizer steps the frozen reference moves toward the policy:
``theta_ref <- alpha * theta + (1 - alpha) * theta_ref`` for every parameter
(``ref_model_mixup_alpha``; alpha = 1 copies the policy). The KL penalty then anchors the policy
to a recent version of itself instead of the initial model.

The refreshed reference is part of the run's state: checkpoints store its parameters (in the
training state, no pickle), and resuming restores them, so a resumed run refreshes from the
same reference as the uninterrupted one.

A PEFT policy whose reference is a frozen copy of its adapter
(:mod:`rloo.training.setup.reference_adapter`) has that copy stored always, refreshed or not:
resuming must anchor to the adapter the run started from, not to the resumed policy. Its refresh
mixes the adapter's weights (LoRA's A and B each), the parameters the policy trains; for
``alpha < 1`` that is not the mix of the merged weights (``B A`` is not linear in them), and
``alpha = 1`` copies the policy exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from rloo.training.parallel.fsdp import full_state_loading
from rloo.training.setup.reference_adapter import (
    REFERENCE_ADAPTER,
    adapter_state,
    has_reference_adapter,
    load_adapter_state,
)


class ReferenceSync:
    """The refresh schedule of one run (nothing unless ``args.sync_ref_model``), and the reference's
    part of a checkpoint: a refreshed reference model's, or a PEFT policy's reference adapter."""

    KEY = "reference"  # its entry in a checkpoint's training state

    def __init__(self, *, policy: nn.Module, reference: nn.Module | None, args: Any) -> None:
        self.enabled = bool(args.sync_ref_model)
        self.alpha, self.every = args.ref_model_mixup_alpha, args.ref_model_sync_steps
        self.policy, self.reference = policy, reference
        self.adapter = has_reference_adapter(policy)  # the reference is a copy of the policy's adapter
        if self.enabled and reference is None and not self.adapter:
            raise ValueError(
                "RLOOConfig.sync_ref_model=True needs a reference to refresh, but under LoRA/PEFT with fresh adapters "
                "the reference is the policy with its adapters disabled (nothing to refresh); drop sync_ref_model, "
                "or train without peft_config"
            )

    @torch.no_grad()
    def after_step(self, global_step: int) -> bool:
        """Refresh the reference when ``global_step`` is a multiple of the period; True if it did."""
        if not self.enabled or global_step % self.every != 0:
            return False
        if self.adapter:
            mix_reference_adapter(self.policy, self.alpha)
        else:
            assert self.reference is not None
            mix_into(self.reference, self.policy, self.alpha)
        return True

    def _adapter(self) -> dict[str, Tensor]:
        return adapter_state(self.policy, REFERENCE_ADAPTER)

    def state(self) -> dict[str, Tensor]:
        """The reference's parameters for a checkpoint ({} when it is the initial model and not an
        adapter copy), each copied straight to the CPU: no second copy of the reference on the device.
        Every process must call it: a sharded (FSDP) adapter's tensors are gathered."""
        if self.adapter:
            return {key: _full(value).to("cpu", copy=True) for key, value in self._adapter().items()}
        if not self.enabled or self.reference is None:
            return {}
        return {name: p.detach().to("cpu", copy=True) for name, p in self.reference.named_parameters()}

    @torch.no_grad()
    def restore(self, saved: dict[str, Any]) -> None:
        """Load the reference :meth:`state` saved (a checkpoint's entry under :attr:`KEY`)."""
        if self.adapter:
            self._restore_adapter(saved)
            return
        if not self.enabled or self.reference is None:
            return
        parameters = dict(self.reference.named_parameters())
        if set(saved) != set(parameters):
            raise ValueError("the checkpoint's saved reference model does not match this model's parameters")
        for name, value in saved.items():
            parameters[name].copy_(value.to(parameters[name].device, parameters[name].dtype))

    def _restore_adapter(self, saved: dict[str, Any]) -> None:
        """The reference adapter as saved; a checkpoint of an older rloo has none, and it stays the
        copy of the adapter this trainer was given."""
        if not saved:
            return
        if set(saved) != set(self._adapter()):
            raise ValueError("the checkpoint's saved reference adapter does not match this model's adapter")
        with full_state_loading(self.policy):
            load_adapter_state(self.policy, REFERENCE_ADAPTER, saved)


def _full(tensor: Tensor) -> Tensor:
    """A sharded (FSDP2 ``DTensor``) tensor gathered whole; any other as it is."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if callable(gather) else tensor.detach()


def mix_into(target: nn.Module, source: nn.Module, alpha: float) -> None:
    """``target <- alpha * source + (1 - alpha) * target``, parameter by parameter, in place."""
    sources = dict(source.named_parameters())
    for name, param in target.named_parameters():
        param.data.lerp_(sources[name].data.to(param.dtype), alpha)


def mix_reference_adapter(model: Any, alpha: float) -> None:
    """The reference adapter ``<- alpha * policy adapter + (1 - alpha) * reference adapter``, weight
    by weight (:mod:`rloo.training.setup.reference_adapter`)."""
    policy = adapter_state(model, model.active_adapter)
    reference = adapter_state(model, REFERENCE_ADAPTER)
    mixed = {key: value.lerp(policy[key].to(value.dtype), alpha) for key, value in reference.items()}
    load_adapter_state(model, REFERENCE_ADAPTER, mixed)
