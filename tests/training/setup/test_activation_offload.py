"""Activation offloading (``activation_offloading``): the saved activations of a training pass wait in CPU
memory, and the gradient is bit for bit the one without it. The hooks run on this CPU (a saved tensor
is copied into fresh CPU memory and read back from there); the trainer leaves them off on a CPU."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig
from pytest import MonkeyPatch

import rloo.training.update as update_module
from rloo import RLOOTrainer
from rloo.training.passes import pass_loss, take_rows
from rloo.training.setup.activation_offload import ActivationOffload, offload_context, stays_on_device
from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer, next_train_batch, params


class RecordingOffload(ActivationOffload):
    """The hooks, also keeping the storage address of every tensor they moved."""

    def __init__(self) -> None:
        self.moved: list[int] = []
        super().__init__(pin_memory=False)

    def _pack(self, tensor: torch.Tensor) -> Any:
        packed = super()._pack(tensor)
        if not isinstance(packed, torch.Tensor):
            self.moved.append(tensor.untyped_storage().data_ptr())
        return packed


def batch_gradients(trainer: RLOOTrainer, offload: contextlib.AbstractContextManager[Any]) -> dict[str, torch.Tensor]:
    """The gradient of one training pass over the trainer's next generation batch, its forward run within
    ``offload``."""
    model = trainer.unwrapped_model
    batch = next_train_batch(trainer)
    model.train()
    model.zero_grad(set_to_none=True)
    rows = take_rows(batch, torch.arange(batch.num_rows))
    with offload:
        result = pass_loss(
            model,
            rows,
            trainer.updater.objective,
            temperature=1.0,
            total_tokens=float(batch.loss_mask.sum()),
            total_sequences=float(batch.num_rows),
        )
    result.loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def tiny_trainer(tmp_path: Path, lora: bool = False, **overrides: Any) -> RLOOTrainer:
    tok = make_tokenizer()
    peft = LoraConfig(r=4, target_modules=["q_proj", "v_proj"]) if lora else None
    args = config(tmp_path, **overrides)
    return RLOOTrainer(make_model(tok), frac7, args, dataset(), processing_class=tok, peft_config=peft)


CASES = {"full": {}, "lora": {"lora": True}, "gradient checkpointing": {"gradient_checkpointing": True}}


@pytest.mark.parametrize("case", CASES)
def test_the_gradient_is_unchanged_and_activations_moved_but_no_parameter(tmp_path: Path, case: str) -> None:
    plain = batch_gradients(tiny_trainer(tmp_path / "plain", **CASES[case]), contextlib.nullcontext())
    hooks = RecordingOffload()
    trainer = tiny_trainer(tmp_path / "offload", **CASES[case])
    offloaded = batch_gradients(trainer, hooks)
    assert plain.keys() == offloaded.keys() and plain
    for name in plain:
        assert torch.equal(plain[name], offloaded[name]), name
    # with gradient checkpointing the layers save nothing: what is outside them moves (embeddings, head)
    assert hooks.counts.tensors == len(hooks.moved) >= 5 and hooks.counts.bytes > 5 * 1024
    parameters = {p.untyped_storage().data_ptr() for p in trainer.unwrapped_model.parameters()}
    assert not parameters & set(hooks.moved)  # weights (and their transposes) stayed where they were


def test_what_stays_where_it_is() -> None:
    weight = torch.nn.Parameter(torch.ones(64, 64))
    assert stays_on_device(weight, 1024) and stays_on_device(weight.t(), 1024)  # a parameter, a view of one
    assert stays_on_device(torch.ones(255), 1024) and not stays_on_device(torch.ones(256), 1024)  # 1020 vs 1024 B
    assert stays_on_device(torch.ones(64, 64).to_sparse(), 1024)
    assert not stays_on_device(torch.ones(64, 64)[:, :32], 1024)  # a view of an activation moves (copied)


def test_the_trainer_runs_every_training_pass_within_the_hooks(tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    """The CPU hooks put in the trainer's place: the run trains to the same weights as without them, and
    they moved the activations of every pass."""
    hooks = ActivationOffload(pin_memory=False)
    monkeypatch.setattr(update_module, "offload_context", lambda enabled, device: lambda: hooks)
    with_hooks = tiny_trainer(tmp_path / "hooks", max_steps=2)
    with_hooks.train()
    monkeypatch.undo()
    plain = tiny_trainer(tmp_path / "plain", max_steps=2)
    plain.train()
    after, expected = params(with_hooks.unwrapped_model), params(plain.unwrapped_model)
    assert all(torch.equal(after[k], expected[k]) for k in expected)
    assert hooks.counts.tensors > 2 * 10


def test_on_a_cpu_it_is_off_with_a_warning_and_on_a_gpu_the_memory_is_pinned(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match="activation_offloading=True has no effect on a CPU"):
        trainer = tiny_trainer(tmp_path, activation_offloading=True)
    assert trainer.updater.offload is contextlib.nullcontext
    assert offload_context(False, torch.device("cuda")) is contextlib.nullcontext
    hooks = offload_context(True, torch.device("cuda", 0))()
    assert isinstance(hooks, ActivationOffload) and hooks.pin_memory
