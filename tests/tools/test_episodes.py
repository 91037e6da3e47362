"""Multi-turn episodes (rloo.tools.episodes): hand-built episodes with exact masks, the limits, the log-probs
of a real sampler over whole episodes, and a training run with tools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rloo import RLOOConfig, RLOOTrainer
from rloo.algo.objective import ObjectiveInputs, ObjectiveSettings, policy_objective
from rloo.forward.logprobs import completion_logprobs
from rloo.generation.rollout import Rollout, generate_rollouts, left_pad
from rloo.generation.sampling import SamplingParams
from rloo.tools.agent import AgentSettings
from rloo.tools.calling import Toolbox
from rloo.tools.episodes import EpisodeLimits, run_episodes
from tests.helpers.tools import (
    call_text,
    multiply,
    product_reward,
    product_rows,
    question,
    taught_model,
    tool_tokenizer,
)

TOK = tool_tokenizer()
EOS = TOK.eos_token_id
CUT = "|cut"  # a scripted turn ending so has no EOS (a limit cut it)


def encode(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def prompt_ids(a: int, b: int) -> list[int]:
    return encode(TOK.apply_chat_template(question(a, b), tools=[multiply], tokenize=False, add_generation_prompt=True))


class Scripted:
    """A sampler with generate_rollouts' contract that returns the scripted turns, call by call: each turn's
    text, then EOS (unless it ends with ``CUT``); every sampled token's log-prob is -0.5."""

    def __init__(self, *calls: list[str]) -> None:
        self.calls, self.prompts = list(calls), []

    def __call__(self, model: Any, prompts: Any, groups: Any, *, num_generations: int, max_new_tokens: int, **_: Any):
        self.prompts.append([list(p) for p in prompts])
        texts = self.calls.pop(0)
        rows = []
        for text in texts:
            ids = encode(text.removesuffix(CUT)) + ([] if text.endswith(CUT) else [EOS])
            rows.append(ids[:max_new_tokens])
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), TOK.pad_token_id)
        mask = torch.zeros(len(rows), width)
        for i, row in enumerate(rows):
            ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1.0
        p_ids, p_mask = left_pad(prompts, TOK.pad_token_id, torch.device("cpu"))
        return Rollout(
            prompt_ids=p_ids.repeat_interleave(num_generations, 0),
            prompt_mask=p_mask.repeat_interleave(num_generations, 0),
            completion_ids=ids,
            completion_mask=mask,
            truncated=torch.tensor([EOS not in r for r in rows]),
            sampling_logprobs=-0.5 * mask,
            group_ids=torch.tensor(list(groups)).repeat_interleave(num_generations),
        )


def episodes(sample: Scripted, k: int = 2, max_tokens: int = 200, rounds: int | None = None) -> Any:
    return run_episodes(
        sample,
        None,
        [prompt_ids(3, 4)],
        [0],
        num_generations=k,
        tokenizer=TOK,
        toolboxes=[Toolbox([multiply])] * k,
        limits=EpisodeLimits(rounds, max_tokens, 5.0),
        eos_token_ids=[EOS],
        params=SamplingParams(),
        pad_token_id=TOK.pad_token_id,
    )


def test_an_episode_is_the_sampled_turns_with_the_tool_answers_between_them_masked() -> None:
    sample = Scripted([call_text(3, 4), "12"], ["12"])
    rollout, records = episodes(sample)
    turn, suffix, answer = [*encode(call_text(3, 4)), EOS], encode("\n<tool>12\n<assistant>"), [*encode("12"), EOS]
    episode = turn + suffix + answer
    assert rollout.completion_ids[0, : len(episode)].tolist() == episode
    assert rollout.tool_mask[0, : len(episode)].tolist() == [1.0] * len(turn) + [0.0] * len(suffix) + [1.0] * 3
    assert rollout.completion_mask[0].sum() == len(episode) and rollout.completion_mask[1].sum() == 3
    assert (
        rollout.sampling_logprobs[0, : len(episode)].tolist() == [-0.5] * len(turn) + [0.0] * len(suffix) + [-0.5] * 3
    )
    assert sample.prompts[1] == [prompt_ids(3, 4) + turn + suffix]  # the next turn continues the episode's tokens
    assert records[0].messages == [
        {"role": "assistant", "content": "", "tool_calls": [_call(3, 4)]},
        {"role": "tool", "name": "multiply", "content": "12"},
        {"role": "assistant", "content": "12"},
    ]
    assert (records[0].tool_calls, records[0].turns, records[0].cut, records[1].turns) == (1, 2, None, 1)
    assert not rollout.truncated.any()


def _call(a: int, b: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "multiply", "arguments": {"a": a, "b": b}}}


def test_tool_tokens_carry_no_gradient() -> None:
    """d loss / d log-prob is 0 on every inserted token, whatever the advantage."""
    rollout, _ = episodes(Scripted([call_text(3, 4), "12"], ["12"]))
    logprobs = torch.full(rollout.completion_mask.shape, -0.7, requires_grad=True)
    inputs = ObjectiveInputs(logprobs, logprobs.detach(), None, torch.tensor([1.0, -1.0]), rollout.model_mask, None)
    for level in ("token", "sequence"):
        settings = ObjectiveSettings(
            ratio_level=level, eps_low=0.2, eps_high=0.2, aggregation="token_mean", max_completion_length=200
        )
        (grad,) = torch.autograd.grad(
            policy_objective(inputs, settings, total_tokens=10.0, total_sequences=2.0).loss, logprobs
        )
        inserted = (rollout.completion_mask == 1) & (rollout.tool_mask == 0)
        assert inserted.any() and grad[inserted].abs().max() == 0.0
        assert grad[rollout.model_mask.bool()].abs().min() > 0.0


def test_max_tool_calling_iterations_ends_an_episode_with_its_calls_unanswered() -> None:
    rollout, records = episodes(Scripted([call_text(3, 4), "12"]), rounds=0)
    assert records[0].cut == "max_tool_calling_iterations" and records[0].tool_calls == 0
    assert rollout.tool_mask[0].sum() == rollout.completion_mask[0].sum()  # nothing inserted
    assert not rollout.truncated[0]


def test_answers_that_leave_no_room_are_dropped_and_the_episode_truncated() -> None:
    length = len(encode(call_text(3, 4))) + 1
    rollout, records = episodes(Scripted([call_text(3, 4), "12"]), max_tokens=length + 5)
    assert rollout.truncated[0] and not rollout.truncated[1]
    assert records[0].cut == "max_completion_length" and records[0].tool_calls == 1
    assert [m["role"] for m in records[0].messages] == ["assistant"]  # the dropped answer is not in the episode
    assert rollout.completion_mask[0].sum() == length


def test_a_next_turn_is_cut_at_the_episodes_own_token_budget() -> None:
    length = len(encode(call_text(3, 4))) + 1 + len(encode("\n<tool>12\n<assistant>"))
    sample = Scripted([call_text(3, 4), "1"], ["123456789" + CUT])
    rollout, records = episodes(sample, max_tokens=length + 4)
    assert rollout.completion_mask[0].sum() == length + 4 and rollout.truncated[0]
    assert records[0].messages[-1] == {"role": "assistant", "content": "1234"}


def test_the_samplers_log_probs_are_a_forward_over_the_whole_episode() -> None:
    """A model taught to call multiply, sampled at temperature 1.3 (its tokens are not all certain)."""
    model = taught_model().eval()
    prompts = [prompt_ids(3, 4), prompt_ids(2, 5)]
    rollout, records = run_episodes(
        generate_rollouts,
        model,
        prompts,
        [0, 1],
        num_generations=3,
        tokenizer=TOK,
        toolboxes=[Toolbox([multiply])] * 6,
        limits=EpisodeLimits(2, 120, 5.0),
        eos_token_ids=[EOS],
        sampling_seed=3,
        params=SamplingParams(temperature=1.3),
        pad_token_id=TOK.pad_token_id,
    )
    assert any(r.tool_calls and r.turns == 2 for r in records)  # an episode called the tool and went on
    with torch.no_grad():
        forward = completion_logprobs(
            model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask, 1.3
        ).logprobs
    mask = rollout.model_mask.bool()
    assert rollout.sampling_logprobs[mask].abs().max() > 1e-3  # not a model certain of every token
    torch.testing.assert_close(rollout.sampling_logprobs[mask], forward[mask], atol=1e-5, rtol=0)


def test_a_run_with_tools_trains_and_logs_its_episodes(tmp_path: Path) -> None:
    seen: list[Any] = []
    args = RLOOConfig(
        output_dir=str(tmp_path / "run"),
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=120,
        max_steps=2,
        logging_steps=1,
        learning_rate=1e-3,
        max_tool_calling_iterations=2,
        report_to=[],
        seed=0,
    )
    trainer = RLOOTrainer(
        taught_model(),
        product_reward(seen),
        args=args,
        train_dataset=product_rows(),
        processing_class=TOK,
        tools=[multiply],
    )
    trainer.train()
    logged = [row for row in trainer.state.log_history if "tools/call_frequency" in row]
    assert len(logged) == 2 and logged[0]["tools/call_frequency"] > 0.5
    assert 0 < logged[0]["tools/inserted_token_frac"] < 0.5 and logged[0]["tools/failure_frequency"] == 0.0
    assert any(message["role"] == "tool" for completion in seen for message in completion)
    # completion lengths count the model's tokens only (as TRL): each is below the episode's
    assert logged[0]["completions/mean_length"] < 120


def test_tools_need_conversational_prompts(tmp_path: Path) -> None:
    args = RLOOConfig(output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=2, max_steps=1)
    trainer = RLOOTrainer(
        taught_model(), lambda completions, **_: [0.0] * len(completions), args=args,
        train_dataset=[{"prompt": "3*4?"}] * 2, processing_class=TOK, tools=[multiply],
    )  # fmt: skip
    with pytest.raises(ValueError, match="tools need conversational prompts"):
        trainer.train()


def test_tools_under_fsdp_are_refused_saying_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tools with FSDP2-sharded training are not built yet"):
        AgentSettings.from_config(RLOOConfig(output_dir=str(tmp_path)), [multiply], lockstep=True)


def test_two_tools_with_one_name_are_refused_when_the_trainer_is_built(tmp_path: Path) -> None:
    def twin(a: int, b: int) -> int:
        """Add.

        Args:
            a: x
            b: y
        """
        return a + b

    twin.__name__ = "multiply"
    with pytest.raises(ValueError, match="two tools are named 'multiply'"):
        AgentSettings.from_config(RLOOConfig(output_dir=str(tmp_path)), [multiply, twin])


@pytest.mark.system
def test_two_processes_run_the_same_episodes_and_update_as_one(tmp_path: Path) -> None:
    """LoRA, tools and an evaluation each step: one process and two (each a half of the batch) log the same
    tool metrics, rewards and losses, and end with the same adapters."""
    from tests.helpers.launch import assert_ok, assert_same_metrics, max_param_diff, metrics, python, torchrun

    one, two = tmp_path / "one", tmp_path / "two"
    assert_ok(python("tests/helpers/tool_runs.py", str(one)))
    assert_ok(torchrun("tests/helpers/tool_runs.py", str(two)))
    logged = metrics(one / "metrics.json")
    assert any(row.get("tools/call_frequency", 0) > 0.5 for row in logged)
    assert any("eval_reward" in row for row in logged)
    assert_same_metrics(logged, metrics(two / "metrics.json"))
    assert max_param_diff(one / "weights.safetensors", two / "weights.safetensors") < 1e-5


def test_a_resumed_run_with_tools_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    """Episodes are seeded by their group, round and index: a run resumed at step 2 samples the episodes the
    uninterrupted run sampled and ends at the same weights (no episode is half-trained across a checkpoint)."""

    def run(out: Path, max_steps: int, resume: bool = False) -> RLOOTrainer:
        args = RLOOConfig(
            output_dir=str(out),
            num_generations=2,
            per_device_train_batch_size=4,
            max_completion_length=120,
            max_tool_calling_iterations=2,
            temperature=1.1,
            learning_rate=3e-3,
            lr_scheduler_type="constant",
            max_steps=max_steps,
            save_steps=2,
            report_to=[],
            seed=0,
        )
        rows = [{"prompt": question(a, b), "a": a, "b": b} for a, b in [(3, 4), (2, 5)] * 4]

        def reward(completions: list[Any], a: list[int], b: list[int], **_: Any) -> list[float]:
            return [float(c[-1]["content"] == str(x * y)) for c, x, y in zip(completions, a, b, strict=True)]

        trainer = RLOOTrainer(
            taught_model(), reward, args=args, train_dataset=rows, processing_class=TOK, tools=[multiply]
        )
        trainer.train(resume_from_checkpoint=resume or None)
        return trainer

    straight = run(tmp_path / "straight", 4)
    run(tmp_path / "resumed", 2)
    resumed = run(tmp_path / "resumed", 4, resume=True)
    for (name, a), (_, b) in zip(
        straight.unwrapped_model.named_parameters(), resumed.unwrapped_model.named_parameters(), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "falcon_h1", "olmo_hybrid", "mamba2"])
def test_a_turn_after_a_tool_answer_is_sampled_as_a_forward_over_the_episode(family: str) -> None:
    """Full-attention, sliding-window, hybrid (mamba, linear attention) and state-space caches: the first
    turn is a forced tool call (its log-probs the model's own, from a forward), the tool answers, and the
    second turn is rloo's sampler continuing the episode's tokens; its log-probs equal a forward over the
    whole episode."""
    from tests.generation.test_model_families import LOGPROB_ATOL, build

    model = build(family, TOK)
    turn = [*encode(call_text(3, 4)), EOS]
    rounds: list[int] = []

    def forced_then_sampled(model: Any, prompts: Any, groups: Any, **kwargs: Any) -> Rollout:
        rounds.append(len(prompts))
        if len(rounds) > 1:
            return generate_rollouts(model, prompts, groups, **kwargs)
        k = kwargs["num_generations"]
        p_ids, p_mask = left_pad(prompts, TOK.pad_token_id, torch.device("cpu"))
        ids = torch.tensor([turn] * (len(prompts) * k))
        mask = torch.ones(ids.shape)
        p_ids, p_mask = p_ids.repeat_interleave(k, 0), p_mask.repeat_interleave(k, 0)
        with torch.no_grad():
            own = completion_logprobs(model, p_ids, p_mask, ids, mask, kwargs["params"].temperature).logprobs
        groups_t = torch.tensor(list(groups)).repeat_interleave(k)
        return Rollout(p_ids, p_mask, ids, mask, torch.zeros(len(ids), dtype=torch.bool), own, groups_t)

    rollout, records = run_episodes(
        forced_then_sampled,
        model,
        [prompt_ids(3, 4), prompt_ids(2, 5)],
        [0, 1],
        num_generations=2,
        tokenizer=TOK,
        toolboxes=[Toolbox([multiply])] * 4,
        limits=EpisodeLimits(1, len(turn) + 30, 5.0),
        eos_token_ids=[EOS],
        sampling_seed=0,
        params=SamplingParams(temperature=1.0),
        pad_token_id=TOK.pad_token_id,
    )
    assert rounds == [2, 4] and all(r.tool_calls == 1 and r.turns == 2 for r in records)
    with torch.no_grad():
        forward = completion_logprobs(
            model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask, 1.0
        ).logprobs
    second = rollout.model_mask.clone()
    second[:, : len(turn)] = 0  # the sampled turn, after the tool's answer
    assert second.sum() > 0
    atol = LOGPROB_ATOL.get(family, 1e-5)
    torch.testing.assert_close(rollout.sampling_logprobs[second.bool()], forward[second.bool()], atol=atol, rtol=0)
