"""Prompt sharing in the log-prob passes against the plain pass: each distinct prompt is run once and the
completions in length buckets (:func:`length_buckets`, tested on its own too), and the log-probs, entropies
and gradients are those of running every row's prompt + completion."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rloo.forward.forward_overhead as overhead_module
import rloo.forward.shared_prompt as shared_module
import tests.forward.test_lm_head as chunked_head_test
from rloo.algo.masks import completion_mask_from_lengths
from rloo.forward.logprobs import TokenLogprobs
from rloo.forward.shared_prompt import length_buckets
from rloo.generation.rollout import Rollout, left_pad
from rloo.training.passes import no_grad_logprobs
from tests.forward.test_lm_head import rollout
from tests.generation.test_model_families import FAMILIES, PROMPTS, build
from tests.helpers.models import make_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

# full-attention families, whose prompt cache is plain DynamicLayer layers: the shared path
SHARED = {"llama", "qwen2", "qwen3", "qwen3_moe", "phi3", "gpt2", "gpt_neox", "opt", "falcon", "olmo2"}


def logprobs_and_grads(model: Any, r: Rollout, share: bool, grad: bool = True) -> tuple[TokenLogprobs, list[Any]]:
    return chunked_head_test.logprobs_and_grads(model, r, True, share=share, grad=grad)


class PromptRows:
    """The rows and width of every forward's input ids."""

    def __init__(self, model: Any) -> None:
        self.shapes: list[tuple[int, int]] = []
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        self.shapes.append(tuple(kwargs["input_ids"].shape))


def completion_forwards(completion_mask: torch.Tensor) -> list[tuple[int, int]]:
    """The completion forwards' input shapes: one over every row as wide as the pass, or one per length
    bucket as wide as its longest row but one (none for 1-token rows: the prompt predicts their token)."""
    fed = [max(int(length) - 1, 0) for length in completion_mask.sum(dim=1)]
    buckets = length_buckets(fed, overhead_module.CPU_OVERHEAD)
    if len(buckets) == 1:
        return [tuple(completion_mask[:, 1:].shape)] if completion_mask.shape[1] > 1 else []
    return [(len(bucket), max(fed[row] for row in bucket)) for bucket in buckets if max(fed[row] for row in bucket)]


def assert_same(model: Any, r: Rollout, family: str) -> None:
    real = r.completion_mask.bool()
    for grad in (False, True):
        plain, plain_grads = logprobs_and_grads(model, r, False, grad)
        calls = PromptRows(model)
        shared, shared_grads = logprobs_and_grads(model, r, True, grad)
        calls.handle.remove()
        chunked_head_test.assert_same_outputs((shared, shared_grads), (plain, plain_grads), real, 2e-5)
        n, tp = r.prompt_ids.shape
        if family in SHARED:  # 4 prompts once, then the 12 completions on their cache
            assert calls.shapes == [(n // 3, tp), *completion_forwards(r.completion_mask)]
            assert shared.entropy is not None and not shared.logprobs[~real].any() and not shared.entropy[~real].any()
        else:
            assert calls.shapes[-1] == (n, tp + r.completion_ids.shape[1])
    assert (model in shared_module._UNSHARED_MODELS) == (family not in SHARED)


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_prompts_equal_the_plain_pass_for_every_family(family: str) -> None:
    tokenizer = make_tokenizer()
    model = build(family, tokenizer)
    r = rollout(model, tokenizer, [tokenizer.encode(text) for text in PROMPTS])
    assert not r.completion_mask.bool().all() and r.completion_ids.shape[1] > 1
    assert_same(model, r, family)


def test_one_token_completions_need_the_prompt_forward_only() -> None:
    tokenizer = make_tokenizer()
    model = build("llama", tokenizer)
    r = rollout(model, tokenizer, [tokenizer.encode(text) for text in PROMPTS])
    one = Rollout(
        r.prompt_ids,
        r.prompt_mask,
        r.completion_ids[:, :1],
        r.completion_mask[:, :1],
        r.truncated,
        r.sampling_logprobs[:, :1],
        r.group_ids,
    )
    plain, _ = logprobs_and_grads(model, one, False)
    calls = PromptRows(model)
    shared, _ = logprobs_and_grads(model, one, True)
    assert calls.shapes == [(4, r.prompt_ids.shape[1])]
    torch.testing.assert_close(shared.logprobs, plain.logprobs, atol=2e-5, rtol=0)


def test_reference_passes_share_prompts_across_length_sorted_passes() -> None:
    tokenizer = make_tokenizer()
    model = build("qwen2", tokenizer)
    r = rollout(model, tokenizer, [tokenizer.encode(text) for text in PROMPTS])
    lengths = torch.tensor([8, 1, 5, 3, 8, 2, 7, 7, 1, 4, 6, 2])  # passes of 5 rows mix groups and lengths
    mask = completion_mask_from_lengths(lengths, 8)
    r = Rollout(
        r.prompt_ids,
        r.prompt_mask,
        torch.where(mask.bool(), r.completion_ids, tokenizer.pad_token_id),
        mask,
        r.truncated,
        r.sampling_logprobs * mask,
        r.group_ids,
    )
    with torch.no_grad():
        calls = PromptRows(model)
        shared = no_grad_logprobs(model, r, 0.9, max_rows=5)
        calls.handle.remove()
        assert len(calls.shapes) > 3, "some of the 3 passes ran a prompt once for several rows"
        torch.testing.assert_close(shared, no_grad_logprobs(model, r, 0.9, max_rows=1), atol=2e-5, rtol=0)


def test_distinct_prompts_hand_example() -> None:
    ids = torch.tensor([[0, 5, 6], [7, 8, 9], [0, 5, 6], [0, 5, 6], [0, 0, 4]])
    mask = (ids != 0).long()
    groups = shared_module.distinct_prompts(ids, mask)
    assert groups is not None
    first, inverse = groups
    assert torch.equal(ids[first][inverse], ids) and len(first) == 3
    assert sorted(first.tolist()) == [0, 1, 4]  # each prompt's first row
    assert shared_module.distinct_prompts(ids[:2], mask[:2]) is None  # nothing shared
    mask[4] = 0
    assert shared_module.distinct_prompts(ids, mask) is None  # an empty prompt: the plain pass


def test_gradient_checkpointing_in_training_takes_the_plain_pass_without_remembering_it() -> None:
    tokenizer = make_tokenizer()
    model = build("llama", tokenizer)
    r = rollout(model, tokenizer, [tokenizer.encode(text) for text in PROMPTS])
    model.gradient_checkpointing_enable()
    model.train()  # transformers turns use_cache off: no prompt cache to share
    calls = PromptRows(model)
    training, _ = logprobs_and_grads(model, r, True)
    assert calls.shapes == [(12, r.prompt_ids.shape[1] + r.completion_ids.shape[1])]
    model.eval()  # the same model in eval mode shares again
    calls.shapes.clear()
    evaluated, _ = logprobs_and_grads(model, r, True, grad=False)
    assert len(calls.shapes) == 2 and model not in shared_module._UNSHARED_MODELS
    real = r.completion_mask.bool()
    torch.testing.assert_close(training.logprobs[real], evaluated.logprobs[real], atol=2e-5, rtol=0)


# completion lengths of 4 prompts x 3 rows: mostly short, three rows near 40 tokens
VARIED = [1, 2, 40, 3, 1, 40, 2, 3, 5, 1, 38, 4]


def rows_of_lengths(tokenizer: Any, lengths: list[int]) -> Rollout:
    """The 4 prompts, 3 rows each, with random completions of ``lengths`` tokens (right-padded)."""
    prompts = [tokenizer.encode(text) for text in PROMPTS for _ in range(3)]
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.pad_token_id, torch.device("cpu"))
    mask = completion_mask_from_lengths(torch.tensor(lengths), max(lengths))
    ids = torch.randint(0, len(tokenizer), mask.shape, generator=torch.Generator().manual_seed(0))
    rows = len(lengths)
    completion_ids = torch.where(mask.bool(), ids, tokenizer.pad_token_id)
    return Rollout(
        prompt_ids,
        prompt_mask,
        completion_ids,
        mask,
        torch.zeros(rows, dtype=torch.bool),
        mask * 0,
        torch.arange(rows) // 3,
    )


@pytest.mark.parametrize("overhead", [overhead_module.CPU_OVERHEAD, 0])  # 0: a bucket per distinct length
@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_length_buckets_equal_the_plain_pass(family: str, overhead: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(overhead_module, "CPU_OVERHEAD", overhead)
    tokenizer = make_tokenizer()
    model = build(family, tokenizer)
    r = rows_of_lengths(tokenizer, VARIED)
    assert len(completion_forwards(r.completion_mask)) >= 2, "the completions run in several buckets"
    assert_same(model, r, family)


def test_buckets_run_one_completion_forward_each(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = make_tokenizer()
    model = build("llama", tokenizer)
    tp = rows_of_lengths(tokenizer, VARIED).prompt_ids.shape[1]
    expected = {
        # 9 rows of at most 5 tokens, then 3 of up to 40: each forward as wide as its longest row but one
        tuple(VARIED): [(4, tp), (9, 4), (3, 39)],
        (40,) * 12: [(4, tp), (12, 39)],  # equal lengths: one bucket
        (1, 2, 3, 4) * 3: [(4, tp), (12, 3)],  # lengths too close for a bucket to pay its forward
    }
    for lengths, shapes in expected.items():
        calls = PromptRows(model)
        with torch.no_grad():
            logprobs_and_grads(model, rows_of_lengths(tokenizer, list(lengths)), True, grad=False)
        calls.handle.remove()
        assert calls.shapes == shapes, lengths
    monkeypatch.setattr(overhead_module, "CPU_OVERHEAD", 0)  # a bucket per length; 1-token rows: no forward
    calls = PromptRows(model)
    with torch.no_grad():
        logprobs_and_grads(model, rows_of_lengths(tokenizer, VARIED), True, grad=False)
    assert calls.shapes == [(4, tp), (2, 1), (2, 2), (1, 3), (1, 4), (1, 37), (2, 39)]


def bucket_cost(lengths: list[int], buckets: list[list[int]], overhead: int) -> int:
    return sum(len(bucket) * max(lengths[row] for row in bucket) + overhead for bucket in buckets)


def cheapest_contiguous_partition(lengths: list[int], overhead: int) -> int:
    """Brute force: the cost of every way to cut the sorted lengths into contiguous buckets."""
    ordered, costs = sorted(lengths), []
    for cuts in itertools.product([False, True], repeat=len(ordered) - 1):
        bounds = [0, *(i + 1 for i, cut in enumerate(cuts) if cut), len(ordered)]
        segments = [ordered[a:b] for a, b in itertools.pairwise(bounds)]
        costs.append(sum(len(segment) * max(segment) + overhead for segment in segments))
    return min(costs)


def assert_partition_of_sorted_rows(lengths: list[int], buckets: list[list[int]]) -> None:
    assert all(buckets), "no empty bucket"
    rows = [row for bucket in buckets for row in bucket]
    assert sorted(rows) == list(range(len(lengths))), "every row in exactly one bucket"
    assert [lengths[row] for row in rows] == sorted(lengths), "buckets are contiguous in the sorted lengths"


@given(st.lists(st.integers(0, 50), min_size=1, max_size=9), st.integers(0, 64))
def test_length_buckets_are_the_cheapest_contiguous_partition(lengths: list[int], overhead: int) -> None:
    buckets = length_buckets(lengths, overhead)
    assert_partition_of_sorted_rows(lengths, buckets)
    assert bucket_cost(lengths, buckets, overhead) == cheapest_contiguous_partition(lengths, overhead)


@given(st.lists(st.integers(0, 4096), min_size=1, max_size=300), st.integers(0, 256))
def test_length_buckets_never_cost_more_than_one_forward(lengths: list[int], overhead: int) -> None:
    buckets = length_buckets(lengths, overhead)
    assert_partition_of_sorted_rows(lengths, buckets)
    assert bucket_cost(lengths, buckets, overhead) <= len(lengths) * max(lengths) + overhead
    assert length_buckets([lengths[0]] * len(lengths), overhead) == [list(range(len(lengths)))]


def test_length_buckets_hand_example() -> None:
    lengths = [0, 1, 39, 2, 0, 39, 1, 2, 4, 0, 37, 3]  # VARIED less one: the tokens the completion forward holds
    # one bucket: 12 x 39 + 32 = 500; the 9 short rows apart: 9 x 4 + 32 + 3 x 39 + 32 = 217
    assert length_buckets(lengths, 32) == [[0, 4, 9, 1, 6, 3, 7, 11, 8], [10, 2, 5]]
    assert length_buckets(lengths, 0) == [[0, 4, 9], [1, 6], [3, 7], [11], [8], [10], [2, 5]]
    assert length_buckets(lengths, 10_000) == [sorted(range(12), key=lengths.__getitem__)]
    assert length_buckets([], 32) == []
