"""The KL reference of a PEFT policy whose adapter is already trained: a frozen copy of the adapter as
training started (issue 25), not the base model; a fresh LoRA keeps the adapters-disabled reference."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file

from rloo import RLOOTrainer
from rloo.training.setup.reference_adapter import (
    REFERENCE_ADAPTER,
    adapter_state,
    adapters_are_identity,
    add_reference_adapter,
    reference_adapter_selected,
)
from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

LORA = {"r": 4, "target_modules": ["q_proj", "v_proj"]}


def _trained_adapter(**lora: Any) -> Any:
    """The tiny model with a LoRA adapter whose B factors are drawn non-zero, as training leaves them
    (the same adapter on every call)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)  # LoRA's A init draws from the global generator
        model = get_peft_model(make_model(make_tokenizer()), LoraConfig(**{**LORA, **lora}))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5, generator=generator)
    return model


def _trainer(tmp_path: Path, model: Any, **overrides: Any) -> RLOOTrainer:
    args = config(tmp_path, beta=0.5, **overrides)
    return RLOOTrainer(model, frac7, args=args, train_dataset=dataset(), processing_class=make_tokenizer())


def _state(model: Any, adapter: str) -> dict[str, torch.Tensor]:
    return {key: value.detach().clone() for key, value in adapter_state(model, adapter).items()}


def _reference_parameters(model: Any) -> list[str]:
    return [name for name, _ in model.named_parameters() if REFERENCE_ADAPTER in name]


def test_a_trained_adapter_is_its_own_reference_so_the_first_kl_is_zero(tmp_path: Path) -> None:
    model = _trained_adapter()
    initial = _state(model, "default")
    trainer = _trainer(tmp_path, model, max_steps=2)
    assert trainer.ref_model is None and list(model.peft_config) == ["default", REFERENCE_ADAPTER]
    trainer.train()
    kl = [row["kl"] for row in trainer.state.log_history if "reward" in row]
    assert kl[0] == 0.0  # step 0: policy == reference (was 0.012 with the base model as the reference)
    assert kl[1] != 0.0  # the policy moved, the reference did not
    assert model.active_adapter == "default"
    for key, value in _state(model, REFERENCE_ADAPTER).items():
        torch.testing.assert_close(value, initial[key], rtol=0, atol=0, msg=key)
    assert not any(p.requires_grad for name, p in model.named_parameters() if REFERENCE_ADAPTER in name)
    trained = _state(model, "default")
    assert any(not torch.equal(v, initial[k]) for k, v in trained.items())  # it trained
    _trainer(tmp_path / "next", model)  # a next run from the trained model: it is that run's reference
    assert all(torch.equal(v, trained[k]) for k, v in _state(model, REFERENCE_ADAPTER).items())


def test_saved_adapters_and_the_merged_model_are_the_trained_policy(tmp_path: Path) -> None:
    model = _trained_adapter()
    trainer = _trainer(tmp_path, model, max_steps=1, save_steps=1)
    trainer.train()
    policy = _state(model, "default")
    for folder in ("checkpoint-1", "final"):
        path = tmp_path / "run" / folder
        assert not (path / REFERENCE_ADAPTER).exists()  # peft saves each other adapter in a subfolder
        saved = load_file(str(path / "adapter_model.safetensors"))
        assert set(saved) == set(policy) and all(torch.equal(saved[k], policy[k]) for k in saved)
    ids = torch.tensor([make_tokenizer()("1+2=")["input_ids"]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        merged = model.merge_and_unload()  # merges the active adapter: the policy's
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=0, atol=1e-5)


def test_resume_anchors_to_the_initial_adapter_not_to_the_resumed_policy(tmp_path: Path) -> None:
    initial = _state(_trained_adapter(), "default")
    straight = _trainer(tmp_path / "straight", _trained_adapter(), max_steps=4, save_steps=2)
    straight.train()
    # the resumed run is given the policy at step 2: the copy made of it must not become the reference
    checkpoint = tmp_path / "straight" / "run" / "checkpoint-2"
    at_step_2 = PeftModel.from_pretrained(make_model(make_tokenizer()), checkpoint, is_trainable=True)
    resumed = _trainer(tmp_path / "resumed", at_step_2, max_steps=4, save_steps=2)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    for key, value in _state(at_step_2, REFERENCE_ADAPTER).items():
        torch.testing.assert_close(value, initial[key], rtol=0, atol=0, msg=key)
    expected = {name: p.detach() for name, p in straight.unwrapped_model.named_parameters()}
    for name, value in at_step_2.named_parameters():
        torch.testing.assert_close(value.detach(), expected[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("source", ["peft_config", "zero_b_peft_model"])
def test_a_fresh_lora_keeps_the_adapters_disabled_reference_and_no_second_adapter(tmp_path: Path, source: str) -> None:
    if source == "peft_config":
        trainer = RLOOTrainer(
            make_model(make_tokenizer()),
            frac7,
            args=config(tmp_path, beta=0.5, max_steps=1),
            train_dataset=dataset(),
            processing_class=make_tokenizer(),
            peft_config=LoraConfig(**LORA),
        )
    else:
        trainer = _trainer(tmp_path, get_peft_model(make_model(make_tokenizer()), LoraConfig(**LORA)), max_steps=1)
    model = trainer.unwrapped_model
    assert list(model.peft_config) == ["default"] and not _reference_parameters(model)
    trainer.train()
    assert [row["kl"] for row in trainer.state.log_history if "reward" in row] == [0.0]
    assert trainer.reference_sync.state() == {}  # nothing to checkpoint: the base model is the reference


def test_sync_ref_model_mixes_the_reference_adapter_toward_the_policy(tmp_path: Path) -> None:
    model = _trained_adapter()
    initial = _state(model, "default")
    overrides = {"sync_ref_model": True, "ref_model_sync_steps": 1, "ref_model_mixup_alpha": 0.25}
    _trainer(tmp_path, model, max_steps=1, **overrides).train()
    policy = _state(model, "default")
    for key, value in _state(model, REFERENCE_ADAPTER).items():
        torch.testing.assert_close(value, 0.25 * policy[key] + 0.75 * initial[key], msg=key)


def test_which_adapters_count_as_the_identity() -> None:
    fresh = get_peft_model(make_model(make_tokenizer()), LoraConfig(**LORA))
    assert adapters_are_identity(fresh)
    assert not adapters_are_identity(_trained_adapter())
    # PiSSA rewrites the base weights and starts B non-zero; DoRA's magnitudes and a trainable
    # module copy are not proven harmless by one look: all get the copied reference
    base = make_model(make_tokenizer())
    assert not adapters_are_identity(get_peft_model(base, LoraConfig(**LORA, init_lora_weights="pissa")))
    assert not adapters_are_identity(get_peft_model(make_model(make_tokenizer()), LoraConfig(**LORA, use_dora=True)))
    with_copy = LoraConfig(**LORA, modules_to_save=["norm"])
    assert not adapters_are_identity(get_peft_model(make_model(make_tokenizer()), with_copy))


def test_the_reference_adapter_is_frozen_without_dropout_and_selected_only_inside() -> None:
    model = _trained_adapter(lora_dropout=0.3)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    add_reference_adapter(model)
    assert {name for name, p in model.named_parameters() if p.requires_grad} == trainable
    dropouts = [m for name, m in model.named_modules() if name.endswith(f"lora_dropout.{REFERENCE_ADAPTER}")]
    assert dropouts and all(m.p == 0.0 for m in dropouts)
    ids = torch.tensor([make_tokenizer()("1+2=")["input_ids"]])
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with reference_adapter_selected(model):
            assert model.active_adapter == REFERENCE_ADAPTER
            torch.testing.assert_close(model(input_ids=ids).logits, expected, rtol=0, atol=0)
    assert model.active_adapter == "default"
    assert {name for name, p in model.named_parameters() if p.requires_grad} == trainable


def test_several_active_adapters_are_refused() -> None:
    model = _trained_adapter()
    model.add_adapter("second", LoraConfig(**LORA))
    model.base_model.set_adapter(["default", "second"])
    with pytest.raises(ValueError, match=r"has 2 active adapters \['default', 'second'\].*merge them into one"):
        add_reference_adapter(model)
