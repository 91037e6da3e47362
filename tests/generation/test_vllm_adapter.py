"""A LoRA policy's adapter as ``rloo vllm-serve --enable_lora true`` takes it (``vllm_adapter``): PEFT's saved
names and config, or None (the merged weights then) where vLLM's LoRA cannot apply it; an adapter the
server refuses is warned once and the merged weights go from then on. The server itself is
tested with a real engine in ``tests/generation/test_vllm.py``."""

from __future__ import annotations

from typing import Any

import pytest
from peft import LoraConfig, get_peft_model

from rloo.generation.vllm.client import VLLMServerError
from rloo.generation.vllm.sampler import VLLMSampler, vllm_adapter
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


class RefusingServer:
    """A client of a server that takes adapters up to rank 8 but refuses this one (``refuse``), recording
    what was sent."""

    def __init__(self, refuse: bool) -> None:
        self.refuse, self.sent = refuse, []

    def instance(self) -> str:
        return "one"

    def max_lora_rank(self) -> int:
        return 8

    def load_adapter(self, weights: dict[str, Any], config: dict[str, Any]) -> int:
        if self.refuse:
            raise VLLMServerError("vLLM server http://x answered 400: adapter not loaded: unsupported module")
        self.sent.append("adapter")
        return len(weights)

    def update_weights(self, named: Any) -> int:
        self.sent.append("merged")
        return len(list(named))


def test_an_adapter_the_server_refuses_is_warned_and_the_merged_weights_go_from_then_on() -> None:
    model = lora_policy()
    taking = VLLMSampler("http://x", 5.0, client=RefusingServer(refuse=False))
    taking.shared = True  # a server (not an engine in this process)
    taking.sync(model, 0)
    taking.sync(model, 1)
    assert taking.client.sent == ["adapter", "adapter"]
    refusing = VLLMSampler("http://x", 5.0, client=RefusingServer(refuse=True))
    refusing.shared = True
    with pytest.warns(UserWarning, match=r"adapter not loaded: unsupported module: the policy's weights go .* merged"):
        refusing.sync(model, 0)
    refusing.sync(model, 1)  # not asked again
    assert refusing.client.sent == ["merged", "merged"]
