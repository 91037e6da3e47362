"""The lean gated MLP (:mod:`rloo.forward.lean_mlp`): a training pass's log-probs and gradients equal to the
bit with and without it on every family, two tensors of the MLP's width saved instead of four, and the cases
where the module keeps its own forward (checkpointing, autocast, a LoRA down projection, another forward)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from rloo.forward import lean_mlp
from rloo.forward.lean_mlp import LEAN_VARIABLE, gated_form, lean_gated_mlps, takes_lean
from tests.forward.test_fused_head import pass_outputs
from tests.generation.test_model_families import FAMILIES, PROMPTS, build
from tests.helpers.models import make_tokenizer


def pass_rows(tokenizer: Any) -> tuple[torch.Tensor, ...]:
    """Eight rows of :data:`PROMPTS` (left-padded) and six completion tokens of varied lengths."""
    gen = torch.Generator().manual_seed(3)
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    width = max(map(len, prompts))
    prompt_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts]).repeat(2, 1)
    completion_ids = torch.randint(5, len(tokenizer), (8, 6), generator=gen)
    completion_mask = (torch.arange(6) < torch.tensor([6, 3, 5, 1, 6, 2, 4, 6]).unsqueeze(1)).long()
    return prompt_ids, (prompt_ids != tokenizer.pad_token_id).long(), completion_ids, completion_mask


def lean_count(model: nn.Module) -> int:
    with lean_gated_mlps(model) as count:
        return count


@pytest.mark.parametrize("family", FAMILIES)
def test_a_training_pass_is_the_same_to_the_bit_on_every_family(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = make_tokenizer()
    model = build(family, tokenizer)
    rows = pass_rows(tokenizer)
    monkeypatch.setenv(LEAN_VARIABLE, "0")
    assert lean_count(model) == 0  # the variable turns it off
    plain, plain_grads = pass_outputs(model, rows, "plain")
    monkeypatch.delenv(LEAN_VARIABLE)
    lean, lean_grads = pass_outputs(model, rows, "plain")
    assert torch.equal(lean.logprobs, plain.logprobs)
    assert lean.entropy is not None and plain.entropy is not None and torch.equal(lean.entropy, plain.entropy)
    for mine, other in zip(lean_grads, plain_grads, strict=True):
        assert torch.equal(mine, other)
    if family in ("llama", "qwen2", "mistral", "gemma"):  # families whose MLP is Llama's: each layer's is lean
        assert lean_count(model) == model.config.num_hidden_layers


def saved_widths(model: nn.Module, ids: torch.Tensor, width: int) -> int:
    """How many activations (not weights) of the MLP's ``width`` (last dimension) a forward saves for its
    backward."""
    count, weights = 0, {p.data_ptr() for p in model.parameters()}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += tensor.dim() > 0 and tensor.shape[-1] == width and tensor.data_ptr() not in weights
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = model(input_ids=ids).logits
    logits.sum().backward()  # (its recompute saves a layer's product for a moment, outside the count)
    return count


def test_each_layer_saves_two_tensors_of_the_mlp_width_instead_of_four() -> None:
    tokenizer = make_tokenizer()
    model = build("llama", tokenizer)
    width, layers = model.config.intermediate_size, model.config.num_hidden_layers
    assert width not in (model.config.hidden_size, len(tokenizer))
    ids = torch.tensor([tokenizer.encode("12+34=")])
    assert saved_widths(model, ids, width) == 4 * layers  # gate, act(gate), up, their product
    with lean_gated_mlps(model) as count:
        assert count == layers
        assert saved_widths(model, ids, width) == 2 * layers  # gate and up
    assert "forward" not in vars(model.model.layers[0].mlp)  # restored after the block


def test_the_module_keeps_its_forward_where_the_lean_one_does_not_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = make_tokenizer()
    model = build("llama", tokenizer)
    layers = model.config.num_hidden_layers
    assert lean_count(model) == layers
    with torch.no_grad():  # a log-prob pass saves nothing
        assert lean_count(model) == 0
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 autocast: the module's own precision rules
        assert lean_count(model) == 0
    compiled = torch.compile(model)  # traced from the modules as loaded (not compiled here: never called)
    assert lean_count(compiled) == 0 and lean_count(model) == layers
    model.gradient_checkpointing_enable()  # the recompute runs after the block: it must save the same
    assert lean_count(model) == 0
    model.gradient_checkpointing_disable()

    class LoraLinear(nn.Linear):  # a down projection that does more than its product (LoRA, quantized)
        pass

    mlp = model.model.layers[0].mlp
    mlp.down_proj = LoraLinear(mlp.down_proj.in_features, mlp.down_proj.out_features, bias=False)
    assert not takes_lean(mlp) and lean_count(model) == layers - 1


def test_only_the_gated_forms_are_recognized() -> None:
    class Gated(nn.Module):
        def forward(self, hidden_state):  # type: ignore[no-untyped-def]
            return self.down_proj(self.act_fn(self.gate_proj(hidden_state)) * self.up_proj(hidden_state))

    class Annotated(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
            return down_proj  # type: ignore[no-any-return]

    class Dropped(nn.Module):  # T5Gemma's: a dropout between the product and the down projection
        def forward(self, x):  # type: ignore[no-untyped-def]
            hidden_states = self.act_fn(self.gate_proj(x)) * self.up_proj(x)
            hidden_states = self.dropout(hidden_states)
            return self.down_proj(hidden_states)

    class Scaled(nn.Module):  # another product (Falcon-H1's multipliers)
        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.down_proj(self.act_fn(self.gate_proj(x) * 2.0) * self.up_proj(x))

    assert gated_form(Gated) and gated_form(Annotated)
    assert not gated_form(Dropped) and not gated_form(Scaled)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", [nn.SiLU(), nn.GELU(approximate="tanh")])
def test_the_function_equals_autograd_on_its_ops(bias: bool, act: nn.Module) -> None:
    gen = torch.Generator().manual_seed(0)
    gate, up = (torch.randn(2, 5, 12, generator=gen, requires_grad=True) for _ in range(2))
    down = nn.Linear(12, 7, bias=bias)
    grad = torch.randn(2, 5, 7, generator=gen)
    expected = down(act(gate) * up)
    expected_grads = torch.autograd.grad(expected, [gate, up, *down.parameters()], grad)
    out = lean_mlp._GatedDown.apply(gate, up, down.weight, down.bias, act)
    grads = torch.autograd.grad(out, [gate, up, *down.parameters()], grad)
    assert torch.equal(out, expected)
    for mine, other in zip(grads, expected_grads, strict=True):
        assert torch.equal(mine, other)
