"""Prompt sharing in the log-prob passes against the plain pass: each distinct prompt is run once, and
the log-probs, entropies and gradients are those of running every row's prompt + completion."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import rloo.generation.shared_prompt as shared_module
import tests.test_chunked_head as chunked_head_test
from rloo.algo.masks import completion_mask_from_lengths
from rloo.generation.logprobs import TokenLogprobs
from rloo.generation.rollout import Rollout
from rloo.training.passes import no_grad_logprobs
from tests.helpers.models import make_tokenizer
from tests.test_chunked_head import rollout
from tests.test_model_families import FAMILIES, PROMPTS, build

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
            assert calls.shapes == [(n // 3, tp), (n, r.completion_ids.shape[1] - 1)]
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
