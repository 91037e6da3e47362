"""Shared-prefix decode attention (rloo.generation.shared_prefix): the same attention as the plain decode's,
each prompt's cache held and read once for its K rows."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import rloo.generation.shared_prefix as shared_prefix
from rloo.generation.kv_cache import can_select_rows
from rloo.generation.rollout import Rollout, generate_rollouts, left_pad, prefill
from rloo.generation.sampling import SamplingParams
from rloo.generation.shared_prefix import (
    SHARED_PREFIX,
    SharedPrefixLayer,
    shared_prefix_attention,
    shared_prefix_decoding,
    uses_shared_prefix,
)
from tests.generation.test_decoding import SelectSpy, assert_same_rollout
from tests.generation.test_model_families import FAMILIES, build, encode_vision
from tests.helpers.models import make_tokenizer
from tests.helpers.vision import VISION_FAMILIES, build_vision

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["1+2=", "34+5=", "10+11+12=", "7="]  # different lengths: each prompt's padding differs


class AttendSpy:
    """Counts the decode attention calls that took the shared prefix."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self._attend = SharedPrefixLayer.attend
        monkeypatch.setattr(SharedPrefixLayer, "attend", self._wrap())

    def _wrap(self) -> Any:
        spy = self

        def attend(layer: SharedPrefixLayer, query: torch.Tensor, scale: float) -> torch.Tensor:
            spy.calls += 1
            return spy._attend(layer, query, scale)

        return attend


class Attention(torch.nn.Module):
    num_key_value_groups = 2  # 4 query heads, 2 KV heads
    is_causal = True


def random_layer(
    prompts: int = 2, k: int = 3, kv_heads: int = 2, steps: int = 4, length: int = 5, padding: int = 2
) -> SharedPrefixLayer:
    keys, values = torch.randn(prompts, kv_heads, length, 8), torch.randn(prompts, kv_heads, length, 8)
    mask = torch.ones(prompts, length, dtype=torch.bool)
    mask[0, :padding] = False  # the first prompt is left-padded
    layer = SharedPrefixLayer(keys, values, mask, k, capacity=steps)
    for _ in range(steps):
        layer.update(torch.randn(prompts * k, kv_heads, 1, 8), torch.randn(prompts * k, kv_heads, 1, 8))
    return layer


def sdpa_over_whole_rows(layer: SharedPrefixLayer, query: torch.Tensor, scale: float) -> torch.Tensor:
    """SDPA over each row's prompt and own tokens, the last ``Q`` of them the queries (causal among them)."""
    keys, values, mask = layer.whole()
    steps = query.shape[2]
    full = mask[:, None, None, :].expand(-1, 1, steps, -1).clone()
    full[..., -steps:] &= torch.ones(steps, steps, dtype=torch.bool).tril()
    module = Attention()
    module.num_key_value_groups = query.shape[1] // keys.shape[1]
    out, _ = sdpa_attention_forward(module, query, keys, values, full, scaling=scale)
    return out


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 3),  # prompts
    st.integers(2, 4),  # K
    st.sampled_from([(1, 1), (2, 2), (1, 4)]),  # KV heads, query heads per KV head
    st.integers(1, 6),  # prompt length
    st.integers(1, 3),  # new tokens so far before the queries
    st.integers(1, 2),  # queries a row
    st.booleans(),  # compacted
    st.integers(0, 2**31 - 1),
)
def test_a_layer_attends_as_sdpa_for_any_shape(
    prompts: int, k: int, heads: tuple[int, int], length: int, before: int, steps: int, compact: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    kv_heads, per_kv = heads
    layer = random_layer(prompts, k, kv_heads, before + steps, length, padding=length - 1)
    if compact:
        keep = torch.randperm(prompts * k)[: max(1, prompts * k // 2)].sort().values
        layer.select_rows(keep)
    query = torch.randn(len(layer.rows), kv_heads * per_kv, steps, 8)
    torch.testing.assert_close(layer.attend(query, 0.4), sdpa_over_whole_rows(layer, query, 0.4), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("keep", [None, [0, 2, 3, 5]], ids=["every-row", "compacted"])
def test_a_layer_attends_as_sdpa_over_its_whole_rows(steps: int, keep: list[int] | None) -> None:
    torch.manual_seed(0)
    layer = random_layer(steps=4 + steps)
    if keep is not None:
        layer.select_rows(torch.tensor(keep))
    rows = len(layer.rows)
    query = torch.randn(rows, 4, steps, 8)
    expected = sdpa_over_whole_rows(layer, query, 0.3)
    torch.testing.assert_close(layer.attend(query, 0.3), expected, atol=1e-6, rtol=1e-5)
    # through the registry's function, and its whole-row path for what the split does not compute
    layer.update(torch.randn(rows, 2, 0, 8), torch.randn(rows, 2, 0, 8))  # the pairing of a call: no new token
    out, _ = shared_prefix_attention(Attention(), query, layer.keys, layer.values, None, scaling=0.3)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    layer.update(torch.randn(rows, 2, 0, 8), torch.randn(rows, 2, 0, 8))
    out, _ = shared_prefix_attention(
        Attention(), query, layer.keys, layer.values, None, scaling=0.3, sinks=None, s_aux=0
    )
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)


def test_keys_no_layer_returned_get_sdpa_itself() -> None:
    query, keys, values = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 3, 8), torch.randn(2, 2, 3, 8)
    out, _ = shared_prefix_attention(Attention(), query, keys, values, None, scaling=0.3)
    expected, _ = sdpa_attention_forward(Attention(), query, keys, values, None, scaling=0.3)
    assert torch.equal(out, expected)


def sample(model: Any, prompt_ids: list[list[int]], tokenizer: Any, **kwargs: Any) -> Rollout:
    settings: dict[str, Any] = {
        "num_generations": 3,
        "max_new_tokens": 8,
        "params": SamplingParams(temperature=1.0),
        "eos_token_ids": [tokenizer.eos_token_id],
        "pad_token_id": tokenizer.pad_token_id,
        "sampling_seed": 0,
    }
    settings.update(kwargs)
    return generate_rollouts(model, prompt_ids, list(range(len(prompt_ids))), **settings)


@pytest.fixture
def any_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test prompts are a few tokens: let them take the shared prefix."""
    monkeypatch.setattr(shared_prefix, "MIN_PREFIX_TOKENS", 1)


# every layer full attention through SDPA and transformers' registry, a plain cache: the families that take the
# shared prefix (Mistral's config has a sliding window; Falcon's attention calls SDPA itself)
SHARED = {"llama", "qwen2", "qwen3", "qwen3_moe", "phi3", "gpt2", "gpt_neox", "opt", "olmo2"}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_samples_the_plain_decodes_tokens(
    family: str, any_prompt: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = make_tokenizer()
    model = build(family, tokenizer)
    prompt_ids = [tokenizer.encode(text) for text in PROMPTS]
    monkeypatch.setenv("RLOO_SHARED_PREFIX", "0")
    plain = sample(model, prompt_ids, tokenizer)
    monkeypatch.delenv("RLOO_SHARED_PREFIX")
    spy = AttendSpy(monkeypatch)
    shared = sample(model, prompt_ids, tokenizer)
    assert (spy.calls > 0) == (family in SHARED), f"{family}: shared prefix taken {spy.calls} times"
    assert_same_rollout(shared, plain)
    assert model.config._attn_implementation != SHARED_PREFIX


def test_compaction_with_a_shared_prefix_equals_the_plain_loop(
    any_prompt: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = make_tokenizer()
    model = build("llama", tokenizer)
    prompt_ids = [tokenizer.encode(text) for text in PROMPTS]
    eos = [tokenizer.eos_token_id, 3, 4]  # rows end at different steps
    monkeypatch.setenv("RLOO_SHARED_PREFIX", "0")
    plain = sample(model, prompt_ids, tokenizer, eos_token_ids=eos)
    monkeypatch.delenv("RLOO_SHARED_PREFIX")
    spy, attend = SelectSpy(monkeypatch), AttendSpy(monkeypatch)
    compacted = sample(model, prompt_ids, tokenizer, eos_token_ids=eos, compact_at=1e-9)
    assert spy.sizes and attend.calls
    assert_same_rollout(compacted, plain)


def test_what_takes_the_shared_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = make_tokenizer()
    model = build("llama", tokenizer)
    long_prompt = tokenizer.encode("12+34=" * 12)
    ids, mask = left_pad([long_prompt, long_prompt[:40]], tokenizer.pad_token_id, torch.device("cpu"))
    assert ids.shape[1] >= shared_prefix.MIN_PREFIX_TOKENS
    with torch.no_grad():
        filled = prefill(model, ids, mask, 4, new_tokens=8)
        assert filled.shared and can_select_rows(filled.cache)
        assert all(type(layer) is SharedPrefixLayer for layer in filled.cache.layers)
        assert filled.cache.layers[0].prefix_keys.shape[0] == 2  # each prompt once, not 4 times
        assert filled.cache.get_seq_length() == ids.shape[1] and filled.logits.shape[0] == 8
        assert not prefill(model, ids, mask, 1, new_tokens=8).shared  # one sample a prompt
        assert not prefill(model, ids, mask, 4).shared  # no decode planned
        short = left_pad([long_prompt[:10]], tokenizer.pad_token_id, torch.device("cpu"))
        assert not prefill(model, *short, 4, new_tokens=8).shared
        monkeypatch.setenv("RLOO_SHARED_PREFIX", "0")
        assert not prefill(model, ids, mask, 4, new_tokens=8).shared
        monkeypatch.delenv("RLOO_SHARED_PREFIX")
        model.config._attn_implementation = "eager"
        assert not prefill(model, ids, mask, 4, new_tokens=8).shared


def test_the_decode_switches_the_attention_back_also_on_an_error() -> None:
    model = build("llama", make_tokenizer())
    with shared_prefix_decoding(model, on=True):
        assert model.config._attn_implementation == SHARED_PREFIX
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="boom"), shared_prefix_decoding(model, on=True):
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "sdpa"
    with shared_prefix_decoding(model, on=False):
        assert model.config._attn_implementation == "sdpa"


# Qwen3.5's text layers are hybrid, Gemma's slide
SHARED_VISION = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "llava_next"}


@pytest.mark.parametrize("family", VISION_FAMILIES)
def test_vision_families_sample_the_plain_decodes_tokens(
    family: str, any_prompt: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    processor, model = build_vision(family)
    ids, vision = encode_vision(processor)
    tokenizer = processor.tokenizer
    monkeypatch.setenv("RLOO_SHARED_PREFIX", "0")
    plain = sample(model, ids, tokenizer, vision=vision)
    monkeypatch.delenv("RLOO_SHARED_PREFIX")
    spy = AttendSpy(monkeypatch)
    shared = sample(model, ids, tokenizer, vision=vision)
    assert (spy.calls > 0) == (family in SHARED_VISION), f"{family}: shared prefix taken {spy.calls} times"
    assert_same_rollout(shared, plain)
    assert model.config._attn_implementation != SHARED_PREFIX


def test_off_a_cpu_it_runs_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build("llama", make_tokenizer())
    layer = DynamicLayer()
    layer.update(torch.zeros(2, 2, 80, 8, device="meta"), torch.zeros(2, 2, 80, 8, device="meta"))
    cache = DynamicCache()
    cache.layers = [layer]
    assert not uses_shared_prefix(model, cache, 4, 80)  # not measured on a GPU: the plain decode there
    monkeypatch.setenv("RLOO_SHARED_PREFIX", "1")
    assert uses_shared_prefix(model, cache, 4, 80)
    assert not uses_shared_prefix(model, cache, 1, 80) and not uses_shared_prefix(model, cache, 4, 63)
