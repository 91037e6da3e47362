"""Tests for rloo.generation.sampling: agreement with transformers' logits processors, and sampling."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rloo.generation.sampling import (
    SamplingParams,
    apply_min_p,
    apply_repetition_penalty,
    apply_top_k,
    apply_top_p,
    sample_categorical,
    sample_next_token,
)

B, V = 8, 50


def random_logits(seed: int, rows: int = B, vocab: int = V, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * scale


def random_history(seed: int, rows: int = B, length: int = 12, vocab: int = V) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1000)
    return torch.randint(0, vocab, (rows, length), generator=g)


def assert_same_filter(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    """Same -inf positions, and equal values everywhere else."""
    assert torch.equal(torch.isneginf(ours), torch.isneginf(theirs))
    finite = ~torch.isneginf(theirs)
    torch.testing.assert_close(ours[finite], theirs[finite], rtol=0, atol=0)


def hf_pipeline(params: SamplingParams) -> LogitsProcessorList:
    """transformers' processors, in the order ``generate`` builds them (with their enable rules)."""
    processors = LogitsProcessorList()
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    if params.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k != 0:
        processors.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        processors.append(TopPLogitsWarper(params.top_p))
    if params.min_p is not None:
        processors.append(MinPLogitsWarper(params.min_p))
    return processors


# ---------------------------------------------------------------------------- processors vs transformers


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.3, 2.0])
def test_repetition_penalty_matches_transformers(seed: int, penalty: float) -> None:
    logits, history = random_logits(seed), random_history(seed)
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(history, logits.clone())
    ours = apply_repetition_penalty(logits, history, penalty)
    assert_same_filter(ours, theirs)


def test_repetition_penalty_hand_values() -> None:
    logits = torch.tensor([[2.0, -2.0, 0.0, 1.0]])
    history = torch.tensor([[0, 1, 2, 0]])  # a repeated id is penalized once
    out = apply_repetition_penalty(logits, history, 2.0)
    assert out.tolist() == [[1.0, -4.0, 0.0, 1.0]]
    assert logits.tolist() == [[2.0, -2.0, 0.0, 1.0]]  # the input is not modified


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 1.7])
def test_temperature_matches_transformers(seed: int, temperature: float) -> None:
    # temperature is applied inline in sample_next_token (the pipeline tests below cover it there)
    logits = random_logits(seed)
    theirs = TemperatureLogitsWarper(temperature)(random_history(seed), logits.clone())
    assert_same_filter(logits / temperature, theirs)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("top_k", [1, 2, 7, V - 1, V, V + 5])
def test_top_k_matches_transformers(seed: int, top_k: int) -> None:
    logits = random_logits(seed)
    theirs = TopKLogitsWarper(top_k)(random_history(seed), logits.clone())
    ours = apply_top_k(logits, top_k)
    assert_same_filter(ours, theirs)
    assert int((~torch.isneginf(ours)).sum(dim=-1).min()) == min(top_k, V)


def test_top_k_zero_is_identity() -> None:
    logits = random_logits(0)
    assert apply_top_k(logits, 0) is logits


def test_top_k_keeps_ties_at_threshold() -> None:
    logits = torch.tensor([[3.0, 1.0, 1.0, 0.0]])
    theirs = TopKLogitsWarper(2)(torch.zeros(1, 1, dtype=torch.long), logits.clone())
    assert_same_filter(apply_top_k(logits, 2), theirs)
    assert torch.isneginf(apply_top_k(logits, 2)).tolist() == [[False, False, False, True]]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.77, 0.9, 0.99, 1.0])
def test_top_p_matches_transformers(seed: int, top_p: float) -> None:
    logits = random_logits(seed)
    theirs = TopPLogitsWarper(top_p)(random_history(seed), logits.clone())
    assert_same_filter(apply_top_p(logits, top_p), theirs)


def test_top_p_hand_values_and_one_is_identity() -> None:
    # probs 0.5, 0.3, 0.15, 0.05: top_p=0.75 keeps 0.5 and 0.3 (0.5 alone does not reach 0.75)
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert torch.isneginf(apply_top_p(logits, 0.75)).tolist() == [[False, False, True, True]]
    # a small top_p always keeps the most likely token
    assert torch.isneginf(apply_top_p(logits, 0.01)).tolist() == [[False, True, True, True]]
    assert apply_top_p(logits, 1.0) is logits


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("min_p", [0.0, 0.01, 0.1, 0.5, 1.0])
def test_min_p_matches_transformers(seed: int, min_p: float) -> None:
    logits = random_logits(seed)
    theirs = MinPLogitsWarper(min_p)(random_history(seed), logits.clone())
    assert_same_filter(apply_min_p(logits, min_p), theirs)


def test_min_p_none_and_zero_are_identity() -> None:
    logits = random_logits(0)
    assert apply_min_p(logits, None) is logits
    assert apply_min_p(logits, 0.0) is logits


def test_processors_accept_already_filtered_logits() -> None:
    # later processors see -inf from earlier ones (top-k then top-p then min-p)
    logits = apply_top_k(random_logits(3), 5)
    for ours, theirs in [
        (apply_top_p(logits, 0.6), TopPLogitsWarper(0.6)(random_history(3), logits.clone())),
        (apply_min_p(logits, 0.2), MinPLogitsWarper(0.2)(random_history(3), logits.clone())),
    ]:
        assert_same_filter(ours, theirs)


# ---------------------------------------------------------------------------- sample_next_token

PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.3, top_k=5),
    SamplingParams(top_p=0.8),
    SamplingParams(temperature=0.5, min_p=0.1),
    SamplingParams(temperature=0.9, top_k=10, top_p=0.9, min_p=0.05, repetition_penalty=1.5),
    SamplingParams(repetition_penalty=3.0, top_k=3),
]


def kept_by_transformers(logits: torch.Tensor, history: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    return ~torch.isneginf(hf_pipeline(params)(history, logits.clone()))


@pytest.mark.parametrize("params", PARAMS, ids=repr)
def test_documented_order_matches_transformers_pipeline(params: SamplingParams) -> None:
    # penalty, temperature, top-k, top-p, min-p: the order transformers' generate uses
    logits, history = random_logits(4), random_history(4)
    ours = apply_repetition_penalty(logits, history, params.repetition_penalty) / params.temperature
    ours = apply_min_p(apply_top_p(apply_top_k(ours, params.top_k), params.top_p), params.min_p)
    assert_same_filter(ours, hf_pipeline(params)(history, logits.clone()))


@pytest.mark.parametrize("params", PARAMS, ids=repr)
def test_logprob_is_unprocessed_tempered_log_softmax(params: SamplingParams) -> None:
    logits, history = random_logits(0), random_history(0)
    tokens, logprobs = sample_next_token(logits, history, params, torch.Generator().manual_seed(0))
    assert tokens.shape == logprobs.shape == (B,) and tokens.dtype == torch.long
    expected = torch.log_softmax(logits / params.temperature, dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(logprobs, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_step_is_the_plain_steps_bit_for_bit(temperature: float) -> None:
    # its tokens and log-probs are those of logsumexp, exp(scaled - logsumexp) and sample_categorical
    logits, history = random_logits(9, rows=256, vocab=4096), random_history(9, rows=256, vocab=4096)
    tokens, logprobs = sample_next_token(
        logits, history, SamplingParams(temperature=temperature), torch.Generator().manual_seed(3)
    )
    scaled = logits / temperature
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    expected = sample_categorical(torch.exp(scaled - lse), torch.Generator().manual_seed(3))
    assert torch.equal(tokens, expected)
    assert torch.equal(logprobs, scaled.gather(1, tokens.unsqueeze(1)).squeeze(1) - lse.squeeze(1))


def test_bf16_logits_are_upcast() -> None:
    logits = random_logits(1).bfloat16()
    tokens, logprobs = sample_next_token(logits, random_history(1), SamplingParams(temperature=0.7), None)
    assert logprobs.dtype == torch.float32
    expected = torch.log_softmax(logits.float() / 0.7, dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(logprobs, expected, rtol=0, atol=1e-6)


def test_top_k_one_is_argmax() -> None:
    logits, history = random_logits(2, rows=64), random_history(2, rows=64)
    tokens, _ = sample_next_token(logits, history, SamplingParams(top_k=1, temperature=0.3), None)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    # with a repetition penalty, the argmax of the penalized logits (transformers' greedy)
    params = SamplingParams(top_k=1, repetition_penalty=2.0)
    tokens, _ = sample_next_token(logits, history, params, None)
    assert torch.equal(tokens, hf_pipeline(params)(history, logits.clone()).argmax(dim=-1))


@pytest.mark.parametrize("params", PARAMS, ids=repr)
def test_tokens_never_fall_in_filtered_positions(params: SamplingParams) -> None:
    rows = 4096  # 8 distributions x 512 draws each
    logits = random_logits(5).repeat(rows // B, 1)
    history = random_history(5).repeat(rows // B, 1)
    kept = kept_by_transformers(logits, history, params)
    tokens, _ = sample_next_token(logits, history, params, torch.Generator().manual_seed(1))
    assert kept.gather(1, tokens.unsqueeze(1)).all()


@given(
    seed=st.integers(0, 2**16),
    temperature=st.floats(0.2, 2.0),
    top_k=st.integers(0, 12),
    top_p=st.floats(0.05, 1.0),
    min_p=st.one_of(st.none(), st.floats(0.0, 1.0)),
    penalty=st.sampled_from([1.0, 1.2, 2.0]),
)
def test_tokens_in_support_property(
    seed: int, temperature: float, top_k: int, top_p: float, min_p: float | None, penalty: float
) -> None:
    params = SamplingParams(temperature, top_k, top_p, min_p, penalty)
    logits = random_logits(seed, rows=4, vocab=12).repeat(64, 1)
    history = random_history(seed, rows=4, length=5, vocab=12).repeat(64, 1)
    processed = apply_repetition_penalty(logits, history, penalty) / temperature
    processed = apply_min_p(apply_top_p(apply_top_k(processed, top_k), top_p), min_p)
    tokens, logprobs = sample_next_token(logits, history, params, torch.Generator().manual_seed(seed))
    assert (~torch.isneginf(processed)).gather(1, tokens.unsqueeze(1)).all()
    assert torch.isfinite(logprobs).all() and (logprobs <= 0).all()


def test_empirical_frequencies_match_processed_distribution() -> None:
    # 40,000 draws from one row: frequencies within ~5 standard errors of the processed probs
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.95, repetition_penalty=1.5)
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, 3.0, -1.0]])
    history = torch.tensor([[6, 1]])
    n = 40_000
    tokens, _ = sample_next_token(logits.repeat(n, 1), history.repeat(n, 1), params, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=8).double() / n
    probs = torch.softmax(hf_pipeline(params)(history, logits.clone()), dim=-1)[0].double()
    tolerance = 5 * (probs * (1 - probs) / n).sqrt() + 1e-9
    assert ((freq - probs).abs() <= tolerance).all(), (freq, probs)


def test_same_seed_same_tokens_different_seed_different() -> None:
    logits, history = random_logits(7, rows=256), random_history(7, rows=256)
    params = SamplingParams(temperature=1.2, top_p=0.95)

    def draw(seed: int) -> torch.Tensor:
        return sample_next_token(logits, history, params, torch.Generator().manual_seed(seed))[0]

    assert torch.equal(draw(11), draw(11))
    assert not torch.equal(draw(11), draw(12))


def test_inverse_cdf_never_draws_a_zero_probability_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from rloo.generation.sampling import sample_categorical

    probs = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    for u in (0.0, 0.3 / 1.0, 0.999999999, 1.0 - 1e-12):
        monkeypatch.setattr(torch, "rand", lambda shape, u=u, **kw: torch.full(shape, u, dtype=kw.get("dtype")))
        tokens = sample_categorical(probs, None)
        assert probs[0, tokens[0]] > 0 and tokens[1] == 0, (u, tokens)
    monkeypatch.undo()
    # frequencies follow the probabilities
    gen = torch.Generator().manual_seed(0)
    draws = sample_categorical(probs[:1].expand(20000, -1), gen)
    share = (draws == 3).float().mean().item()
    assert abs(share - 0.7) < 0.02  # 6 standard errors of a 20k-draw binomial


def test_temperature_zero_is_greedy_everywhere() -> None:
    # before: temperature 0 divided the logits by zero and sampled the last vocabulary id
    logits = torch.tensor([[0.1, 2.0, -1.0, 0.5], [3.0, 0.0, 0.2, 2.9]])
    history = torch.tensor([[1], [2]])
    tokens, logprobs = sample_next_token(logits, history, SamplingParams(temperature=0.0), None)
    assert tokens.tolist() == [1, 0]
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, dim=-1)[[0, 1], [1, 0]])
    # with a repetition penalty the penalized argmax wins, as transformers' greedy search
    penalized, _ = sample_next_token(
        logits, torch.tensor([[1], [0]]), SamplingParams(0.0, repetition_penalty=10.0), None
    )
    assert penalized.tolist() == [3, 3]
