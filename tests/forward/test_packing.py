"""Padding-free passes (:mod:`rloo.forward.packing`): packed rows give the plain pass's log-probs,
entropies and gradients for every family that keeps packed rows apart, the probe refuses the others, the
FLOPs model against hand-computed counts, and a training run with ``padding_free`` on and off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rloo.forward.logprobs as logprobs_module
import rloo.forward.packing as packing
import tests.forward.test_lm_head as chunked_head_test
from rloo.forward.logprobs import TokenLogprobs, completion_logprobs
from rloo.forward.packing import (
    ForwardCost,
    RowLengths,
    best_packing,
    choose_layout,
    minimum_flops,
    pack,
    pack_rows,
    packed_flops,
    plain_flops,
    shared_flops,
)
from rloo.generation.rollout import Rollout
from tests.forward.test_lm_head import rollout
from tests.forward.test_shared_prompt import rows_of_lengths
from tests.generation.test_model_families import CLASSIC, FAMILIES, PROMPTS, build
from tests.helpers.models import make_tokenizer, params, trainer

pytestmark = pytest.mark.usefixtures("one_thread")

# the families whose attention honours packed positions; OPT derives its positions from the attention
# mask (none given when packed) and every hybrid family has recurrent or state-space layers
PACKED = set(CLASSIC) - {"opt"}
UNIT = ForwardCost(per_token=1.0, per_pair=0.0, per_forward=0.0)  # counts tokens only


class ForwardShapes:
    """The input shape of every forward of ``model``."""

    def __init__(self, model: Any) -> None:
        self.shapes: list[tuple[int, ...]] = []
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        self.shapes.append(tuple(kwargs["input_ids"].shape))


def forced_packing(monkeypatch: pytest.MonkeyPatch, capacity: str) -> None:
    """Every pass packed where the model allows it: in one bin (``"one"``) or bins of the longest row."""

    def choose(
        prompt_ids: Any, prompt_mask: Any, completion_mask: Any, cost: Any, *, shared: bool, packed: bool, lengths: Any
    ) -> Any:
        choice = choose_layout(
            prompt_ids, prompt_mask, completion_mask, UNIT, shared=False, packed=packed, lengths=lengths
        )
        if choice.layout != "packed" or capacity == "one":
            return choice
        rows = [int(n) - 1 for n in (prompt_mask.sum(1) + completion_mask.sum(1)).tolist()]  # the last not fed
        bins = pack_rows(rows, max(rows))
        return packing.LayoutChoice("packed", bins, max(rows), choice.flops, lengths)

    monkeypatch.setattr(logprobs_module, "choose_layout", choose)


def outputs(model: Any, r: Rollout, padding_free: bool, grad: bool) -> tuple[TokenLogprobs, list[torch.Tensor]]:
    model.zero_grad()
    with torch.set_grad_enabled(grad):
        out = completion_logprobs(
            model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, 0.9,
            with_entropy=True, entropy_requires_grad=True, share_prompts=False, padding_free=padding_free,
        )  # fmt: skip
    assert out.entropy is not None
    if not grad:
        return out, []
    weights = torch.linspace(-1.0, 1.0, r.completion_mask.numel()).view_as(r.completion_mask)
    ((out.logprobs * r.completion_mask * weights).sum() + 0.1 * (out.entropy * r.completion_mask).sum()).backward()
    return out, [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("capacity", ["one", "longest row"])
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_passes_equal_the_plain_pass_for_every_family(
    family: str, capacity: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = make_tokenizer()
    model = build(family, tokenizer)
    r = rollout(model, tokenizer, [tokenizer.encode(text) for text in PROMPTS])
    assert not r.completion_mask.bool().all()  # rows of different lengths: padding to remove
    forced_packing(monkeypatch, capacity)
    rows = [int(n) - 1 for n in (r.prompt_mask.sum(1) + r.completion_mask.sum(1)).tolist()]  # the last not fed
    for grad in (False, True):
        plain = outputs(model, r, False, grad)
        calls = ForwardShapes(model)
        packed = outputs(model, r, True, grad)
        calls.handle.remove()
        chunked_head_test.assert_same_outputs(packed, plain, r.completion_mask.bool(), 2e-5)
        if family in PACKED:  # one forward of the bins: no padding column at all
            bins = 1 if capacity == "one" else len(pack_rows(rows, max(rows)))
            assert calls.shapes[-1] == (bins, sum(rows) if capacity == "one" else max(rows))  # (after the probe)
        else:
            assert calls.shapes[-1] == (r.prompt_ids.shape[0], r.prompt_ids.shape[1] + r.completion_ids.shape[1])
    assert packing.packs_rows(model) == (family in PACKED)


def test_the_probe_runs_once_per_model_in_eval_mode_and_restores_the_mode() -> None:
    tokenizer = make_tokenizer()
    model = build("llama", tokenizer).train()
    modes: list[bool] = []
    handle = model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    assert packing.packs_rows(model) and packing.packs_rows(model)
    handle.remove()
    assert modes == [False, False, False] and model.training


def test_a_model_that_leaks_across_rows_is_not_packed() -> None:
    """Row B's logits depend on the row packed before it when attention ignores the positions' restarts."""
    tokenizer = make_tokenizer()
    model = build("llama", tokenizer)
    model.config._attn_implementation = "sdpa"
    inner = model.model.forward

    def without_positions(*args: Any, position_ids: Any = None, **kwargs: Any) -> Any:
        return inner(*args, **kwargs)  # the model then numbers the packed tokens 0..S-1: one sequence

    model.model.forward = without_positions
    assert not packing.packs_rows(model)


def test_rows_with_holes_in_their_masks_take_the_plain_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = make_tokenizer()
    model = build("llama", tokenizer)
    r = rows_of_lengths(tokenizer, [3, 5, 2, 4, 1, 2, 3, 3, 5, 1, 2, 2])
    holed = r.completion_mask.clone()
    holed[0, 1] = 0  # a hole inside row 0's completion
    forced_packing(monkeypatch, "one")
    choice = choose_layout(r.prompt_ids, r.prompt_mask, holed, UNIT, shared=False, packed=True)
    args = (r.prompt_ids, r.prompt_mask, r.completion_ids, holed, choice)
    assert packing.packed_logprobs(model, *args, lambda z, ids: (z[..., 0], None), False) is None


def test_pack_hand_example() -> None:
    """Rows of 2+2, 1+3 and 3+1 tokens (3 each fed: a completion's last token is only predicted) in bins of
    8: the first two share a bin, the third has its own; unused tails are numbered from 0, sequences of
    their own."""
    prompt_ids = torch.tensor([[0, 11, 12], [0, 0, 21], [31, 32, 33]])
    prompt_mask = (prompt_ids > 0).long()
    completion_ids = torch.tensor([[13, 14, 0], [22, 23, 24], [34, 0, 0]])
    completion_mask = (completion_ids > 0).long()
    bins = pack_rows([3, 3, 3], 8)
    assert bins == [[0, 1], [2]]
    lengths = RowLengths.of(prompt_mask, completion_mask)
    assert lengths == RowLengths(prompt=[2, 1, 3], completion=[2, 3, 1], contiguous=True)
    packed = pack(prompt_ids, completion_ids, lengths, bins, 8)
    assert packed.input_ids.tolist() == [[11, 12, 13, 21, 22, 23, 0, 0], [31, 32, 33, 0, 0, 0, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 0, 1], [0, 1, 2, 0, 1, 2, 3, 4]]
    # completion tokens 13, 14 | 22, 23, 24 | 34 are predicted by flat positions 1, 2 | 3, 4, 5 | 8 + 2
    assert packed.predictors.tolist() == [1, 2, 3, 4, 5, 10]


def test_flops_hand_example() -> None:
    """Rows of 10, 6 and 4 tokens: plain pads to 10, one bin of 20 holds them, bins of 10 need two."""
    cost = ForwardCost(per_token=2.0, per_pair=1.0, per_forward=5.0)
    assert plain_flops([10, 6, 4], cost) == 3 * 10 * 2 + 3 * 100 + 5
    assert pack_rows([10, 6, 4], 20) == [[0, 1, 2]] and pack_rows([10, 6, 4], 10) == [[0], [1, 2]]
    assert packed_flops([10, 6, 4], [[0, 1, 2]], 20, cost) == 20 * 2 + 400 + 5
    assert packed_flops([10, 6, 4], [[0], [1, 2]], 10, cost) == 2 * 10 * 2 + 2 * 100 + 5
    varlen = ForwardCost(2.0, 1.0, 5.0, varlen=True)
    assert packed_flops([10, 6, 4], [[0, 1, 2]], 20, varlen) == 40 + (100 + 36 + 16) + 5
    # rows of 10, 6 and 3: two bins of 10 pad 1 token, one bin of 19 none but attends 19^2 pairs
    assert best_packing([10, 6, 3], cost)[:2] == (10, [[0], [1, 2]])  # 2 x 10 x 2 + 200 < 19 x 2 + 361
    assert best_packing([10, 6, 3], varlen)[:2] == (19, [[0, 1, 2]])  # the rows' own pairs: no padding wins
    # 2 rows of one 3-token prompt with completions of 4 and 1: the prompt once, then one completion forward
    # of both rows (a bucket saves less than a forward costs) 3 tokens wide, attending 3 prompt columns and
    # their own; the minimum: the prompt once, the completions' own tokens. A forward costs 32 token-rows here
    # (the buckets weigh padding against the cost's own per_forward / per_token)
    cost = ForwardCost(per_token=2.0, per_pair=1.0, per_forward=64.0)
    assert shared_flops([3, 3], [4, 1], [0, 0], cost) == (3 * 2 + 9 + 64) + (2 * 3 * 2 + 2 * 3 * (3 + 3) + 64)
    assert minimum_flops([3, 3], [4, 1], [0, 0], cost) == (3 * 2 + 9) + 64 + (3 * 2 + 3 * 6) + 0
    # a forward worth 2.5 token-rows: the 1-token completion's bucket (no tokens fed) saves 3, so it splits
    cheap = ForwardCost(per_token=2.0, per_pair=1.0, per_forward=5.0)
    assert shared_flops([3, 3], [4, 1], [0, 0], cheap) == (3 * 2 + 9 + 5) + (3 * 2 + 3 * (3 + 3) + 5)


@given(st.lists(st.integers(1, 60), min_size=1, max_size=24), st.integers(0, 2))
def test_packing_places_every_row_once_within_capacity(lengths: list[int], extra: int) -> None:
    capacity = max(lengths) * (1 + extra)
    bins = pack_rows(lengths, capacity)
    assert sorted(row for b in bins for row in b) == list(range(len(lengths)))
    assert all(sum(lengths[row] for row in b) <= capacity for b in bins)


@given(st.lists(st.tuples(st.integers(1, 30), st.integers(1, 60)), min_size=1, max_size=16))
def test_no_layout_costs_less_than_the_minimum(rows: list[tuple[int, int]]) -> None:
    """Every layout the FLOPs model counts is at least the minimum (prompts shared in pairs of rows)."""
    cost = ForwardCost(per_token=3.0, per_pair=0.5, per_forward=7.0)
    inverse = [row // 2 for row in range(len(rows))]
    prompts = [rows[2 * (row // 2)][0] for row in range(len(rows))]  # a group's rows share its prompt
    completions = [c for _, c in rows]
    lowest = minimum_flops(prompts, completions, inverse, cost)
    totals = [p + c - 1 for p, c in zip(prompts, completions, strict=True)]  # packed rows: the last token not fed
    assert plain_flops([max(totals) + 1] * len(totals), cost) >= lowest
    assert best_packing(totals, cost)[2] >= lowest
    assert best_packing(totals, ForwardCost(3.0, 0.5, 7.0, varlen=True))[2] >= lowest
    assert shared_flops(prompts, completions, inverse, cost) >= lowest


def test_the_layout_is_the_cheapest_allowed() -> None:
    """Short shared prompts: sharing beats packing (packing repeats each prompt); without sharing
    (distinct prompts, gradient checkpointing) packing beats padding; nothing allowed: plain."""
    tokenizer = make_tokenizer()
    r = rows_of_lengths(tokenizer, [1, 2, 40, 3, 1, 40, 2, 3, 5, 1, 38, 4])
    cost = ForwardCost(per_token=10.0, per_pair=0.1, per_forward=50.0)
    rows = (r.prompt_ids, r.prompt_mask, r.completion_mask)
    both = choose_layout(*rows, cost, shared=True, packed=True)
    assert both.layout == "shared" and both.flops["shared"] < both.flops["packed"] < both.flops["plain"]
    unshared = choose_layout(*rows, cost, shared=False, packed=True)
    assert unshared.layout == "packed" and unshared.bins is not None and "shared" not in unshared.flops
    assert (
        choose_layout(r.prompt_ids, r.prompt_mask, r.completion_mask, cost, shared=False, packed=False).layout
        == "plain"
    )
    # distinct prompts of the same length repeat no prompt: nothing to share (the ids decide, not the masks)
    distinct = torch.arange(r.prompt_ids.numel()).view_as(r.prompt_ids) + 10
    alone = choose_layout(distinct, torch.ones_like(r.prompt_mask), r.completion_mask, cost, shared=True, packed=True)
    assert alone.layout == "packed" and "shared" not in alone.flops


def test_a_run_with_gradient_checkpointing_trains_the_same_packed(tmp_path: Path) -> None:
    """Gradient checkpointing takes no shared prompts, so padding_free packs the training passes: the weights
    after 2 steps equal those of the padded run (within float32 summation order)."""
    calls = {False: 0, True: 0}
    original = packing.packed_logprobs
    trained = {}
    for padding_free in (False, True):

        def counted(*args: Any, padding_free: bool = padding_free, **kwargs: Any) -> Any:
            calls[padding_free] += 1
            return original(*args, **kwargs)

        run = trainer(tmp_path / str(padding_free), gradient_checkpointing=True, padding_free=padding_free)
        logprobs_module.packed_logprobs = counted  # type: ignore[assignment]
        try:
            run.train()
        finally:
            logprobs_module.packed_logprobs = original  # type: ignore[assignment]
        trained[padding_free] = params(run.unwrapped_model)
    assert calls[False] == 0 and calls[True] > 0  # packed passes ran with padding_free only
    for name, value in trained[False].items():
        torch.testing.assert_close(trained[True][name], value, atol=2e-5, rtol=1e-4)
