"""A LoRA policy's adapter as ``rloo vllm-serve --enable_lora true`` takes it (``vllm_adapter``): PEFT's saved
names and config, or None (the merged weights then) where vLLM's LoRA cannot apply it. The server itself is
tested with a real engine in ``tests/generation/test_vllm.py``."""

from __future__ import annotations

from typing import Any

import pytest
from peft import LoraConfig, get_peft_model

from rloo.generation.vllm.sampler import vllm_adapter
from tests.helpers.models import make_model, make_tokenizer


def lora_policy(**fields: Any) -> Any:
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM", **fields)
    return get_peft_model(make_model(make_tokenizer()), config)


def test_the_adapter_goes_under_peft_saved_names_with_its_config() -> None:
    model = lora_policy()
    adapter = vllm_adapter(model, max_rank=8)
    assert adapter is not None
    weights, config = adapter
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in weights
    assert all(".default." not in name and "lora_" in name for name in weights)  # no adapter name, adapters only
    assert len(weights) == 2 * 2 * 2  # 2 layers x (q, v) x (A, B)
    assert config["r"] == 4 and config["lora_alpha"] == 8 and set(config["target_modules"]) == {"q_proj", "v_proj"}


@pytest.mark.parametrize(
    ("fields", "max_rank"),
    [({}, None), ({}, 2), ({"use_dora": True}, 8), ({"modules_to_save": ["lm_head"]}, 8)],
    ids=["server-takes-none", "rank-above-the-servers", "dora", "modules-to-save"],
)
def test_what_vllms_lora_cannot_apply_goes_merged(fields: dict[str, Any], max_rank: int | None) -> None:
    assert vllm_adapter(lora_policy(**fields), max_rank) is None


def test_a_full_model_goes_merged() -> None:
    assert vllm_adapter(make_model(make_tokenizer()), max_rank=8) is None
