"""transformers' continuous batching as a sampling engine (rloo.generation.continuous_batching): its rollouts
keep rloo's contract (shapes, order, EOS, stop strings, log-probs of the sampled distribution), greedy decoding
equals rloo's own sampler's, the trainer's random state and the model are left as they were, the cache is
sized to the batch, and a run trains with it end to end (offline, CPU, tiny models)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor

from rloo import RLOOConfig, RLOOTrainer
from rloo.generation import continuous_batching
from rloo.generation.continuous_batching import (
    TESTED_FAMILIES,
    ContinuousBatchingSampler,
    cache_blocks,
    continuous_batching_config,
    generation_config,
    ordered_outputs,
)
from rloo.generation.engines import ENGINES, build_engine, engine_name
from rloo.generation.rollout import Rollout, generate_rollouts
from rloo.generation.sampling import SamplingParams
from rloo.generation.stopping import StopStrings
from tests.generation.test_model_families import build
from tests.helpers.models import (
    config,
    dataset,
    frac7,
    last_train_log,
    make_model,
    make_tokenizer,
    peaked_tiny_llama,
    trainer,
)

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["1+2=", "hello world, ", "abc"]


def _common(tokenizer: Any, k: int = 3, new: int = 12) -> dict[str, Any]:
    return {
        "num_generations": k,
        "max_new_tokens": new,
        "eos_token_ids": [tokenizer.eos_token_id],
        "pad_token_id": tokenizer.pad_token_id,
    }


def _scored(model: Any, rollout: Rollout, temperature: float = 1.0) -> Tensor:
    """rloo's own forward's ``log_softmax(logits / T)`` of each sampled token, 0 where masked."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    width = rollout.prompt_ids.shape[1]
    logprobs = torch.log_softmax(logits[:, width - 1 : -1] / temperature, -1)
    return logprobs.gather(-1, rollout.completion_ids[..., None])[..., 0] * rollout.completion_mask


def test_a_rollout_keeps_rlooss_contract_and_its_logprobs_are_the_scored_ones(
    peaked_model: Any, char_tokenizer: Any
) -> None:
    prompts = [char_tokenizer.encode(text) for text in PROMPTS]
    common = {**_common(char_tokenizer), "eos_token_ids": list(range(2, 30))}  # many ends: some rows stop early
    rollout = ContinuousBatchingSampler()(
        peaked_model, prompts, [4, 5, 6], params=SamplingParams(), sampling_seed=3, **common
    )
    assert rollout.completion_ids.shape[0] == 9 and rollout.group_ids.tolist() == [4, 4, 4, 5, 5, 5, 6, 6, 6]
    for row in range(9):  # each row's prompt is its group's, left-padded
        kept = rollout.prompt_ids[row][rollout.prompt_mask[row].bool()].tolist()
        assert kept == prompts[row // 3]
    lengths = rollout.completion_mask.sum(1).long()
    eos = set(common["eos_token_ids"])
    for row, length in enumerate(lengths.tolist()):
        tokens = rollout.completion_ids[row, :length].tolist()
        assert not eos & set(tokens[:-1])  # cut at the first EOS
        assert bool(rollout.truncated[row]) == (tokens[-1] not in eos and length == 12)
        assert (rollout.completion_ids[row, length:] == char_tokenizer.pad_token_id).all()
    assert not rollout.truncated.all() and rollout.truncated.any()
    gap = (_scored(peaked_model, rollout) - rollout.sampling_logprobs).abs().max()
    assert gap < 1e-4, gap


def test_temperature_and_top_k_give_the_truncated_distributions_logprobs(char_tokenizer: Any) -> None:
    """The model's own generation_config (top_k=50 in many checkpoints) is not applied: every knob is set;
    with top-k the log-probs are of the truncated distribution (kept only where rloo scores the same one)."""
    model = peaked_tiny_llama(char_tokenizer)
    model.generation_config.top_k = 2  # would make every row's log-probs those of two tokens
    prompts = [char_tokenizer.encode(text) for text in PROMPTS]
    engine = ContinuousBatchingSampler()
    warm = SamplingParams(temperature=1.7)
    rollout = engine(model, prompts, [0, 1, 2], params=warm, sampling_seed=1, **_common(char_tokenizer))
    assert (_scored(model, rollout, 1.7) - rollout.sampling_logprobs).abs().max() < 1e-4
    top = engine(model, prompts, [0, 1, 2], params=SamplingParams(top_k=3), sampling_seed=1, **_common(char_tokenizer))
    assert (top.sampling_logprobs == 0).all()  # not the scored distribution's: not kept (as vLLM's)
    config = generation_config(SamplingParams(top_k=3, top_p=0.9), 4, 8, [2], 0)
    assert (config.top_k, config.top_p, config.temperature, config.num_return_sequences) == (3, 0.9, 1.0, 4)


def test_greedy_decoding_equals_rlooss_sampler(peaked_model: Any, char_tokenizer: Any) -> None:
    prompts = [char_tokenizer.encode(text) for text in PROMPTS]
    greedy = SamplingParams(temperature=0.0)
    ours = generate_rollouts(peaked_model, prompts, [0, 1, 2], params=greedy, **_common(char_tokenizer, new=16))
    theirs = ContinuousBatchingSampler()(
        peaked_model, prompts, [0, 1, 2], params=greedy, **_common(char_tokenizer, new=16)
    )
    assert torch.equal(theirs.completion_ids, ours.completion_ids)
    assert torch.equal(theirs.truncated, ours.truncated)
    assert len({tuple(row) for row in ours.completion_ids.tolist()}) == 3  # the prompts' greedy paths differ


@pytest.mark.parametrize("family", sorted(set(TESTED_FAMILIES) - {"llama"}))
def test_the_tested_families_sample_rlooss_greedy_tokens(family: str, char_tokenizer: Any) -> None:
    """Besides Llama (above), every family the engine's refusals name as tested: biases, sliding windows, soft
    caps, absolute positions, a mixture of experts."""
    model = build(family, char_tokenizer).eval()
    prompts = [char_tokenizer.encode(text) for text in PROMPTS]
    greedy = SamplingParams(temperature=0.0)
    ours = generate_rollouts(model, prompts, [0, 1, 2], params=greedy, **_common(char_tokenizer))
    theirs = ContinuousBatchingSampler()(model, prompts, [0, 1, 2], params=greedy, **_common(char_tokenizer))
    assert torch.equal(theirs.completion_ids, ours.completion_ids)


@pytest.mark.parametrize(
    ("family", "error", "why"),
    [
        ("mamba", NotImplementedError, "its cache has LinearAttentionLayer layers, which the engine's paged cache"),
        ("opt", RuntimeError, "'PagedAttentionCache' object has no attribute 'get_seq_length'"),
    ],
)
def test_a_family_the_engine_cannot_run_is_named_with_the_tested_ones(
    family: str, error: type[Exception], why: str, char_tokenizer: Any
) -> None:
    model = build(family, char_tokenizer).eval()
    prompts = [char_tokenizer.encode("ab")]
    with pytest.raises(error) as raised:
        ContinuousBatchingSampler()(model, prompts, [0], params=SamplingParams(), **_common(char_tokenizer, k=2))
    message, what = str(raised.value), "cannot sample" if error is NotImplementedError else "failed on"
    assert f"use_transformers_continuous_batching {what} model type '{family}'" in message
    assert why in message and "Families tested with it: gemma2, gemma3, gpt2, llama" in message
    assert (
        "use rloo's sampler" not in message or "rloo's sampler (use_transformers_continuous_batching=False)" in message
    )


def test_an_engine_error_is_named_and_running_out_of_memory_passes_through(
    char_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = peaked_tiny_llama(char_tokenizer)
    prompts = [char_tokenizer.encode("ab")]
    for raised, expected in [
        (ValueError("Invalid layer type: x"), r"failed on model type 'llama': ValueError: Invalid layer type: x"),
        (torch.OutOfMemoryError("CUDA out of memory."), r"^CUDA out of memory\.$"),
    ]:

        def failing(*args: Any, error: Exception = raised, **kwargs: Any) -> Any:
            raise error

        monkeypatch.setattr(model, "generate_batch", failing)
        with pytest.raises(
            type(raised) if isinstance(raised, torch.OutOfMemoryError) else RuntimeError, match=expected
        ):
            ContinuousBatchingSampler()(model, prompts, [0], params=SamplingParams(), **_common(char_tokenizer, k=2))


def test_the_runs_random_state_and_the_model_are_left_as_they_were(peaked_model: Any, char_tokenizer: Any) -> None:
    """transformers' engine calls torch.manual_seed when it starts: without fork_rng every later draw of the
    run (dropout, the next batch's seed) would restart from the engine's seed."""
    prompts = [char_tokenizer.encode(text) for text in PROMPTS]
    implementation = peaked_model.config._attn_implementation
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    engine = ContinuousBatchingSampler()
    first = engine(
        peaked_model, prompts, [0, 1, 2], params=SamplingParams(), sampling_seed=7, **_common(char_tokenizer)
    )
    assert torch.equal(torch.rand(3), expected)
    assert peaked_model.config._attn_implementation == implementation and not peaked_model.training
    again = engine(
        peaked_model, prompts, [0, 1, 2], params=SamplingParams(), sampling_seed=7, **_common(char_tokenizer)
    )
    assert torch.equal(first.completion_ids, again.completion_ids)  # the seed and the groups fix the draw
    other = engine(
        peaked_model, prompts, [3, 4, 5], params=SamplingParams(), sampling_seed=7, **_common(char_tokenizer)
    )
    assert not torch.equal(first.completion_ids, other.completion_ids)


def test_stop_strings_cut_completions_as_rlooss_sampler_cuts_them(peaked_model: Any, char_tokenizer: Any) -> None:
    prompts = [char_tokenizer.encode(text) for text in PROMPTS]
    common = _common(char_tokenizer, new=16)
    greedy = SamplingParams(temperature=0.0)
    plain = generate_rollouts(peaked_model, prompts, [0, 1, 2], params=greedy, **common)
    text = char_tokenizer.decode(plain.completion_ids[0, 2:4].tolist())  # two characters the first row writes
    stop = StopStrings(char_tokenizer, [text])
    ours = generate_rollouts(peaked_model, prompts, [0, 1, 2], params=greedy, stop=stop, **common)
    theirs = ContinuousBatchingSampler()(peaked_model, prompts, [0, 1, 2], params=greedy, stop=stop, **common)
    assert torch.equal(theirs.completion_mask, ours.completion_mask)
    assert torch.equal(theirs.completion_ids, ours.completion_ids) and torch.equal(theirs.truncated, ours.truncated)
    assert ours.completion_mask[0].sum() <= 4


def test_the_cache_is_sized_to_the_batch_unless_the_user_sizes_it() -> None:
    """Each request's prompt and completion in whole pages, plus one: transformers' own sizing takes a share
    of the device's free memory (most of a CPU machine's RAM)."""
    assert cache_blocks([10, 300], 4, 256, 256) == 4 * 2 + 4 * 3 + 1
    config = continuous_batching_config({"page_size": 64}, [10, 300], 4, 256, seed=9)
    assert config.num_blocks == 4 * 5 + 4 * 9 + 1 and config.return_logprobs and config.page_size == 64
    assert config.seed == 9
    assert continuous_batching_config({"max_memory_percent": 0.4}, [10], 2, 8).num_blocks is None
    assert continuous_batching_config({"num_blocks": 99}, [10], 2, 8).num_blocks == 99
    with pytest.raises(ValueError, match=r"has 'page_sise', which transformers' ContinuousBatchingConfig does not"):
        continuous_batching_config({"page_sise": 64}, [10], 2, 8)
    with pytest.raises(ValueError, match="return_logprobs=False: rloo records the sampled tokens' log-probs"):
        continuous_batching_config({"return_logprobs": False}, [10], 2, 8)


def test_the_config_fits_transformers_58s_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5.8-5.16 (TRL's floor is 5.8): pages were ``block_size``, and the config took no ``seed``."""
    import transformers

    @dataclasses.dataclass
    class Older:  # the fields of 5.8.0's ContinuousBatchingConfig that rloo reads or sets
        block_size: int = 128
        num_blocks: int | None = None
        max_memory_percent: float | None = None
        return_logprobs: bool = False

    monkeypatch.setattr(transformers, "ContinuousBatchingConfig", Older)
    config = continuous_batching_config({}, [10, 300], 4, 256, seed=5)
    assert config == Older(block_size=128, num_blocks=4 * 3 + 4 * 5 + 1, return_logprobs=True)
    with pytest.raises(ValueError, match=r"has 'page_size', which .* does not take; its fields are \['block_size'"):
        continuous_batching_config({"page_size": 64}, [10], 2, 8)
    assert continuous_batching_config({}, [10], 2, 8, seed=5).num_blocks == 2 * 1 + 1


def test_a_failed_request_is_an_error_naming_it() -> None:
    good = SimpleNamespace(error=None)
    outputs = {"req_0": good, "req_1__child#0": SimpleNamespace(error="out of blocks"), "req_1": good}
    with pytest.raises(RuntimeError, match=r"returned 2 of 4 completions \(2 failed or missing: req_1__child#0: out"):
        ordered_outputs(outputs, 2, 2)
    assert ordered_outputs({"a": good, "b": good}, 1, 2) == [good, good]


def test_images_sharded_parameters_and_the_penalties_are_refused(char_tokenizer: Any, peaked_model: Any) -> None:
    engine, prompts = ContinuousBatchingSampler(), [char_tokenizer.encode("ab")]
    with pytest.raises(NotImplementedError, match="image prompts with use_transformers_continuous_batching"):
        engine(peaked_model, prompts, [0], params=SamplingParams(), vision=object(), **_common(char_tokenizer))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not apply repetition_penalty or min_p"):
        generation_config(SamplingParams(repetition_penalty=1.2), 2, 4, [2], 0)


@pytest.mark.parametrize(
    ("overrides", "field", "fix"),
    [
        ({"use_vllm": True}, "use_transformers_continuous_batching", "both choose the sampling engine; keep one"),
        ({"sampler_cuda_graphs": True}, "use_transformers_continuous_batching", "a setting of rloo's own sampler"),
        ({"repetition_penalty": 1.1}, "repetition_penalty", "does not apply it"),
        ({"min_p": 0.1}, "min_p", "does not check it"),
    ],
)
def test_the_config_refuses_what_the_engine_cannot_do(
    tmp_path: Path, overrides: dict[str, Any], field: str, fix: str
) -> None:
    with pytest.raises(ValueError, match=rf"RLOOConfig\.{field}=.*{fix}"):
        RLOOConfig(output_dir=str(tmp_path), use_transformers_continuous_batching=True, **overrides)


def test_trls_names_choose_the_engine(tmp_path: Path) -> None:
    config = RLOOConfig(
        output_dir=str(tmp_path),
        use_transformers_continuous_batching=True,
        transformers_continuous_batching_config='{"page_size": 32}',  # a JSON object, as from a command line
    )
    assert engine_name(config) == "transformers_continuous_batching"
    engine = build_engine(config)
    assert isinstance(engine, ContinuousBatchingSampler) and engine.settings == {"page_size": 32}
    entry = ENGINES["transformers_continuous_batching"]
    assert entry.separate and entry.logprobs_are_scored(SamplingParams())
    assert not entry.logprobs_are_scored(SamplingParams(top_p=0.9))
    with pytest.warns(FutureWarning, match="use_transformers_paged=...\\) is TRL's older name"):
        older = RLOOConfig(output_dir=str(tmp_path), use_transformers_paged=True)
    assert older.use_transformers_continuous_batching


def test_a_run_trains_with_it_and_scores_the_batch_with_its_own_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine is separate (other kernels): the batch is off-policy, its log-probs rloo's own forward's, the
    engines' mismatch measured and corrected (vllm_importance_sampling_correction, TRL's name)."""
    calls: list[int] = []
    original = continuous_batching.ContinuousBatchingSampler.__call__

    def counted(self: Any, model: Any, prompt_ids: Any, group_ids: Any, **kwargs: Any) -> Rollout:
        calls.append(len(prompt_ids))
        return original(self, model, prompt_ids, group_ids, **kwargs)

    monkeypatch.setattr(continuous_batching.ContinuousBatchingSampler, "__call__", counted)
    run = trainer(tmp_path, use_transformers_continuous_batching=True, beta=0.05, max_steps=2)
    assert run.experience.off_policy and run.experience.correct_engines
    run.train()
    logged = last_train_log(run)
    assert calls == [2, 2] and run.state.global_step == 2
    assert abs(logged["sampling/sampling_logp_difference/mean"]) < 1e-3  # the same weights, other kernels
    assert torch.isfinite(torch.tensor(logged["loss"]))


def test_a_lora_policy_samples_with_its_adapters(tmp_path: Path) -> None:
    """generate_batch reaches the inner model through PEFT's wrapper, its LoRA layers in place: after the adapters
    have trained, the engine's log-probs are still the policy's (the base model's would differ)."""
    from peft import LoraConfig

    tok = make_tokenizer()
    run = RLOOTrainer(
        model=make_model(tok),
        reward_funcs=frac7,
        args=config(tmp_path, max_steps=3, beta=0.05, learning_rate=0.1, use_transformers_continuous_batching=True),
        train_dataset=dataset(),
        processing_class=tok,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    run.train()
    logged = last_train_log(run)
    assert abs(logged["sampling/sampling_logp_difference/max"]) < 1e-3
    ids = torch.tensor([tok("1+2=")["input_ids"]])
    with torch.no_grad(), run.unwrapped_model.disable_adapter():
        base = run.unwrapped_model(input_ids=ids).logits
    assert not torch.allclose(run.unwrapped_model(input_ids=ids).logits, base, atol=1e-3)  # the adapters moved


def test_multi_turn_episodes_with_tools_sample_their_turns_with_it(tmp_path: Path) -> None:
    """Each turn of an episode is one call of the engine (rloo.tools.episodes): the taught model calls the tool,
    reads its answer and ends, as with rloo's sampler."""
    from tests.helpers.tools import multiply, product_reward, product_rows, taught_model, tool_tokenizer

    seen: list[Any] = []
    args = RLOOConfig(
        output_dir=str(tmp_path / "run"),
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=120,
        max_steps=1,
        logging_steps=1,
        max_tool_calling_iterations=2,
        report_to=[],
        seed=0,
        use_transformers_continuous_batching=True,
    )
    run = RLOOTrainer(
        taught_model(),
        product_reward(seen),
        args=args,
        train_dataset=product_rows(),
        processing_class=tool_tokenizer(),
        tools=[multiply],
    )
    run.train()
    logged = last_train_log(run)
    assert logged["tools/call_frequency"] > 0.5 and logged["reward"] > 0.5
    assert any(message["role"] == "tool" for completion in seen for message in completion)
    assert abs(logged["sampling/sampling_logp_difference/mean"]) < 1e-3
