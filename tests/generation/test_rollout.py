"""Tests for rloo.generation.rollout and rloo.forward.logprobs on a tiny random Llama (offline, CPU).

The model's weights are re-drawn larger than Llama's init so that next-token distributions
are peaked and varied (the stock init gives near-uniform logits and greedy decoding that
repeats one token), which makes greedy comparisons meaningful and EOS reachable.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from rloo.algo.stats import entropy_from_logits
from rloo.forward.logprobs import completion_logprobs, token_logprobs_and_entropy
from rloo.generation.multimodal import position_ids_from_mask
from rloo.generation.rollout import Rollout, generate_rollouts, left_pad
from rloo.generation.sampling import SamplingParams

TEXTS = ["hello world", "ab", "x = 1 + 2?", "Q"]  # different lengths: left padding differs per row
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tokenizer(char_tokenizer: Any) -> Any:
    return char_tokenizer


@pytest.fixture(scope="module")
def model(peaked_model: Any) -> Any:
    return peaked_model


@pytest.fixture(scope="module")
def prompts(tokenizer: Any) -> list[list[int]]:
    return [tokenizer.encode(text) for text in TEXTS]


def rollout(model: Any, prompts: list[list[int]], **kwargs: Any) -> Rollout:
    defaults: dict[str, Any] = {
        "num_generations": 3,
        "max_new_tokens": 10,
        "params": SamplingParams(),
        "eos_token_ids": list(range(3, 12)),  # several ids, so that some rows end early
        "pad_token_id": 0,
        "generator": torch.Generator().manual_seed(0),
    }
    return generate_rollouts(model, prompts, list(range(len(prompts))), **{**defaults, **kwargs})


def hf_greedy(model: Any, prompts: list[list[int]], max_new_tokens: int, eos: list[int], **kwargs: Any) -> torch.Tensor:
    ids, mask = left_pad(prompts, 0, CPU)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=0,
        eos_token_id=eos,
        **kwargs,
    )
    return out[:, ids.shape[1] :]


# ---------------------------------------------------------------------------- helpers


def test_left_pad_hand_example() -> None:
    ids, mask = left_pad([[5, 6, 7], [8], []], pad_id=0, device=CPU)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert ids.dtype == mask.dtype == torch.long
    ids, mask = left_pad([[4], [4, 9]], pad_id=2, device=CPU)
    assert ids.tolist() == [[2, 4], [4, 9]] and mask.tolist() == [[0, 1], [1, 1]]


def test_position_ids_from_mask_hand_example() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]])
    assert position_ids_from_mask(mask).tolist() == [
        [0, 0, 0, 1, 2],  # padding gets 0 (clamped), the first real token too
        [0, 1, 2, 3, 4],
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0],
    ]


# ---------------------------------------------------------------------------- structure


def test_rollout_shapes_groups_and_masks(model: Any, prompts: list[list[int]]) -> None:
    k, max_new = 3, 10
    eos = list(range(3, 12))
    r = generate_rollouts(
        model,
        prompts,
        [10, 11, 12, 13],
        num_generations=k,
        max_new_tokens=max_new,
        params=SamplingParams(),
        eos_token_ids=eos,
        pad_token_id=0,
        generator=torch.Generator().manual_seed(0),
    )
    n, tp = len(prompts) * k, max(len(p) for p in prompts)
    tc = r.completion_ids.shape[1]
    assert r.prompt_ids.shape == r.prompt_mask.shape == (n, tp)
    assert r.completion_ids.shape == r.completion_mask.shape == r.sampling_logprobs.shape == (n, tc)
    assert r.truncated.shape == r.group_ids.shape == (n,)
    assert r.completion_mask.dtype == torch.float32 and r.truncated.dtype == torch.bool
    # the K samples of a prompt are consecutive and share the prompt
    assert r.group_ids.tolist() == [10, 10, 10, 11, 11, 11, 12, 12, 12, 13, 13, 13]
    ids, mask = left_pad(prompts, 0, CPU)
    assert torch.equal(r.prompt_ids, ids.repeat_interleave(k, dim=0))
    assert torch.equal(r.prompt_mask, mask.repeat_interleave(k, dim=0))
    # this seed gives both kinds of rows, so both branches below are exercised
    assert r.truncated.any() and not r.truncated.all()
    assert tc == max_new  # a truncated row runs to the limit
    is_eos = torch.isin(r.completion_ids, torch.tensor(eos))
    for row in range(n):
        ids_row, mask_row = r.completion_ids[row], r.completion_mask[row]
        length = int(mask_row.sum())
        assert mask_row.tolist() == [1.0] * length + [0.0] * (tc - length)
        if r.truncated[row]:
            assert length == tc and not is_eos[row].any()
        else:
            first_eos = int(is_eos[row].int().argmax())
            assert length == first_eos + 1  # up to and including the first EOS
            assert (ids_row[length:] == 0).all()  # pad after it
    assert (r.sampling_logprobs[r.completion_mask == 0] == 0).all()
    assert (r.sampling_logprobs[r.completion_mask == 1] < 0).all()
    assert r.num_completion_tokens == int(r.completion_mask.sum())


def test_stops_as_soon_as_every_row_ends(model: Any, prompts: list[list[int]]) -> None:
    r = rollout(model, prompts, eos_token_ids=list(range(model.config.vocab_size)), max_new_tokens=8)
    assert r.completion_ids.shape == (12, 1)  # every token is an EOS: one step, no further forward
    assert r.completion_mask.tolist() == [[1.0]] * 12 and not r.truncated.any()
    r = rollout(model, prompts, max_new_tokens=1, eos_token_ids=[1])
    assert r.completion_ids.shape == (12, 1)


# ---------------------------------------------------------------------------- log-probs


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=8, top_p=0.9, repetition_penalty=1.3),
        SamplingParams(temperature=0.9, min_p=0.05),
    ],
    ids=repr,
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sampling_logprobs_equal_forward_pass(
    model: Any, prompts: list[list[int]], params: SamplingParams, dtype: torch.dtype
) -> None:
    # KV cache + prefix sharing + positions under left padding == one full forward pass.
    # In float64 only the final float32 log-softmax rounds; in float32 the two paths' matmuls
    # round differently on logits of size ~20 (a few 1e-6 per op), hence the looser bound.
    net = copy.deepcopy(model).to(dtype)
    r = rollout(net, prompts, params=params, num_generations=2, max_new_tokens=12)
    assert r.completion_mask.sum() > 12  # more than one token per row on average
    with torch.no_grad():
        forward = completion_logprobs(
            net, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, params.temperature
        ).logprobs
    atol = 1e-5 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(forward * r.completion_mask, r.sampling_logprobs, rtol=0, atol=atol)


def test_chunked_logprobs_and_entropy_equal_the_full_vocabulary_formulas() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(11, 7, 33, generator=g) * 4
    ids = torch.randint(0, 33, (11, 7), generator=g)
    for temperature in (1.0, 0.7):
        z = logits / temperature
        expected = torch.log_softmax(z, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        out, entropy = token_logprobs_and_entropy(logits, ids, temperature, True, False)
        assert out.shape == (11, 7) and out.dtype == torch.float32
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
        assert entropy is not None
        torch.testing.assert_close(entropy, entropy_from_logits(z), rtol=0, atol=1e-4)
    # bf16 logits are computed in float32
    out, none = token_logprobs_and_entropy(logits.bfloat16(), ids, 1.0, False, False)
    assert out.dtype == torch.float32 and none is None
    ref = torch.log_softmax(logits.bfloat16().float(), dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def test_chunking_does_not_change_results_or_gradients() -> None:
    g = torch.Generator().manual_seed(1)
    big = torch.randn(40, 300, 2000, generator=g)  # 24M elements: several chunks of 2**24
    ids = torch.randint(0, 2000, (40, 300), generator=g)
    leaf = big.clone().requires_grad_(True)
    out, entropy = token_logprobs_and_entropy(leaf, ids, 1.0, True, True)
    assert entropy is not None
    (out.sum() + entropy.sum()).backward()
    full = big.clone().requires_grad_(True)
    expected = torch.log_softmax(full, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    (expected.sum() + entropy_from_logits(full).sum()).backward()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-4)
    assert leaf.grad is not None and full.grad is not None
    torch.testing.assert_close(leaf.grad, full.grad, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------- greedy and seeds


def test_greedy_matches_transformers_generate(model: Any, prompts: list[list[int]]) -> None:
    max_new = 14
    free = hf_greedy(model, prompts, max_new, eos=[1])
    assert not (free == 1).any()
    # pick EOS ids that the greedy paths hit mid-way, so rows end at different steps
    eos = [int(free[1, 3]), int(free[3, 6])]
    expected = hf_greedy(model, prompts, max_new, eos=eos)
    k = 2
    ours = rollout(
        model, prompts, params=SamplingParams(top_k=1), num_generations=k, max_new_tokens=max_new, eos_token_ids=eos
    )
    lengths = ours.completion_mask.sum(dim=1)
    assert len(set(lengths.tolist())) > 2 and ours.truncated.any() and not ours.truncated.all()
    for row in range(ours.completion_ids.shape[0]):
        length = int(lengths[row])
        assert ours.completion_ids[row, :length].tolist() == expected[row // k, :length].tolist()
        if not ours.truncated[row]:
            assert int(expected[row // k, length - 1]) in eos
    assert ours.completion_ids.shape[1] == expected.shape[1]


def test_greedy_with_repetition_penalty_matches_transformers_without_padding(model: Any, tokenizer: Any) -> None:
    same_length = [tokenizer.encode(text) for text in ("abcd", "hey!", "1+2=")]
    expected = hf_greedy(model, same_length, 12, eos=[1], repetition_penalty=1.5)
    ours = rollout(
        model,
        same_length,
        params=SamplingParams(top_k=1, repetition_penalty=1.5),
        num_generations=1,
        max_new_tokens=12,
        eos_token_ids=[1],
    )
    assert torch.equal(ours.completion_ids, expected)
    assert not torch.equal(expected, hf_greedy(model, same_length, 12, eos=[1]))  # the penalty mattered


def test_repetition_penalty_ignores_left_padding(model: Any, prompts: list[list[int]]) -> None:
    # pad = eos (the pad-less-tokenizer fallback): with padding penalized, a row's chance to
    # stop depends on how much padding its batch gave it.
    penalty = 3.0
    row = 3  # "Q": the most left padding
    first = int(hf_greedy(model, prompts, 1, eos=[1], repetition_penalty=penalty)[row, 0])
    assert first not in prompts[row]
    expected = hf_greedy(model, prompts, 4, eos=[first], repetition_penalty=penalty)
    assert int(expected[row, 0]) == first  # transformers: the row ends at once
    ours = generate_rollouts(
        model,
        prompts,
        [0, 1, 2, 3],
        num_generations=1,
        max_new_tokens=4,
        params=SamplingParams(top_k=1, repetition_penalty=penalty),
        eos_token_ids=[first],
        pad_token_id=first,
    )
    assert int(ours.completion_ids[row, 0]) == first


def test_same_seed_same_rollout_different_seed_different(model: Any, prompts: list[list[int]]) -> None:
    params = SamplingParams(temperature=1.5)

    def run(seed: int) -> Rollout:
        return rollout(model, prompts, params=params, generator=torch.Generator().manual_seed(seed))

    a, b, c = run(3), run(3), run(4)
    for name in ("completion_ids", "completion_mask", "truncated", "sampling_logprobs"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert not torch.equal(a.completion_ids, c.completion_ids)
    # the K samples of a prompt are not copies of each other
    assert len({tuple(row) for row in a.completion_ids[:3].tolist()}) > 1


def test_preallocated_cache_layer_matches_concatenation() -> None:
    from rloo.generation.kv_cache import PreallocatedLayer

    g = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 3, 4, 5, generator=g), torch.randn(2, 3, 4, 5, generator=g)
    layer = PreallocatedLayer(keys, values, capacity=6)
    expected_k, expected_v = keys, values
    for _ in range(4):  # the last two go past the capacity and fall back to growing
        k, v = torch.randn(2, 3, 1, 5, generator=g), torch.randn(2, 3, 1, 5, generator=g)
        expected_k, expected_v = torch.cat([expected_k, k], dim=-2), torch.cat([expected_v, v], dim=-2)
        got_k, got_v = layer.update(k, v)
        assert torch.equal(got_k, expected_k) and torch.equal(got_v, expected_v)
        assert layer.get_seq_length() == expected_k.shape[-2]


def test_selective_logprob_backward_matches_autograd() -> None:
    from rloo.forward.logprobs import _SelectiveLogprob

    g = torch.Generator().manual_seed(2)
    z = torch.randn(3, 4, 7, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 7, (3, 4), generator=g)
    assert torch.autograd.gradcheck(lambda x: _SelectiveLogprob.apply(x, ids), (z,))
    for temperature in (1.0, 0.6):
        leaf = torch.randn(5, 6, 50, generator=g).requires_grad_(True)
        ids = torch.randint(0, 50, (5, 6), generator=g)
        weights = torch.randn(5, 6, generator=g)
        out, _ = token_logprobs_and_entropy(leaf, ids, temperature, True, False)
        (out * weights).sum().backward()
        plain = leaf.detach().clone().requires_grad_(True)
        expected = torch.log_softmax(plain / temperature, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        (expected * weights).sum().backward()
        assert leaf.grad is not None and plain.grad is not None
        torch.testing.assert_close(leaf.grad, plain.grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("shared", [True, False], ids=["shared-cache", "k-fold-fallback"])
def test_the_prefill_builds_only_the_last_positions_logits(
    model: Any, prompts: list[list[int]], shared: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # before: the prefill built (P, Tp, V) logits and used the last position only; at 64 prompts x
    # 4k tokens x a 151,936-token vocabulary that is 74 GiB in bf16 (issue 25). transformers'
    # generate passes logits_to_keep=1 for this reason.
    import rloo.generation.rollout as rollout_module

    if not shared:  # a cache that cannot be shared: a second prefill over the P*K rows
        monkeypatch.setattr(rollout_module, "share_prefill", lambda cache, k: False)
    shapes: list[tuple[int, ...]] = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape)))
    try:
        expected = rollout(model, prompts, max_new_tokens=4)
    finally:
        hook.remove()
    prefills = shapes[: 1 if shared else 2]
    assert all(shape[1] == 1 for shape in prefills), prefills  # one position per row, never Tp
    assert shapes[0][0] == len(prompts)
    assert expected.completion_ids.shape[0] == len(prompts) * 3
