"""``sync_ref_model``'s checkpoint state: the reference's parameters copied to the CPU one tensor
at a time (issue 25), never cloned on the device first. (The refresh itself and its resume are tested
with the trainer in ``tests/training/setup/test_models.py``.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rloo.training.reference_sync import ReferenceSync


class RecordOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.ops.append((func.__name__, kwargs.get("device")))
        return func(*args, **kwargs)


def test_the_saved_reference_is_copied_to_the_cpu_without_a_device_clone() -> None:
    policy, reference = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    args = SimpleNamespace(sync_ref_model=True, ref_model_mixup_alpha=0.5, ref_model_sync_steps=1)
    sync = ReferenceSync(policy=policy, reference=reference, args=args)
    with RecordOps() as recorded:
        state = sync.state()
    names = [name for name, _ in recorded.ops]
    assert "clone.default" not in names  # before: p.detach().clone() on the reference's device
    assert [device for name, device in recorded.ops if name.startswith("_to_copy")] == [torch.device("cpu")] * 2
    assert all(value.device.type == "cpu" for value in state.values())
    reference.weight.data.add_(1.0)
    assert not torch.equal(state["weight"], reference.weight)  # a copy, not a view of the live reference


def test_restore_takes_the_saved_state_and_refuses_another_models() -> None:
    # issue 41: restore takes the checkpoint's entry (the parts list hands it over), not the folder to re-read
    args = SimpleNamespace(sync_ref_model=True, ref_model_mixup_alpha=0.5, ref_model_sync_steps=1)
    saved = ReferenceSync(policy=torch.nn.Linear(4, 3), reference=torch.nn.Linear(4, 3), args=args).state()
    reference = torch.nn.Linear(4, 3)
    ReferenceSync(policy=torch.nn.Linear(4, 3), reference=reference, args=args).restore(saved)
    assert torch.equal(reference.weight, saved["weight"]) and torch.equal(reference.bias, saved["bias"])
    other = ReferenceSync(policy=torch.nn.Linear(4, 2), reference=torch.nn.Linear(4, 2, bias=False), args=args)
    with pytest.raises(ValueError, match="saved reference model does not match this model's parameters"):
        other.restore(saved)
