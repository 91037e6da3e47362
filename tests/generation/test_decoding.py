"""Sampler compaction (finished rows leave the decode batch) against the plain loop: the same tokens,
the same log-probs, for every model family, sampling setting and randomness source."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer, LinearAttentionAndFullAttentionLayer

import rloo.generation.decoding as decoding_module
from rloo.generation.kv_cache import PreallocatedLayer, can_select_rows, select_rows
from rloo.generation.rollout import Rollout, generate_rollouts
from rloo.generation.sampling import SamplingParams
from rloo.generation.stopping import StopStrings
from rloo.op_counts import OpCounts
from tests.generation.test_model_families import FAMILIES, PROMPTS, build, encode_vision, rows
from tests.helpers.models import make_tokenizer
from tests.helpers.vision import VISION_FAMILIES, build_vision

pytestmark = pytest.mark.usefixtures("one_thread")

EOS = list(range(3, 12))
TEXTS = ["hello world", "ab", "x = 1 + 2?", "Q"]  # several ids, so that rows end at different steps


class SelectSpy:
    """Counts compactions and the decode-batch sizes they leave."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        monkeypatch.setattr(decoding_module, "select_rows", self)

    def __call__(self, cache: Any, indices: torch.Tensor) -> None:
        self.sizes.append(len(indices))
        select_rows(cache, indices)


def sample(model: Any, prompt_ids: list[list[int]], compact_at: float | None, **kwargs: Any) -> Rollout:
    settings: dict[str, Any] = {
        "num_generations": 3,
        "max_new_tokens": 12,
        "params": SamplingParams(temperature=1.0),
        "eos_token_ids": EOS,
        "pad_token_id": 0,
        "sampling_seed": 0,
    }
    settings.update(kwargs)
    return generate_rollouts(model, prompt_ids, list(range(len(prompt_ids))), compact_at=compact_at, **settings)


def assert_same_rollout(compacted: Rollout, plain: Rollout) -> None:
    assert compacted.completion_ids.tolist() == plain.completion_ids.tolist()
    assert torch.equal(compacted.completion_mask, plain.completion_mask)
    assert torch.equal(compacted.truncated, plain.truncated)
    # a row's forward in a smaller batch can round differently in the last bits (batch-size-dependent kernels)
    torch.testing.assert_close(compacted.sampling_logprobs, plain.sampling_logprobs, atol=2e-5, rtol=0)


def compare(
    model: Any,
    prompt_ids: list[list[int]],
    monkeypatch: pytest.MonkeyPatch,
    generator_seed: int | None = None,
    **kwargs: Any,
) -> list[int]:
    """Sample with compaction at every finished row and without; the decode-batch sizes compaction left.
    ``generator_seed``: draw from one generator for the batch (a fresh one per run) instead of per completion."""

    def run(compact_at: float | None) -> Rollout:
        if generator_seed is None:
            return sample(model, prompt_ids, compact_at, **kwargs)
        generator = torch.Generator().manual_seed(generator_seed)
        return sample(model, prompt_ids, compact_at, sampling_seed=None, generator=generator, **kwargs)

    plain = run(None)
    spy = SelectSpy(monkeypatch)
    assert_same_rollout(run(1e-9), plain)
    lengths = plain.completion_mask.sum(dim=1)
    assert lengths.min() < lengths.max(), "rows should end at different steps"
    return spy.sizes


@pytest.mark.parametrize("family", FAMILIES)
def test_compaction_equals_the_plain_loop_for_every_family(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = make_tokenizer()
    model = build(family, tokenizer)
    prompt_ids = [tokenizer.encode(text) for text in PROMPTS]
    eos = [tokenizer.eos_token_id, 3, 4]  # rows of every family end at different steps
    sizes = compare(model, prompt_ids, monkeypatch, pad_token_id=tokenizer.pad_token_id, eos_token_ids=eos)
    assert sizes and sizes == sorted(sizes, reverse=True) and sizes[-1] < 12, "the decode batch shrank"


@pytest.mark.parametrize(
    "settings",
    [
        {"generator_seed": 3},  # one stream for the batch: each row takes its entry of the full draw
        {"params": SamplingParams(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.3)},
        {"params": SamplingParams(temperature=1.0, min_p=0.05, repetition_penalty=0.8), "generator_seed": 5},
        {"params": SamplingParams(temperature=0.0, repetition_penalty=1.2)},
    ],
    ids=["generator", "top-k-top-p-penalty", "min-p-penalty-generator", "greedy-penalty"],
)
def test_compaction_equals_the_plain_loop_for_every_sampling_setting(
    peaked_model: Any, char_tokenizer: Any, settings: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt_ids = [char_tokenizer.encode(text) for text in TEXTS]
    assert compare(peaked_model, prompt_ids, monkeypatch, **settings)


def test_compaction_keeps_stop_strings_and_the_rows_they_end(
    peaked_model: Any, char_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt_ids = [char_tokenizer.encode(text) for text in TEXTS]
    plain = sample(peaked_model, prompt_ids, None, eos_token_ids=[3])
    stop_text = char_tokenizer.decode(plain.completion_ids[0, 1:3].tolist())  # ends at least one row early
    stop = StopStrings(char_tokenizer, [stop_text])
    assert compare(peaked_model, prompt_ids, monkeypatch, eos_token_ids=[3], stop=stop)


def test_a_batch_that_never_reaches_the_fraction_is_not_compacted(
    peaked_model: Any, char_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt_ids = [char_tokenizer.encode(text) for text in TEXTS]
    spy = SelectSpy(monkeypatch)
    plain = sample(peaked_model, prompt_ids, None)
    assert not spy.sizes
    assert_same_rollout(sample(peaked_model, prompt_ids, 1.0), plain)  # only a batch all finished: never
    assert not spy.sizes


@pytest.mark.parametrize("family", VISION_FAMILIES)
def test_vision_compaction_equals_the_plain_loop(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    processor, model = build_vision(family)
    ids, vision = encode_vision(processor)
    tokenizer = processor.tokenizer
    settings = {"vision": vision, "pad_token_id": tokenizer.pad_token_id, "eos_token_ids": [tokenizer.eos_token_id]}
    plain = sample(model, ids, None, **settings)
    spy = SelectSpy(monkeypatch)
    assert_same_rollout(sample(model, ids, 1e-9, **settings), plain)
    ended = plain.completion_mask.sum(dim=1) < plain.completion_ids.shape[1]
    assert bool(ended.any()) == bool(spy.sizes)


def test_select_rows_keeps_the_rows_of_every_state_and_the_buffer_capacity() -> None:
    hybrid = LinearAttentionAndFullAttentionLayer()
    hybrid.update(rows(4, 1, 3, 4), rows(4, 1, 3, 4))
    hybrid.update_conv_state(rows(4, 6, 3), conv_kernel_size=4)
    hybrid.update_recurrent_state(rows(4, 2, 4, 4))
    preallocated = PreallocatedLayer(rows(4, 1, 3, 4), rows(4, 1, 3, 4), capacity=8)
    cache = DynamicCache()
    cache.layers = [hybrid, preallocated]
    assert can_select_rows(cache)
    select_rows(cache, torch.tensor([1, 3]))
    states = [hybrid.keys, hybrid.values, hybrid.recurrent_states[0], preallocated.keys, preallocated.values]
    for state in [*states, hybrid.conv_states[0][..., 1:]]:
        assert [row.unique().tolist() for row in state] == [[1.0], [3.0]]
    keys, values = preallocated.update(rows(2, 1, 1, 4) + 7, rows(2, 1, 1, 4) + 7)  # still grows in place
    assert keys.shape == values.shape == (2, 1, 4, 4) and preallocated._key_buffer.shape[-2] == 8
    assert keys[:, :, -1].unique().tolist() == [7.0, 8.0]


def test_a_cache_or_layer_it_does_not_know_is_never_compacted() -> None:
    class OtherCache(DynamicCache):
        pass

    extra = DynamicLayer()
    extra.update(rows(2, 1, 3, 4), rows(2, 1, 3, 4))
    extra.positions = rows(2, 3)  # a per-row tensor the table does not name
    preallocated = PreallocatedLayer(rows(2, 1, 3, 4), rows(2, 1, 3, 4), capacity=8)
    preallocated.scores = rows(2, 3)
    for cache, layers in ((DynamicCache(), [extra]), (DynamicCache(), [preallocated]), (OtherCache(), [])):
        cache.layers = layers
        assert not can_select_rows(cache)


def test_sampler_compaction_is_on_by_default_none_turns_it_off_and_it_reaches_the_sampler(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rloo.pipeline
    from rloo.config import RLOOConfig
    from tests.helpers.models import trainer

    assert RLOOConfig(output_dir=str(tmp_path / "config")).sampler_compaction == decoding_module.COMPACT_AT == 0.25
    passed: list[float | None] = []

    def recording(*args: Any, **kwargs: Any) -> Rollout:
        passed.append(kwargs["compact_at"])
        return generate_rollouts(*args, **kwargs)

    monkeypatch.setattr(rloo.pipeline, "generate_rollouts", recording)
    spy = SelectSpy(monkeypatch)
    trainer(tmp_path / "default", max_steps=1, max_completion_length=12).train()
    assert passed and set(passed) == {decoding_module.COMPACT_AT}
    passed.clear()
    spy.sizes.clear()
    trainer(tmp_path / "off", max_steps=1, max_completion_length=12, sampler_compaction=None).train()
    assert passed and set(passed) == {None} and spy.sizes == []  # bit-comparable across process counts
    trainer(tmp_path / "on", max_steps=1, max_completion_length=12, sampler_compaction=1e-9).train()
    assert spy.sizes, "the run's sampler compacted its decode batch"


def host_syncs(model: Any, prompt_ids: list[list[int]], steps: int, **kwargs: Any) -> tuple[int, Rollout]:
    """Host syncs (:class:`rloo.op_counts.OpCounts`) of one rollout of ``steps`` new tokens."""
    with OpCounts() as counts:
        rollout = sample(model, prompt_ids, 0.25, max_new_tokens=steps, **kwargs)
    return counts.total_syncs, rollout


@pytest.mark.parametrize("padded", [True, False], ids=["padded-prompts", "same-length-prompts"])
def test_the_decode_loop_syncs_at_most_once_per_8_steps(padded: bool) -> None:
    # 3 syncs a step before: the finished check, the compaction count and transformers' mask check
    tokenizer = make_tokenizer()
    model = build("llama", tokenizer)
    prompt_ids = [tokenizer.encode(text) for text in (PROMPTS if padded else ["1+2=", "3+4="])]
    settings: dict[str, Any] = {"pad_token_id": tokenizer.pad_token_id, "eos_token_ids": [4], "check_every": 8}
    short, _ = host_syncs(model, prompt_ids, 8, **settings)
    long, rollout = host_syncs(model, prompt_ids, 40, **settings)
    lengths = rollout.completion_mask.sum(dim=1)
    assert rollout.completion_ids.shape[1] == 40 and lengths.min() < 40, "rows end early, one runs to the limit"
    assert long - short <= 32 / 8, f"{long - short} host syncs in 32 decode steps"


@pytest.mark.parametrize("family", FAMILIES)
def test_the_ready_made_mask_and_the_coarse_finished_check_sample_as_before(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = make_tokenizer()
    model = build(family, tokenizer)
    prompt_ids = [tokenizer.encode(text) for text in PROMPTS]
    settings = {"pad_token_id": tokenizer.pad_token_id, "eos_token_ids": [tokenizer.eos_token_id, 3, 4]}
    fast = sample(model, prompt_ids, 0.25, check_every=8, **settings)
    kinds: list[str] = []
    kind = decoding_module.attention_mask_kind

    def two_d(*args: Any) -> str:  # the (B, L) mask transformers checks on the host, as before
        kinds.append(kind(*args))  # padded prompts: "none" only for a state-space model, which takes none
        return "none" if kinds[-1] == "none" else "2d"

    monkeypatch.setattr(decoding_module, "attention_mask_kind", two_d)
    plain = sample(model, prompt_ids, 0.25, check_every=1, **settings)
    assert fast.completion_ids.tolist() == plain.completion_ids.tolist()  # the same width: trailing padding dropped
    assert torch.equal(fast.completion_mask, plain.completion_mask) and torch.equal(fast.truncated, plain.truncated)
    torch.testing.assert_close(fast.sampling_logprobs, plain.sampling_logprobs, atol=2e-5, rtol=0)
    assert kinds


def test_the_mask_kind_by_model() -> None:
    tokenizer = make_tokenizer()
    llama = build("llama", tokenizer)
    cache = DynamicCache()
    assert decoding_module.attention_mask_kind(llama, cache, padded=True) == "4d"
    assert decoding_module.attention_mask_kind(llama, cache, padded=False) == "none"
    llama.config._attn_implementation = "eager"  # its masks are additive floats: transformers builds them
    assert decoding_module.attention_mask_kind(llama, cache, padded=True) == "2d"
    sliding = build("mistral", tokenizer)
    sliding.config.sliding_window = 4  # a window: the mask has a band transformers builds
    assert decoding_module.attention_mask_kind(sliding, cache, padded=False) == "2d"


def test_the_loop_reads_its_finished_rows_every_8_steps_on_a_gpu_only() -> None:
    assert decoding_module.finished_check_every(torch.device("cuda")) == 8
    assert decoding_module.finished_check_every(torch.device("cpu")) == 1
