"""QLoRA on a CPU (bitsandbytes >= 0.50 runs 4-bit weights there): a policy loaded in 4 bits trains its LoRA
adapters, its reference is the quantized base with the adapters off (exactly the policy at step 0), the setting
is recorded for re-runs, and a quantized policy with nothing to train is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rloo import RLOOConfig, RLOOTrainer
from rloo.tiny import save_tiny_model
from rloo.training.setup.quantized import is_quantized
from tests.helpers.models import dataset, token_id_sum

pytest.importorskip("bitsandbytes")
pytestmark = pytest.mark.usefixtures("one_thread")


def four_bit() -> Any:
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)


def lora() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def qlora_trainer(tmp_path: Path, **overrides: Any) -> RLOOTrainer:
    folder = tmp_path / "model"
    save_tiny_model(folder, hidden_size=64, num_heads=2)
    args = RLOOConfig(
        output_dir=str(tmp_path / "run"),
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=6,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        beta=0.05,
        report_to=[],
        seed=0,
    )
    kwargs: dict[str, Any] = {"quantization_config": four_bit(), "peft_config": lora(), **overrides}
    return RLOOTrainer(str(folder), token_id_sum, args=args, train_dataset=dataset(), **kwargs)


def test_a_4bit_policy_trains_its_adapters_against_the_quantized_base(tmp_path: Path) -> None:
    trainer = qlora_trainer(tmp_path)
    policy = trainer.unwrapped_model
    assert is_quantized(policy) and trainer.ref_model is None  # the reference: the same base, adapters off
    frozen = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)
    trainer.train()
    first = trainer.state.log_history[0]
    assert first["kl"] == 0.0  # step 0: the policy is exactly its reference
    now = dict(policy.named_parameters())
    assert any(not torch.equal(now[n], before) for n, before in adapters.items())  # the adapters moved
    assert all(torch.equal(now[n], before) for n, before in frozen.items())  # the quantized base did not
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert recorded["model_init_kwargs"]["quantization_config"]["load_in_4bit"] is True


def test_a_quantized_policy_without_adapters_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="quantized weights cannot be trained: give peft_config"):
        qlora_trainer(tmp_path, peft_config=None)


def test_quantization_given_twice_or_for_a_loaded_model_is_refused(tmp_path: Path) -> None:
    from rloo.training.setup.quantized import with_quantization

    args = RLOOConfig(output_dir=str(tmp_path), model_init_kwargs={"quantization_config": {"load_in_4bit": True}})
    with pytest.raises(ValueError, match=r"both to RLOOTrainer and in RLOOConfig\.model_init_kwargs"):
        with_quantization(args, four_bit(), "some/model")
    with pytest.raises(ValueError, match="pass the model's path or hub id"):
        with_quantization(RLOOConfig(output_dir=str(tmp_path)), four_bit(), torch.nn.Linear(2, 2))
    assert with_quantization(args, None, "some/model") is args
