"""The chunked LM head against the plain path: the same log-probs, entropies and gradients for every
model family, no ``(rows, T, V)`` logits, and the plain path for heads it cannot reproduce."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import transformers

import rloo.forward.lm_head as lm_head_module
from rloo.algo.masks import completion_mask_from_lengths
from rloo.forward.fused_head import KERNEL_VARIABLE
from rloo.forward.logprobs import TokenLogprobs, completion_logprobs
from rloo.generation.rollout import Rollout, generate_rollouts
from rloo.generation.sampling import SamplingParams
from rloo.training.passes import max_rows_per_pass
from tests.generation.test_model_families import FAMILIES, GQA, PROMPTS, build, encode_vision
from tests.helpers.models import make_tokenizer, qwen_vocab_model
from tests.helpers.vision import VISION_FAMILIES, build_vision

pytestmark = pytest.mark.usefixtures("one_thread")


def rollout(
    model: Any, tokenizer: Any, prompt_ids: list[list[int]], vision: Any = None, eos: tuple[int, ...] = (3, 4)
) -> Rollout:
    return generate_rollouts(
        model,
        prompt_ids,
        list(range(len(prompt_ids))),
        num_generations=3,
        max_new_tokens=8,
        params=SamplingParams(temperature=1.0),
        eos_token_ids=[tokenizer.eos_token_id, *eos],  # rows of different lengths: padding in the passes
        pad_token_id=tokenizer.pad_token_id,
        sampling_seed=0,
        vision=vision,
    )


def logprobs_and_grads(
    model: Any,
    r: Rollout,
    chunked: bool,
    entropy_requires_grad: bool = True,
    share: bool = False,  # the chunked head alone here (tests/forward/test_shared_prompt.py: with prompt sharing)
    grad: bool = True,
) -> tuple[TokenLogprobs, list[torch.Tensor]]:
    """The log-probs of ``r``'s completions and (``grad``) the gradients of a loss weighing every
    token's log-prob and entropy differently."""
    model.zero_grad()
    with torch.set_grad_enabled(grad):
        out = completion_logprobs(
            model,
            r.prompt_ids,
            r.prompt_mask,
            r.completion_ids,
            r.completion_mask,
            0.9,
            with_entropy=True,
            entropy_requires_grad=entropy_requires_grad,
            vision=r.vision,
            chunked_head=chunked,
            share_prompts=share,
        )
    assert out.entropy is not None
    if not grad:
        return out, []
    mask = r.completion_mask
    weights = torch.linspace(-1.0, 1.0, mask.numel()).view_as(mask)
    ((out.logprobs * mask * weights).sum() + 0.1 * (out.entropy * mask).sum()).backward()
    return out, [p.grad.clone() for p in model.parameters() if p.grad is not None]


def assert_same_outputs(
    ours: tuple[TokenLogprobs, list[torch.Tensor]],
    theirs: tuple[TokenLogprobs, list[torch.Tensor]],
    real: Any,
    atol: float,
) -> None:
    """Log-probs and entropies equal at the real tokens, gradients equal, within float32 summation order."""
    assert ours[0].entropy is not None and theirs[0].entropy is not None
    torch.testing.assert_close(ours[0].logprobs[real], theirs[0].logprobs[real], atol=atol, rtol=0)
    torch.testing.assert_close(ours[0].entropy[real], theirs[0].entropy[real], atol=atol, rtol=0)
    assert len(ours[1]) == len(theirs[1])
    for mine, other in zip(ours[1], theirs[1], strict=True):  # relative to the gradient's scale (recurrent
        # layers sum a token's many paths in another order)
        torch.testing.assert_close(mine, other, rtol=0, atol=atol * max(1.0, float(other.abs().max())))


class HeadCalls:
    """The largest number of logits one call of the head produced."""

    def __init__(self, head: torch.nn.Module) -> None:
        self.largest = 0
        self.handle = head.register_forward_hook(self)

    def __call__(self, module: Any, args: Any, out: torch.Tensor) -> None:
        self.largest = max(self.largest, out.numel())


def assert_chunked_equals_plain(
    model: Any, r: Rollout, monkeypatch: pytest.MonkeyPatch, fast: bool = True, kernel: str = "chunked"
) -> None:
    """The head's pass (``kernel``: the chunked head, or the fused head, a CPU's default) against the plain
    path; the fused head sums its gradients in another order (tile by tile), within 3e-5."""
    monkeypatch.setenv(KERNEL_VARIABLE, kernel)
    vocab = model.get_output_embeddings().weight.shape[0]
    monkeypatch.setattr(lm_head_module, "CHUNK_ELEMENTS", 5 * vocab)  # chunks of 5 tokens: several per pass
    real = r.completion_mask.bool()
    assert int(real.sum()) > 10 and not real.all(), "passes should hold real tokens and padding"
    for entropy_requires_grad in (False, True):
        plain, plain_grads = logprobs_and_grads(model, r, False, entropy_requires_grad)
        calls = HeadCalls(model.get_output_embeddings())
        chunked, chunked_grads = logprobs_and_grads(model, r, True, entropy_requires_grad)
        calls.handle.remove()
        assert_same_outputs((chunked, chunked_grads), (plain, plain_grads), real, 1e-5 if kernel == "chunked" else 3e-5)
        full = r.completion_ids.numel() * vocab
        if fast:  # the first position of each row (the check) and 5-token chunks: never the full logits
            assert calls.largest <= max(5, r.completion_ids.shape[0]) * vocab < full
            assert (chunked.logprobs[~real] == 0).all()
        else:
            assert calls.largest >= full


@pytest.mark.parametrize("kernel", ["chunked", "fused"])
@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_head_equals_the_plain_path_for_every_family(
    family: str, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = make_tokenizer()
    model = build(family, tokenizer)
    assert lm_head_module.chunkable_head(model) is model.get_output_embeddings()
    r = rollout(model, tokenizer, [tokenizer.encode(text) for text in PROMPTS])
    assert_chunked_equals_plain(model, r, monkeypatch, kernel=kernel)
    assert lm_head_module.chunkable_head(model) is not None, "the head passed the check"


@pytest.mark.parametrize("family", VISION_FAMILIES)
def test_vision_chunked_head_equals_the_plain_path(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    processor, model = build_vision(family)
    ids, vision = encode_vision(processor)
    # no extra EOS ids: one could be an image placeholder, kept as the EOS it also is
    r = rollout(model, processor.tokenizer, ids, vision, eos=())
    lengths = torch.minimum(r.completion_mask.sum(dim=1), torch.tensor([8.0, 3, 6, 2] * 3))  # padding in the pass
    mask = completion_mask_from_lengths(lengths.long(), r.completion_ids.shape[1])
    r = dataclasses.replace(
        r,
        completion_ids=torch.where(mask.bool(), r.completion_ids, processor.tokenizer.pad_token_id),
        completion_mask=mask,
    )
    assert_chunked_equals_plain(model, r, monkeypatch)


def test_gemma_soft_capping_is_reproduced() -> None:
    tokenizer = make_tokenizer()
    model = build("gemma2", tokenizer)
    assert model.config.final_logit_softcapping == 30.0
    hidden = torch.randn(2, 3, model.config.hidden_size)
    with torch.no_grad():
        capped = lm_head_module.head_logits(model.get_output_embeddings(), hidden, 30.0)
    assert capped.abs().max() < 30.0 and not torch.equal(capped, model.get_output_embeddings()(hidden))


def test_a_head_followed_by_a_logit_scale_falls_back_to_the_plain_path(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = make_tokenizer()
    config = transformers.GraniteConfig(
        vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id, logits_scaling=4.0, **GQA
    )
    torch.manual_seed(0)
    model = transformers.GraniteForCausalLM(config).eval()  # logits = lm_head(h) / logits_scaling
    r = rollout(model, tokenizer, [tokenizer.encode(text) for text in PROMPTS])
    assert lm_head_module.chunkable_head(model) is not None
    assert_chunked_equals_plain(model, r, monkeypatch, fast=False)  # the check failed: the plain path, twice
    assert lm_head_module.chunkable_head(model) is None  # and from then on


def test_a_model_without_output_embeddings_or_compiled_takes_the_plain_path() -> None:
    tokenizer = make_tokenizer()
    model = build("llama", tokenizer)
    assert lm_head_module.chunkable_head(torch.compile(model)) is None
    model.get_output_embeddings = lambda: None  # type: ignore[method-assign]
    assert lm_head_module.chunkable_head(model) is None


def test_passes_of_a_chunked_head_are_not_split_by_the_logits_budget() -> None:
    tokenizer = make_tokenizer()
    llama = build("llama", tokenizer)
    config = transformers.GraniteConfig(vocab_size=len(tokenizer), logits_scaling=4.0, **GQA)
    granite = transformers.GraniteForCausalLM(config).eval()
    r = rollout(llama, tokenizer, [tokenizer.encode(text) for text in PROMPTS])
    budget = 2 * r.prompt_ids.shape[1] * len(tokenizer) * 4 / 2**20  # a whole row's logits: 2 of them
    assert max_rows_per_pass(llama, r, 1e-6, cap=8) == 8  # chunks: the budget bounds the chunk, not the rows
    assert max_rows_per_pass(llama, r, budget, cap=8, compiled=True) == 1  # compiled passes: the plain path
    assert not lm_head_module.head_is_exact(granite, r.completion_ids[:1, :2])  # a probe, no pass yet
    assert max_rows_per_pass(granite, r, budget, cap=8) == 1


def test_the_probe_depends_on_the_model_only(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = make_tokenizer()
    model = build("llama", tokenizer)
    ids = torch.tensor([[5, 6]])
    assert lm_head_module.head_is_exact(model, ids)
    lm_head_module._INEXACT_HEADS.add(model.get_output_embeddings())  # a pass's check failed (under autocast)
    assert lm_head_module.chunkable_head(model) is None and lm_head_module.head_is_exact(model, ids)
    other = build("qwen2", tokenizer)

    def needs_more(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("pixel_values are required")

    monkeypatch.setattr(other, "forward", needs_more)
    assert not lm_head_module.head_is_exact(other, ids)  # a probe that cannot run: the row split
    assert other.get_output_embeddings() not in lm_head_module._PROBED  # asked again next time


def test_the_probe_runs_in_the_passes_precision_under_accelerates_bf16(fresh_accelerate_state: Any) -> None:
    # accelerate's bf16 wrapper hands back bf16-rounded logits; a probe comparing them with a float32 head
    # product outside autocast failed, and every pass of a 151,936-token vocabulary was planned as one row
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(mixed_precision="bf16", cpu=True)
    model = accelerator.unwrap_model(accelerator.prepare(qwen_vocab_model().eval()))
    ids = torch.tensor([[5, 6]])
    r = Rollout(
        prompt_ids=torch.full((8, 8), 5),
        prompt_mask=torch.ones(8, 8),
        completion_ids=torch.full((8, 6), 7),
        completion_mask=torch.ones(8, 6),
        truncated=torch.zeros(8, dtype=torch.bool),
        sampling_logprobs=torch.zeros(8, 6),
        group_ids=torch.arange(8),
    )
    assert max_rows_per_pass(model, r, 16, cap=8, autocast=accelerator.autocast) == 8
    assert lm_head_module.head_is_exact(model, ids, accelerator.autocast)
    # the verdict is kept per precision: outside autocast this wrapped model's head is not reproduced
    assert not lm_head_module.head_is_exact(model, ids)
    assert max_rows_per_pass(model, r, 16, cap=8) == 1  # the plain path's budget: 8.1 MiB a row
