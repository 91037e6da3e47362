"""The decode steps' LM head as ``(W @ h^T)^T`` (rloo.generation.decode_head): the same logits, only
within a rollout, only for a plain float32 CPU head."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import rloo.generation.rollout as rollout_module
from rloo.generation.decode_head import MAX_ROWS, takes_weight_left, weight_left_head, weight_left_linear
from tests.generation.test_decoding import TEXTS, assert_same_rollout, sample
from tests.generation.test_model_families import build
from tests.helpers.models import make_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread", "any_vocabulary")


@pytest.fixture
def any_vocabulary(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' heads are small: take the path at any vocabulary size (one test checks the limit)."""
    monkeypatch.setattr("rloo.generation.decode_head.MIN_VOCAB", 1)


@pytest.mark.parametrize("rows", [1, 3, 8, MAX_ROWS, MAX_ROWS + 1])
@pytest.mark.parametrize("bias", [False, True])
def test_the_weight_left_product_is_the_linear_layers_output(rows: int, bias: bool) -> None:
    torch.manual_seed(0)
    head = nn.Linear(48, 1000, bias=bias)
    hidden = torch.randn(rows, 1, 48)
    logits = weight_left_linear(head, hidden)
    assert logits.shape == (rows, 1, 1000) and logits.is_contiguous()
    torch.testing.assert_close(logits, head(hidden), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 5, MAX_ROWS])
def test_a_vocabulary_of_several_blocks_and_a_partial_one_gives_the_same_logits(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("rloo.generation.decode_head.VOCAB_BLOCK", 300)  # 1000 = 3 x 300 + 100
    torch.manual_seed(1)
    head = nn.Linear(48, 1000)
    hidden = torch.randn(rows, 1, 48)
    torch.testing.assert_close(weight_left_linear(head, hidden), head(hidden), atol=1e-5, rtol=1e-5)


def test_the_head_is_swapped_within_the_block_only() -> None:
    model = nn.Module()
    head = nn.Linear(8, 32, bias=False)
    model.get_output_embeddings = lambda: head  # type: ignore[assignment,method-assign]
    calls: list[int] = []
    original = weight_left_linear

    def spy(layer: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
        calls.append(hidden.shape[0])
        return original(layer, hidden)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("rloo.generation.decode_head.weight_left_linear", spy)
        with weight_left_head(model):
            head(torch.randn(3, 8))
        head(torch.randn(3, 8))
    assert calls == [3]
    assert "forward" not in vars(head)


def test_the_head_is_restored_when_the_rollout_raises() -> None:
    model = nn.Module()
    head = nn.Linear(8, 32)
    model.get_output_embeddings = lambda: head  # type: ignore[assignment,method-assign]
    with pytest.raises(RuntimeError, match="boom"), weight_left_head(model):
        raise RuntimeError("boom")
    assert "forward" not in vars(head)


@pytest.mark.parametrize(
    "head",
    [
        pytest.param(nn.Linear(8, 32).to(torch.bfloat16), id="bf16"),
        pytest.param(nn.Embedding(32, 8), id="not-a-linear"),
        pytest.param(type("Lora", (nn.Linear,), {})(8, 32), id="a-subclass"),
        pytest.param(None, id="no-head"),
    ],
)
def test_other_heads_are_left_alone(head: Any) -> None:
    assert not takes_weight_left(head)
    model = nn.Module()
    model.get_output_embeddings = lambda: head  # type: ignore[assignment,method-assign]
    with weight_left_head(model):
        assert head is None or "forward" not in vars(head)


def test_a_small_vocabulary_keeps_the_linear_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rloo.generation.decode_head.MIN_VOCAB", 1000)
    assert takes_weight_left(nn.Linear(8, 1000)) and not takes_weight_left(nn.Linear(8, 999))


def test_a_hooked_head_and_cpu_autocast_are_left_alone() -> None:
    head = nn.Linear(8, 32)
    head.forward = head.forward  # type: ignore[method-assign]  # as accelerate's hooks replace it
    assert not takes_weight_left(head)
    plain = nn.Linear(8, 32)
    model = nn.Module()
    model.get_output_embeddings = lambda: plain  # type: ignore[assignment,method-assign]
    with torch.autocast("cpu", dtype=torch.bfloat16), weight_left_head(model):
        assert "forward" not in vars(plain)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_rollout_samples_the_same_tokens_with_either_head(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = make_tokenizer()
    model = build(family, tokenizer).eval()
    prompt_ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    calls: list[int] = []

    def spy(layer: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
        calls.append(hidden.shape[0])
        return weight_left_linear(layer, hidden)

    with monkeypatch.context() as patch:
        patch.setattr("rloo.generation.decode_head.weight_left_linear", spy)
        swapped = sample(model, prompt_ids, compact_at=0.25)
    assert calls and calls[0] == len(TEXTS)  # the prefill's last positions, then every decode step
    assert "forward" not in vars(model.get_output_embeddings())
    monkeypatch.setattr(rollout_module, "weight_left_head", lambda model: torch.no_grad())
    plain = sample(model, prompt_ids, compact_at=0.25)
    assert_same_rollout(swapped, plain)
