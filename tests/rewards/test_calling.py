"""Reward functions and reward models -> the (N, F) score tensor."""

from __future__ import annotations

import asyncio
import functools
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import PreTrainedModel

from rloo.rewards.calling import (
    CallPolicy,
    RewardFunc,
    RewardFunctionError,
    RewardFunctions,
    RewardScores,
    compute_rewards,
    reward_func_names,
)
from rloo.rewards.resolve import resolve_rewards
from rloo.rewards.reward_model import RewardModelScorer
from rloo.rewards.signatures import check_reward_arguments
from rloo.tiny import build_char_tokenizer
from tests.helpers.models import tiny_reward_model

PROMPTS = ["1+1=", "1+1=", "2+2="]
COMPLETIONS = ["2", "3", "4"]
COMPLETION_IDS = [[10], [11], [12]]
COLUMNS = {"answer": ["2", "2", "4"]}
INPUTS: dict[str, Any] = {
    "prompts": PROMPTS,
    "completions": COMPLETIONS,
    "completion_ids": COMPLETION_IDS,
    "columns": COLUMNS,
}


def exact_match(completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
    return [float(c == a) for c, a in zip(completions, answer, strict=True)]


def length(completions: list[str], **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


def score(funcs: list[Any], **overrides: Any) -> RewardScores:
    return compute_rewards(funcs, **{**INPUTS, **overrides})


# ---------------------------------------------------------------------------- names


class Scorer:
    def __call__(self, completions: list[str], **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)


def test_names_use_dunder_name_partial_and_class_and_deduplicate() -> None:
    funcs: list[RewardFunc] = [exact_match, functools.partial(length), Scorer(), exact_match, length, exact_match]
    assert reward_func_names(funcs) == [
        "exact_match",
        "length",
        "Scorer",
        "exact_match_2",
        "length_2",
        "exact_match_3",
    ]


def test_names_skip_a_suffix_already_taken() -> None:
    def exact_match_2(**kwargs: Any) -> list[float]:
        return []

    assert reward_func_names([exact_match_2, exact_match, exact_match]) == [
        "exact_match_2",
        "exact_match",
        "exact_match_3",
    ]


# ---------------------------------------------------------------------------- compute_rewards


def test_values_are_stacked_per_function_and_receive_every_argument() -> None:
    seen: dict[str, Any] = {}

    def spy(**kwargs: Any) -> list[float]:
        seen.update(kwargs)
        return [0.5, -1.0, 2.0]

    out = score([exact_match, spy, length], trainer_state={"global_step": 7})
    expected = torch.tensor([[1.0, 0.5, 1.0], [0.0, -1.0, 1.0], [1.0, 2.0, 1.0]])
    torch.testing.assert_close(out.values, expected, rtol=0, atol=0)
    assert out.values.dtype == torch.float32 and out.nonfinite_counts == [0, 0, 0]
    assert callable(seen.pop("log_extra")) and callable(seen.pop("log_metric"))  # TRL's logging hooks
    assert seen == {
        "prompts": PROMPTS,
        "completions": COMPLETIONS,
        "completion_ids": COMPLETION_IDS,
        "answer": ["2", "2", "4"],
        "trainer_state": {"global_step": 7},
    }


def test_none_becomes_nan_and_nonfinite_values_are_counted() -> None:
    def partial_cover(**kwargs: Any) -> list[float | None]:
        return [None, 1.0, None]

    def broken(**kwargs: Any) -> list[float]:
        return [math.nan, math.inf, -3.0]

    def overflow(**kwargs: Any) -> list[float]:
        return [1e39, 0.0, True]  # 1e39 is inf in float32; True counts as 1.0

    out = score([partial_cover, broken, overflow])
    nan = math.nan
    expected = torch.tensor([[nan, nan, nan], [1.0, nan, 0.0], [nan, -3.0, 1.0]])
    torch.testing.assert_close(out.values, expected, rtol=0, atol=0, equal_nan=True)
    assert out.nonfinite_counts == [0, 2, 1]


@pytest.mark.parametrize(
    "result",
    [
        (1.0, 2.0, 3.0),
        torch.tensor([1.0, 2.0, 3.0]),
        np.array([1.0, 2.0, 3.0]),
        [np.float32(1.0), 2, torch.tensor(3.0)],
    ],
)
def test_tuples_tensors_arrays_and_numpy_scalars_are_accepted(result: Any) -> None:
    out = score([lambda **kwargs: result])
    torch.testing.assert_close(out.values, torch.tensor([[1.0], [2.0], [3.0]]), rtol=0, atol=0)


def test_custom_names_are_used_in_messages() -> None:
    with pytest.raises(ValueError, match="reward function `mine` returned 1 values for 3 completions"):
        score([lambda **kwargs: [1.0]], names=["mine"])
    with pytest.raises(ValueError, match="got 2 names for 1 reward functions"):
        score([length], names=["a", "b"])


def test_wrong_length_names_the_function() -> None:
    def short(**kwargs: Any) -> list[float]:
        return [1.0, 2.0]

    with pytest.raises(ValueError, match="reward function `short` returned 2 values for 3 completions"):
        score([short])


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (0.5, r"reward function `f` returned a float; return a list with one float \(or None\)"),
        ({"a": 1}, "reward function `f` returned a dict"),
        (torch.ones(3, 1), r"returned an array of shape \(3, 1\); return one value per completion"),
        ([1.0, "0.5", 2.0], r"returned '0\.5' \(str\) at row 1; expected a real number, or None"),
        ([1.0, 2.0, 1j], r"returned 1j \(complex\) at row 2"),
        ([[1.0], [2.0], [3.0]], r"returned \[1\.0\] \(list\) at row 0"),
    ],
)
def test_invalid_results_are_explained(result: Any, message: str) -> None:
    def f(**kwargs: Any) -> Any:
        return result

    with pytest.raises(ValueError, match=message):
        score([f])


def test_exceptions_are_wrapped_with_the_function_name() -> None:
    def flaky(**kwargs: Any) -> list[float]:
        raise KeyError("answer")

    with pytest.raises(
        RuntimeError, match=r"reward function `flaky` failed on a batch of 3 completions: KeyError: 'answer'"
    ) as info:
        score([length, flaky])
    assert isinstance(info.value.__cause__, KeyError)


def test_functions_without_kwargs_get_the_arguments_they_name() -> None:
    seen: dict[str, set[str]] = {}

    def tutorial(completions: list[str], prompts: list[str] | None = None) -> list[float]:
        seen["tutorial"] = {"completions", "prompts"} if prompts is not None else {"completions"}
        return [float(c == "2") for c in completions]

    def strict(prompts: list[str], completions: list[str]) -> list[float]:
        return [float(len(p)) for p in prompts]

    def by_column(completions: list[str], *, answer: list[str]) -> list[float]:
        return [float(c == a) for c, a in zip(completions, answer, strict=True)]

    async def async_strict(completions: list[str]) -> list[float]:
        return [1.0] * len(completions)

    class ObjectStyle:
        def __call__(self, completion_ids: list[list[int]]) -> list[float]:
            return [float(ids[0]) for ids in completion_ids]

    values = score([tutorial, strict, by_column, async_strict, ObjectStyle()]).values
    assert values.tolist() == [[1.0, 4.0, 1.0, 1.0, 10.0], [0.0, 4.0, 0.0, 1.0, 11.0], [0.0, 4.0, 1.0, 1.0, 12.0]]
    assert seen["tutorial"] == {"completions", "prompts"}


def test_a_function_requiring_an_argument_nobody_gives_is_refused_up_front() -> None:
    def needs(completions: list[str], solution: list[str], hint: str = "") -> list[float]:
        return [0.0] * len(completions)

    check_reward_arguments([length], ["length"], [])  # **kwargs: needs nothing
    with pytest.raises(ValueError, match=r"`needs` requires argument\(s\) solution.*columns: answer, prompt"):
        RewardFunctions([length, needs]).check_arguments(["prompt", "answer"])
    RewardFunctions([length, needs]).check_arguments(["prompt", "solution"])


def test_a_type_error_inside_a_function_is_still_named() -> None:
    def broken(completions: list[str]) -> list[float]:
        return [len(completions) + "x"]  # type: ignore[operator]

    with pytest.raises(RuntimeError, match=r"`broken` failed.*TypeError"):
        score([broken])


def test_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="`answer` has 2 values for 3 completions"):
        score([length], columns={"answer": ["2", "4"]})
    with pytest.raises(ValueError, match="`prompts` has 1 values for 3 completions"):
        score([length], prompts=["x"])
    with pytest.raises(ValueError, match=r"dataset column\(s\) completions clash with reward function arguments"):
        score([length], columns={"completions": ["a", "b", "c"]})


def test_no_functions_gives_an_empty_matrix() -> None:
    out = score([])
    assert out.values.shape == (3, 0) and out.nonfinite_counts == []


# ---------------------------------------------------------------------------- async


async def slow_one(completions: list[str], **kwargs: Any) -> list[float]:
    await asyncio.sleep(0.2)
    return [1.0] * len(completions)


class SlowTwo:
    async def __call__(self, completions: list[str], **kwargs: Any) -> list[float | None]:
        await asyncio.sleep(0.2)
        return [None, 2.0, None]


class Rendezvous:
    """Async reward functions that each wait until all of them have started: they can only
    finish if the scorer runs them concurrently (a timing assertion would flake on a busy machine)."""

    def __init__(self, parties: int) -> None:
        self.parties, self.started = parties, 0

    async def wait(self) -> None:
        self.started += 1
        for _ in range(1000):  # 10 s at most, then fail rather than hang
            if self.started >= self.parties:
                return
            await asyncio.sleep(0.01)
        raise TimeoutError("the async reward functions were not run concurrently")


def concurrent_pair() -> tuple[Any, Any]:
    """A function and a callable object, both async, that only return when run together."""
    meeting = Rendezvous(2)

    async def slow_one(completions: list[str], **kwargs: Any) -> list[float]:
        await meeting.wait()
        return [1.0] * len(completions)

    class SlowTwo:
        async def __call__(self, completions: list[str], **kwargs: Any) -> list[float | None]:
            await meeting.wait()
            return [None, 2.0, None]

    return slow_one, SlowTwo()


def test_async_functions_run_concurrently_in_order_of_results() -> None:
    one, two = concurrent_pair()
    out = score([one, length, two])
    nan = math.nan
    expected = torch.tensor([[1.0, 1.0, nan], [1.0, 1.0, 2.0], [1.0, 1.0, nan]])
    torch.testing.assert_close(out.values, expected, rtol=0, atol=0, equal_nan=True)


def test_async_inside_a_running_event_loop() -> None:
    one, two = concurrent_pair()

    async def caller() -> RewardScores:
        # A notebook or async server: this thread's loop is busy, so a fresh thread runs them.
        return score([one, two])

    out = asyncio.run(caller())
    assert out.values[:, 0].tolist() == [1.0, 1.0, 1.0]
    assert out.values[1, 1].item() == 2.0


def test_async_exceptions_are_wrapped() -> None:
    async def remote_judge(**kwargs: Any) -> list[float]:
        await asyncio.sleep(0)
        raise ConnectionError("judge unreachable")

    with pytest.raises(RuntimeError, match="`remote_judge` failed on a batch of 3 completions: Connection") as info:
        score([slow_one, remote_judge])
    assert isinstance(info.value.__cause__, ConnectionError)


def test_sync_function_returning_a_coroutine_is_awaited() -> None:
    out = score([lambda **kwargs: slow_one(**kwargs)])
    assert out.values[:, 0].tolist() == [1.0, 1.0, 1.0]


# ---------------------------------------------------------------------------- reward models


def manual_scores(model: PreTrainedModel, tokenizer: Any, texts: list[str]) -> torch.Tensor:
    """One unpadded forward per text: the reference for the batched, padded scorer."""
    scores = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            scores.append(model(input_ids=ids).logits[0, 0])
    return torch.stack(scores)


def test_reward_model_by_path_matches_a_manual_forward(reward_model_dir: Path) -> None:
    funcs = resolve_rewards([str(reward_model_dir), length])
    assert isinstance(funcs[0], RewardModelScorer)
    assert reward_func_names(funcs) == ["tiny-rm", "length"]
    prompts = ["1+1=", "What is 12*3?", "a"]
    completions = ["2", "36, I think", "bcd"]
    out = compute_rewards(funcs, prompts=prompts, completions=completions, completion_ids=[[]] * 3, columns={})
    assert out.values.shape == (3, 2)
    texts = [p + c for p, c in zip(prompts, completions, strict=True)]
    expected = manual_scores(funcs[0].model, funcs[0].tokenizer, texts)
    torch.testing.assert_close(out.values[:, 0], expected, rtol=1e-5, atol=1e-5)
    assert out.values[:, 0].unique().numel() == 3  # not a constant model


def test_reward_model_micro_batches_agree(reward_model_dir: Path) -> None:
    whole = RewardModelScorer(reward_model_dir)
    small = RewardModelScorer(reward_model_dir, batch_size=2).to("cpu")
    prompts, completions = ["ab", "c", "defgh"], ["x", "yy", "z"]
    assert small(prompts, completions) == pytest.approx(whole(prompts, completions), abs=1e-5)


def test_reward_model_conversational_uses_the_chat_template() -> None:
    tokenizer = build_char_tokenizer()
    scorer = RewardModelScorer(tiny_reward_model(tokenizer), tokenizer)
    prompts = [[{"role": "user", "content": "Hi?"}]]
    completions = [[{"role": "assistant", "content": "Hello."}]]
    assert scorer.texts(prompts, completions) == ["<user>Hi?\n<assistant>Hello.\n"]
    expected = manual_scores(scorer.model, tokenizer, ["<user>Hi?\n<assistant>Hello.\n"])
    assert scorer(prompts, completions) == pytest.approx(expected.tolist(), abs=1e-5)
    tokenizer.chat_template = None
    assert scorer.texts(prompts, completions) == ["Hi?\nHello."]


def test_reward_model_without_pad_token_falls_back_to_eos() -> None:
    tokenizer = build_char_tokenizer(with_pad=False)
    model = tiny_reward_model(tokenizer, pad=False)
    (scorer,) = resolve_rewards(model, tokenizer)
    assert isinstance(scorer, RewardModelScorer)
    assert tokenizer.pad_token == "</s>" and model.config.pad_token_id == tokenizer.eos_token_id
    texts = ["a", "abcdef"]
    expected = manual_scores(model, tokenizer, texts)
    assert scorer(texts, ["", ""]) == pytest.approx(expected.tolist(), abs=1e-5)
    assert scorer.__name__ == "LlamaForSequenceClassification"  # built in memory: no path


def test_reward_model_instance_needs_its_tokenizer() -> None:
    model = tiny_reward_model(build_char_tokenizer())
    with pytest.raises(ValueError, match="pass its tokenizer in reward_processing_classes at position 1"):
        resolve_rewards([length, model])
    with pytest.raises(ValueError, match="needs its tokenizer"):
        RewardModelScorer(model)


# ---------------------------------------------------------------------------- resolve_rewards


def test_resolve_rewards_passes_callables_through() -> None:
    assert resolve_rewards(length) == [length]
    scorer = Scorer()
    assert resolve_rewards([length, slow_one, scorer]) == [length, slow_one, scorer]


def test_resolve_rewards_rejects_bad_items() -> None:
    with pytest.raises(
        ValueError,
        match=r"reward function 1 \(3\) is a int; give a callable, a name, a dict",
    ):
        resolve_rewards([length, 3])
    with pytest.raises(ValueError, match="give at least one reward function"):
        resolve_rewards([])
    with pytest.raises(ValueError, match="reward_processing_classes has 1 entries for 2 reward functions"):
        resolve_rewards([length, length], [None])


def test_resolve_rewards_takes_builtin_names_in_the_trainer_api_too() -> None:
    # one resolver: the names a run file uses work in RLOOTrainer(reward_funcs=...) as well
    funcs = resolve_rewards(["accuracy", length])
    assert reward_func_names(funcs) == ["accuracy", "length"]
    with pytest.raises(ValueError, match="unknown reward `acuracy`; did you mean `accuracy`"):
        resolve_rewards("acuracy")


# ---------------------------------------------------------------------------- timeouts and the error policy


def hangs(completions: list[str], **kwargs: Any) -> list[float]:
    time.sleep(30)
    return [0.0] * len(completions)


async def hangs_async(completions: list[str], **kwargs: Any) -> list[float]:
    await asyncio.sleep(30)
    return [0.0] * len(completions)


def broken(completions: list[str], **kwargs: Any) -> list[float]:
    raise ZeroDivisionError("oops")


def too_short(completions: list[str], **kwargs: Any) -> list[float]:
    return [1.0]


@pytest.mark.parametrize("func", [hangs, hangs_async], ids=["sync", "async"])
def test_a_reward_function_that_never_returns_times_out(func: Any) -> None:
    # before: a reward function that never returned hung the run
    start = time.perf_counter()
    with pytest.raises(RewardFunctionError, match=rf"`{func.__name__}` did not return within reward_timeout=0.2 s"):
        compute_rewards([length, func], **INPUTS, policy=CallPolicy(timeout=0.2))
    skipped = compute_rewards([length, func], **INPUTS, policy=CallPolicy(timeout=0.2, on_error="skip"))
    assert time.perf_counter() - start < 5.0
    assert skipped.values[:, 1].isnan().all() and not skipped.values[:, 0].isnan().any()
    assert skipped.failed_counts == [0, 3]


def test_the_skip_policy_blanks_a_failing_or_malformed_function() -> None:
    with pytest.raises(RewardFunctionError, match="`broken` failed on a batch of 3 completions: ZeroDivisionError"):
        compute_rewards([broken], **INPUTS)
    with pytest.raises(ValueError, match="`too_short` returned 1 values for 3 completions"):
        compute_rewards([too_short], **INPUTS)
    out = compute_rewards([broken, too_short, length], **INPUTS, policy=CallPolicy(on_error="skip"))
    assert out.failed_counts == [3, 3, 0] and out.values[:, :2].isnan().all()


def test_rewards_are_combined_over_the_functions_that_did_not_fail() -> None:
    combined = RewardFunctions([broken, length], policy=CallPolicy(on_error="skip")).score(**INPUTS)
    assert combined.scorable.all()
    torch.testing.assert_close(combined.rewards, combined.scores.values[:, 1])


# ---------------------------------------------------------------------------- the watchdog
def test_the_watchdog_reports_a_long_call_without_cutting_it_off() -> None:
    """No reward_timeout: a call running past watch_after is reported (naming the function and reward_timeout),
    again when its time has doubled, and its scores are still used when it returns."""
    reports: list[str] = []

    def slow(completions: list[Any], **kwargs: Any) -> list[float]:
        time.sleep(0.7)
        return [1.0] * len(completions)

    async def slow_async(completions: list[Any], **kwargs: Any) -> list[float]:
        await asyncio.sleep(0.7)
        return [0.5] * len(completions)

    policy = CallPolicy(watch_after=0.2, warn=reports.append)
    scores = compute_rewards(
        [slow, slow_async], prompts=["p"], completions=["c"], completion_ids=[[1]], columns={}, policy=policy
    )
    assert scores.values.tolist() == [[1.0, 0.5]]
    for name in ("slow", "slow_async"):
        mine = [r for r in reports if f"`{name}`" in r]
        assert len(mine) >= 2, reports  # after 0.2 s and 0.4 s (then, on a loaded machine, maybe at 0.8 s)
        assert "has run for 0.2 s" in mine[0] and "has run for 0.4 s" in mine[1] and "set reward_timeout" in mine[0]


def test_with_a_timeout_or_no_warn_there_is_no_watchdog() -> None:
    assert not CallPolicy(timeout=5.0, warn=print).watching()
    assert not CallPolicy().watching() and CallPolicy(warn=print).watching()
