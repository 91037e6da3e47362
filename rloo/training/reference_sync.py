"""``sync_ref_model``: TR-DPO's reference refresh (Gorbatovski et al., 2024), as TRL's
``SyncRefModelCallback`` does it.

Every ``ref_model_sync_steps`` optimizer steps the frozen reference moves toward the policy:
``theta_ref <- alpha * theta + (1 - alpha) * theta_ref`` for every parameter
(``ref_model_mixup_alpha``; alpha = 1 copies the policy). The KL penalty then anchors the policy
to a recent version of itself instead of the initial model.

The refreshed reference is part of the run's state: checkpoints store its parameters (in the
training state, no pickle), and resuming restores them, so a resumed run refreshes from the
same reference as the uninterrupted one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rloo.training.checkpointing.checkpoints import load_checkpoint_states
from rloo.training.setup.models import is_peft_model


class ReferenceSync:
    """The refresh schedule of one run; does nothing unless ``args.sync_ref_model``."""

    KEY = "reference"  # its entry in a checkpoint's training state

    def __init__(self, *, policy: nn.Module, reference: nn.Module | None, args: Any) -> None:
        self.enabled = bool(args.sync_ref_model)
        self.alpha, self.every = args.ref_model_mixup_alpha, args.ref_model_sync_steps
        self.policy, self.reference = policy, reference
        if self.enabled and (reference is None or is_peft_model(policy)):
            raise ValueError(
                "RLOOConfig.sync_ref_model=True needs a separate reference model, but under LoRA/PEFT the reference "
                "is the policy with its adapters disabled (nothing to refresh); drop sync_ref_model, or train "
                "without peft_config"
            )

    @torch.no_grad()
    def after_step(self, global_step: int) -> bool:
        """Refresh the reference when ``global_step`` is a multiple of the period; True if it did."""
        if not self.enabled or global_step % self.every != 0:
            return False
        assert self.reference is not None
        mix_into(self.reference, self.policy, self.alpha)
        return True

    def state(self) -> dict[str, Tensor]:
        """The reference's parameters for a checkpoint ({} when disabled: it is the initial model),
        each copied straight to the CPU: no second copy of the reference on the device."""
        if not self.enabled or self.reference is None:
            return {}
        return {name: p.detach().to("cpu", copy=True) for name, p in self.reference.named_parameters()}

    @torch.no_grad()
    def restore(self, checkpoint: Path) -> None:
        """Load the reference saved in ``checkpoint``'s training state; one saved without sync has
        none, and the reference stays the initial model."""
        if not self.enabled or self.reference is None:
            return
        saved = load_checkpoint_states(checkpoint)[1].get(self.KEY) or {}
        parameters = dict(self.reference.named_parameters())
        if set(saved) != set(parameters):
            raise ValueError(f"{checkpoint}: its saved reference model does not match this model's parameters")
        for name, value in saved.items():
            parameters[name].copy_(value.to(parameters[name].device, parameters[name].dtype))


def mix_into(target: nn.Module, source: nn.Module, alpha: float) -> None:
    """``target <- alpha * source + (1 - alpha) * target``, parameter by parameter, in place."""
    sources = dict(source.named_parameters())
    for name, param in target.named_parameters():
        param.data.lerp_(sources[name].data.to(param.dtype), alpha)
