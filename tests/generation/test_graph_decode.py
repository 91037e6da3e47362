"""The static-shape decode step (rloo.generation.graph_decode, static_decode) against the eager loop, its
host syncs, what falls back to the eager loop, the bf16 sampling copy, and (on CUDA) graph replay
against the same step run eagerly."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers

import rloo.generation.graph_decode as graph_decode
from rloo import RLOOConfig
from rloo.generation.graph_decode import SamplingCopy, rollout_sampler, static_rollout, unsupported_reason
from rloo.generation.rollout import Rollout, generate_rollouts
from rloo.generation.sampling import SamplingParams
from rloo.generation.static_decode import StaticDecoder
from rloo.generation.stopping import StopStrings
from rloo.op_counts import OpCounts
from rloo.pipeline import RolloutSettings, generate_and_score
from rloo.rewards.calling import RewardFunctions
from rloo.tiny import build_char_tokenizer
from tests.helpers.models import always_one, peaked_tiny_llama, trainer

pytestmark = pytest.mark.usefixtures("one_thread")

TOKENIZER = build_char_tokenizer()

TEXTS = ["hello world", "ab", "x = 1 + 2?", "Q"]  # different lengths: each row's left padding differs
EOS = [3, 4, 5]  # rows end at different steps, some not at all (truncated)
GQA = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
GQA |= {"num_key_value_heads": 2}
FAMILIES = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}
SETTINGS = {
    "top-p": SamplingParams(temperature=0.7, top_p=0.9),
    "top-k-min-p-penalty": SamplingParams(temperature=1.3, top_k=20, min_p=0.05, repetition_penalty=1.3),
    "greedy": SamplingParams(temperature=0.0),
}


def peaked(family: str, **fields: Any) -> Any:
    """A tiny random GQA model of ``family`` whose larger weights make next tokens depend on the context."""
    name = FAMILIES[family]
    config = getattr(transformers, f"{name}Config")(
        vocab_size=len(TOKENIZER), pad_token_id=TOKENIZER.pad_token_id, tie_word_embeddings=False, **GQA, **fields
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = getattr(transformers, f"{name}ForCausalLM")(config)
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.dim() == 2:
                    parameter.normal_(0.0, 0.3)
            for embedding in (model.get_input_embeddings(), model.get_output_embeddings()):
                embedding.weight.normal_(0.0, 1.0)
    return model.eval()


def sample(sampler: Any, model: Any, texts: list[str] = TEXTS, **overrides: Any) -> Rollout:
    settings: dict[str, Any] = {
        "num_generations": 3,
        "max_new_tokens": 30,
        "params": SamplingParams(temperature=0.7, top_p=0.9),
        "eos_token_ids": EOS,
        "pad_token_id": TOKENIZER.pad_token_id,
        "sampling_seed": 0,
        "compact_at": 0.25,
    }
    settings.update(overrides)
    prompt_ids = [TOKENIZER.encode(text) for text in texts]
    rollout: Rollout | None = sampler(model, prompt_ids, list(range(len(texts))), **settings)
    assert rollout is not None
    return rollout


def assert_same_rollout(static: Rollout, eager: Rollout) -> None:
    assert static.completion_ids.tolist() == eager.completion_ids.tolist()
    assert torch.equal(static.completion_mask, eager.completion_mask)
    assert torch.equal(static.truncated, eager.truncated)
    assert torch.equal(static.prompt_ids, eager.prompt_ids) and torch.equal(static.group_ids, eager.group_ids)
    # attention over the whole static cache (masked past the written positions) rounds in other orders
    torch.testing.assert_close(static.sampling_logprobs, eager.sampling_logprobs, atol=2e-5, rtol=0)


@pytest.fixture
def compactions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every compaction's (bucket, smaller bucket)."""
    seen: list[tuple[int, int]] = []
    compact = StaticDecoder.compact

    def spy(decoder: StaticDecoder, size: int, target: int) -> None:
        seen.append((size, target))
        compact(decoder, size, target)

    monkeypatch.setattr(StaticDecoder, "compact", spy)
    return seen


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_static_step_samples_what_the_eager_loop_samples(
    family: str, setting: str, compactions: list[tuple[int, int]]
) -> None:
    model = peaked(family)
    eager = sample(generate_rollouts, model, params=SETTINGS[setting])
    static = sample(static_rollout, model, params=SETTINGS[setting])
    assert_same_rollout(static, eager)
    lengths = eager.completion_mask.sum(dim=1)
    assert lengths.min() < lengths.max(), "rows end at different steps"
    assert compactions and compactions[-1][1] < 12, "the decode moved to smaller buckets"


def test_without_compaction_one_bucket_decodes_and_the_next_rollout_reuses_its_buffers(
    compactions: list[tuple[int, int]],
) -> None:
    model = peaked("llama")
    assert_same_rollout(
        sample(static_rollout, model, compact_at=None), sample(generate_rollouts, model, compact_at=None)
    )
    assert not compactions
    decoder = graph_decode._SAMPLING[model].decoder
    assert decoder is not None and decoder.spec.buckets == (12,)
    # other prompts, whose cache rounds to the same length: the same buffers, every one of them refilled
    texts = ["7 + 7", "hello there", "ok", "1"]
    reused = sample(static_rollout, model, texts, compact_at=None)
    assert graph_decode._SAMPLING[model].decoder is decoder
    assert_same_rollout(reused, sample(generate_rollouts, model, texts, compact_at=None))


def test_the_static_step_reads_the_host_at_most_once_per_8_steps(
    compactions: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    counted: dict[str, int] = {}
    decode, run = graph_decode._decode, StaticDecoder.run

    def counting_run(decoder: StaticDecoder, model: Any, size: int) -> None:
        counted["steps"] = counted.get("steps", 0) + 1
        run(decoder, model, size)

    def counting_decode(*args: Any) -> None:
        with OpCounts() as counts:
            decode(*args)
        counted["syncs"] = counts.total_syncs

    monkeypatch.setattr(StaticDecoder, "run", counting_run)
    monkeypatch.setattr(graph_decode, "_decode", counting_decode)
    rollout = sample(static_rollout, peaked("qwen2"), max_new_tokens=40)
    assert counted["steps"] >= 24 and compactions, rollout.completion_mask.sum(dim=1)
    assert counted["syncs"] <= math.ceil(counted["steps"] / graph_decode.CHECK_EVERY), counted


def mamba() -> Any:
    config = transformers.MambaConfig(
        vocab_size=len(TOKENIZER), hidden_size=32, num_hidden_layers=2, state_size=8, conv_kernel=4
    )
    model: Any = transformers.MambaForCausalLM(config)
    return model.eval()


DYNAMIC_ROPE = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}  # reads max(position) on the host
# case -> (the model, the rollout's settings, what the reason says)
FALLBACKS: dict[str, tuple[Callable[[], Any], dict[str, Any], str]] = {
    "sliding-window": (functools.partial(peaked, "mistral", sliding_window=4), {}, "DynamicSlidingWindowLayer"),
    "dynamic-rope": (functools.partial(peaked, "llama", rope_parameters=DYNAMIC_ROPE), {}, "RoPE scaling"),
    "mamba": (mamba, {}, "model type 'mamba'"),
    "stop-strings": (functools.partial(peaked, "llama"), {"stop": StopStrings(TOKENIZER, ["zz"])}, "stop strings"),
    "no-seed": (functools.partial(peaked, "llama"), {"sampling_seed": None}, "no sampling_seed"),
}


@pytest.mark.parametrize("case", FALLBACKS)
def test_what_the_static_step_cannot_take_samples_with_the_eager_loop(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    build, overrides, reason = FALLBACKS[case]
    model, params = build(), SamplingParams(temperature=0.7, top_p=0.9)
    found = unsupported_reason(model, params, overrides.get("sampling_seed", 0), overrides.get("stop"))
    assert found is not None and reason in found

    def refused(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the static step ran")

    def rollout(sampler: Any) -> Rollout:
        generator = torch.Generator().manual_seed(0)  # used without a sampling_seed
        return sample(sampler, model, **overrides, generator=generator)

    monkeypatch.setattr(graph_decode, "static_rollout", refused)
    with pytest.warns(UserWarning, match=f"sampler_cuda_graphs: .*{reason}.*; sampling with the eager loop"):
        fallback = rollout(rollout_sampler(True))
    eager = rollout(generate_rollouts)
    assert fallback.completion_ids.tolist() == eager.completion_ids.tolist()
    assert torch.equal(fallback.sampling_logprobs, eager.sampling_logprobs)


def test_the_static_step_is_off_on_a_cpu_by_default_and_the_setting_reaches_the_sampler(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    config = RLOOConfig(output_dir=str(tmp_path / "run"))
    assert config.sampler_cuda_graphs is None and RolloutSettings.from_config(config).static_decode is None
    off = RLOOConfig(output_dir=str(tmp_path / "off"), sampler_cuda_graphs=False)
    assert RolloutSettings.from_config(off).static_decode is False
    assert rollout_sampler(False) is generate_rollouts
    calls: list[bool] = []
    static = graph_decode.static_rollout

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(True)
        return static(*args, **kwargs)

    monkeypatch.setattr(graph_decode, "static_rollout", spy)
    model, rewards = peaked("llama"), RewardFunctions([always_one])
    for setting in (None, True):
        settings = RolloutSettings(2, 6, SamplingParams(temperature=0.0), static_decode=setting)
        generate_and_score(model, TOKENIZER, TEXTS[:2], {}, rewards, settings, sampling_seed=0)
    assert calls == [True], "None: the eager loop on a CPU; True: the static step"


def test_a_training_run_asked_for_it_samples_with_the_static_step(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rollouts: list[Rollout] = []
    static = graph_decode.static_rollout

    def spy(*args: Any, **kwargs: Any) -> Any:
        rollout = static(*args, **kwargs)
        assert rollout is not None
        rollouts.append(rollout)
        return rollout

    monkeypatch.setattr(graph_decode, "static_rollout", spy)
    run = trainer(tmp_path, max_steps=2, max_completion_length=12, sampler_cuda_graphs=True)
    run.train()
    assert len(rollouts) == 2 and run.state.global_step == 2


def test_under_bf16_autocast_the_policy_samples_through_a_bf16_copy_that_follows_its_weights(
    char_tokenizer: Any, fresh_accelerate_state: Any
) -> None:
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="bf16", cpu=True)
    policy: Any = accelerator.unwrap_model(accelerator.prepare(peaked_tiny_llama(char_tokenizer)))
    sampling = SamplingCopy(policy)
    module: Any = sampling.module
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in module.parameters())
    assert module.get_input_embeddings().weight is module.get_output_embeddings().weight  # still tied
    ids = torch.tensor([char_tokenizer.encode("hello")])
    assert policy(input_ids=ids).logits.dtype == torch.float32  # accelerate's wrapper: cast back to fp32
    assert module(input_ids=ids).logits.dtype == torch.bfloat16  # the copy runs its own forward, in bf16

    def reference() -> Any:  # the policy with its parameters cast (buffers kept, as the copy keeps them)
        cast = copy.deepcopy(policy)
        vars(cast).pop("forward", None)
        for parameter in cast.parameters():
            parameter.data = parameter.data.to(torch.bfloat16)
        return cast

    for _ in range(2):  # the second rollout after a change to the policy's weights
        with torch.autocast("cpu", dtype=torch.bfloat16):
            through_copy = sample(static_rollout, policy)
        assert_same_rollout(through_copy, sample(static_rollout, reference()))
        assert torch.equal(through_copy.sampling_logprobs, sample(static_rollout, reference()).sampling_logprobs)
        with torch.no_grad():
            for parameter in policy.parameters():
                parameter.mul_(0.9)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (the CPU runs the step eagerly)"
)
@pytest.mark.parametrize("precision", ["bf16-autocast", "fp32"])
def test_graph_replay_equals_the_static_step_run_eagerly_bit_for_bit(
    precision: str, compactions: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = peaked("qwen2").cuda()

    def rollout(sampler: Any) -> Rollout:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16-autocast"):
            return sample(sampler, model, max_new_tokens=40)

    replayed = rollout(static_rollout)
    decoder = graph_decode._SAMPLING[model].decoder
    assert decoder is not None and set(decoder.graphs) == set(decoder.spec.buckets)
    assert compactions, "the replay moved to smaller buckets"

    def refused(decoder: StaticDecoder, model: Any) -> None:
        raise RuntimeError("not captured")

    graph_decode._SAMPLING.pop(model)
    monkeypatch.setattr(StaticDecoder, "capture", refused)
    with pytest.warns(UserWarning, match=r"the decode step runs eagerly \(not captured\)"):
        eager = rollout(static_rollout)
    assert torch.equal(replayed.completion_ids, eager.completion_ids)
    assert torch.equal(replayed.completion_mask, eager.completion_mask)
    assert torch.equal(replayed.sampling_logprobs, eager.sampling_logprobs)
    if precision == "fp32":  # the eager loop itself, within rounding
        assert_same_rollout(replayed, rollout(generate_rollouts))
