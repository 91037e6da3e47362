"""Built-in reward functions and the reward resolver, on hand-written examples."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from rloo.rewards.builtins import (
    BUILTIN_REWARDS,
    THINK_ANSWER_PATTERN,
    accuracy_reward,
    completion_text,
    exact_match_reward,
    extract_final_number,
    format_reward,
    length_reward,
    normalize_text,
    string_match_reward,
    think_answer_format_reward,
)
from rloo.rewards.calling import compute_rewards, reward_func_names
from rloo.rewards.resolve import resolve_reward
from rloo.rewards.reward_model import RewardModelScorer, reward_model
from rloo.rewards.signatures import check_reward_arguments


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


# ---------------------------------------------------------------------------- completion_text


def test_completion_text_plain_and_conversational() -> None:
    assert completion_text("hi") == "hi"
    assert completion_text(chat("hi")) == "hi"
    assert completion_text({"role": "assistant", "content": "hi"}) == "hi"
    assert completion_text([]) == ""
    assert completion_text(chat(None)) == ""  # type: ignore[arg-type]
    tool_turns = [chat("call")[0], {"role": "tool", "content": "42"}, chat("final")[0]]
    assert completion_text(tool_turns) == "final"
    assert completion_text([{"role": "user", "content": "only"}]) == "only"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert completion_text(parts) == "ab"
    with pytest.raises(TypeError, match="got int"):
        completion_text(3)


# ---------------------------------------------------------------------------- number extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 1,000.", 1000.0),
        ("\\boxed{42}", 42.0),
        ("\\boxed{\\frac{1}{2}}", 0.5),  # numeric fractions are read as a / b
        ("\\boxed{\\dfrac{3}{4}}", 0.75),
        ("\\boxed{-\\frac{1}{2}}", -0.5),
        ("\\boxed{1/2}", 0.5),
        ("-3.50", -3.5),
        ("x = 7.0", 7.0),
        ("+5 points", 5.0),
        ("#### 1,234", 1234.0),
        ("-1,234.5 is it", -1234.5),
        ("so .5", 0.5),
        ("10-3", 3.0),  # a minus glued to a number is an operator
        ("between 2024-2025", 2025.0),
        ("first 3 then 4", 4.0),
        ("1,2,3", 3.0),
        ("so x = -\\frac{3}{4}", -0.75),
        ("1,0000", 0.0),  # not a thousands group: 1 then 0000
        ("\\boxed{x = 7}", 7.0),
        ("\\boxed{\\$1{,}000}", 1000.0),
        ("\\boxed{18\\%}", 18.0),
        ("\\boxed{90^\\circ}", 90.0),
        ("\\boxed{72 \\text{ dollars}}", 72.0),
        ("\\boxed{\\left(5\\right)}", 5.0),
        ("99 then \\boxed{3}, checked 12 ways", 3.0),  # the box wins over later numbers
        ("\\boxed{{4}}", 4.0),
        ("\\boxed{1} then \\boxed{2", 2.0),  # last box unclosed: last number in the text
    ],
)
def test_extract_final_number(text: str, expected: float) -> None:
    assert extract_final_number(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "no number here",
        "",
        "\\boxed{\\frac{x}{2}}",  # not numeric: None, never the denominator
        "\\boxed{3\\sqrt{2}}",
        "\\boxed{\\pi}",
        "\\boxed{(1, 2)}",
        "\\boxed{2x+3}",
        "\\boxed{1/0}",
        "\\frac{1}{0}",
        "7 apples but \\boxed{B}",  # a boxed non-number: the text outside is not used
    ],
)
def test_extract_final_number_none(text: str) -> None:
    assert extract_final_number(text) is None


# ---------------------------------------------------------------------------- accuracy


def test_accuracy_reward_hand_examples() -> None:
    completions = ["The answer is 1,000.", "\\boxed{42}", "x = 7.0", "I don't know", "-3.50", "\\boxed{\\frac{1}{2}}"]
    answer = ["1000", "#### 41", 7, "5", "-3.5", "0.5"]
    assert accuracy_reward(completions=completions, answer=answer) == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]


def test_accuracy_reward_gsm8k_answer_and_tolerance() -> None:
    gsm8k = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 1,234"
    completions = ["so 1234", "so 1234.0000001", "so 1234.01", "so 1,234"]
    assert accuracy_reward(completions, [gsm8k] * 4) == [1.0, 1.0, 0.0, 1.0]


def test_accuracy_reward_none_when_answer_does_not_apply() -> None:
    answers: list[Any] = [None, "", "n/a", float("nan"), True, "12"]
    assert accuracy_reward(["12"] * 6, answers) == [None, None, None, None, None, 1.0]


def test_accuracy_reward_conversational_and_extra_columns() -> None:
    rewards = accuracy_reward(
        prompts=[[{"role": "user", "content": "6*7?"}]] * 2,
        completions=[chat("It is \\boxed{42}."), chat("43")],
        completion_ids=[[1], [2]],
        answer=["42", "42"],
        trainer_state=None,
        source=["a", "b"],
    )
    assert rewards == [1.0, 0.0]


def test_accuracy_reward_in_compute_rewards() -> None:
    scores = compute_rewards(
        [accuracy_reward],
        prompts=["q", "q", "q"],
        completions=["7", "8", "7"],
        completion_ids=[[1], [2], [3]],
        columns={"answer": ["7", "7", None]},
    )
    assert scores.values[:, 0].tolist()[:2] == [1.0, 0.0]
    assert scores.values[2, 0].isnan()


# ---------------------------------------------------------------------------- string match


def test_normalize_text() -> None:
    assert normalize_text('  "Paris."  ') == "paris"
    assert normalize_text("New \n  York!") == "new york"
    assert normalize_text("**(B)**") == "b"
    assert normalize_text("“Yes,” ") == "yes"
    assert normalize_text("-3") == "-3"  # signs and $ are kept
    assert normalize_text("$5") == "$5"


def test_exact_match_reward() -> None:
    completions = ["Paris.", "  new   YORK ", "Lyon", chat("'Rome'"), "paris"]
    answer: list[Any] = ["paris", "New York", "Paris", "Rome", None]
    assert exact_match_reward(completions=completions, answer=answer) == [1.0, 1.0, 0.0, 1.0, None]
    assert exact_match_reward(["72"], [72]) == [1.0]


def test_string_match_factory_column_and_no_normalize() -> None:
    loose = string_match_reward(column="label")
    strict = string_match_reward(column="label", normalize=False)
    assert loose.__name__ == "string_match"
    completions = ["Yes.", "yes", "no"]
    assert loose(completions=completions, label=["yes", "yes", None]) == [1.0, 1.0, None]
    assert strict(completions=completions, label=["yes", "yes", "No"]) == [0.0, 1.0, 0.0]
    with pytest.raises(KeyError, match="column 'label'"):
        loose(completions=completions, answer=["yes"] * 3)


# ---------------------------------------------------------------------------- format


def test_format_reward() -> None:
    func = format_reward(r"\d+ apples")
    assert func.__name__ == "format"
    assert func(completions=["  12 apples\n", "12 apples!", chat("3 apples")]) == [1.0, 0.0, 1.0]
    multiline = format_reward(r"a.b")
    assert multiline(["a\nb"]) == [1.0]  # DOTALL by default
    assert format_reward(r"a.b", flags=0)(["a\nb"]) == [0.0]


def test_format_reward_invalid_regex_names_pattern() -> None:
    with pytest.raises(ValueError, match=re.escape("'(unclosed'")):
        format_reward("(unclosed")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>step 1\nstep 2</think><answer>42</answer>", 1.0),
        ("  <think>a</think>\n\n<answer>b</answer>\n", 1.0),
        ("<think></think><answer></answer>", 1.0),
        ("<answer>b</answer>", 0.0),
        ("<think>a</think><answer>b</answer> trailing", 0.0),
        ("preamble <think>a</think><answer>b</answer>", 0.0),
        ("<think>a</think>x<answer>b</answer>", 0.0),
        ("<think>a</think><answer>b</answer><answer>c</answer>", 0.0),
        ("<think>a<think>b</think></think><answer>c</answer>", 0.0),
    ],
)
def test_think_answer_format_reward(text: str, expected: float) -> None:
    assert think_answer_format_reward(completions=[text, chat(text)]) == [expected, expected]
    assert THINK_ANSWER_PATTERN.startswith("<think>")


# ---------------------------------------------------------------------------- length


def test_length_reward_seed_rule() -> None:
    func = length_reward()
    assert func.__name__ == "length"
    ten = " ".join(["w"] * 10)
    completions = ["short", "short.", ten, ten + ".", " ".join(["w"] * 51) + ".", chat(ten + ". ")]
    assert func(completions=completions) == [-0.5, 0.0, 1.0, 1.5, 0.5, 1.5]


def test_length_reward_custom_and_validation() -> None:
    func = length_reward(min_words=2, max_words=3, short_penalty=-1.0, in_range_bonus=2.0, sentence_bonus=0.0)
    assert func(["a", "a b", "a b c.", "a b c d"]) == [-1.0, 2.0, 2.0, 0.0]
    assert length_reward(min_words=0, max_words=0)([""]) == [1.0]
    with pytest.raises(ValueError, match=r"min_words=5 and max_words=4"):
        length_reward(min_words=5, max_words=4)
    with pytest.raises(ValueError, match="min_words=-1"):
        length_reward(min_words=-1)


# ---------------------------------------------------------------------------- reward models


def test_reward_model_wraps_scorer(reward_model_dir: Path) -> None:
    scorer = reward_model(str(reward_model_dir), tokenizer=str(reward_model_dir), batch_size=1)
    assert isinstance(scorer, RewardModelScorer)
    assert scorer.batch_size == 1
    scores = scorer(prompts=["1+1=", "2+2="], completions=["2", "4"])
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)


# ---------------------------------------------------------------------------- registry


def test_every_builtin_resolves_with_a_meaningful_name() -> None:
    # code_execution is built with the unsafe opt-out (a machine without bubblewrap refuses it otherwise) and
    # never called
    params: dict[str, dict[str, Any]] = {"format": {"pattern": "x"}, "code_execution": {"sandbox": "none"}}
    names = {}
    for name in BUILTIN_REWARDS:
        if name == "reward_model":
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            names[name] = resolve_reward({"name": name, **params.get(name, {})}).__name__
    assert names == {
        "accuracy": "accuracy",
        "exact_match": "exact_match",
        "string_match": "string_match",
        "format": "format",
        "think_answer_format": "think_answer_format",
        "think_format": "think_format",
        "length": "length",
        "code_execution": "code_execution",
        "reasoning_accuracy": "reasoning_accuracy",
        "soft_overlong_punishment": "soft_overlong_punishment",
    }
    assert set(BUILTIN_REWARDS) == {*names, "reward_model"}


def test_resolve_builtin_name_and_dict_with_params_and_weight() -> None:
    accuracy = resolve_reward("accuracy")
    assert accuracy(completions=["\\boxed{3}"], answer=["3"]) == [1.0]
    assert accuracy.__doc__ == accuracy_reward.__doc__
    fmt = resolve_reward({"name": "format", "pattern": r"\d+", "weight": 0.5})
    assert fmt(completions=["12", "a"]) == [1.0, 0.0]
    short = resolve_reward({"name": "length", "min_words": 1, "max_words": 2})
    assert short(completions=["a b"]) == [1.0]
    assert reward_func_names([resolve_reward("accuracy"), accuracy]) == ["accuracy", "accuracy_2"]


def test_resolve_bad_params_name_the_reward_and_its_parameters() -> None:
    with pytest.raises(ValueError, match=r"reward 'length'.*'min_wrds'.*accepts: min_words, max_words"):
        resolve_reward({"name": "length", "min_wrds": 3})
    with pytest.raises(ValueError, match=r"reward 'accuracy'.*accepts: none"):
        resolve_reward({"name": "accuracy", "tolerance": 0.1})
    with pytest.raises(ValueError, match=r"reward 'format'.*pattern"):
        resolve_reward("format")  # the pattern is required
    with pytest.raises(ValueError, match="min_words=9 and max_words=1"):
        resolve_reward({"name": "length", "min_words": 9, "max_words": 1})
    with pytest.raises(ValueError, match=r"has no 'name'.*Built-in rewards: accuracy"):
        resolve_reward({"pattern": "x", "weight": 1.0})


def test_resolve_import_string() -> None:
    assert resolve_reward("rloo.rewards.builtins:accuracy_reward") is accuracy_reward
    built = resolve_reward({"name": "rloo.rewards.builtins:format_reward", "pattern": "ok"})
    assert built(completions=["ok", "no"]) == [1.0, 0.0]


def test_resolve_import_string_from_temp_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_rewards.py").write_text(
        "class Holder:\n"
        "    @staticmethod\n"
        "    def shout(completions, **kwargs):\n"
        "        return [float(c.isupper()) for c in completions]\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    func = resolve_reward("my_rewards:Holder.shout")
    assert func(completions=["HI", "hi"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="could not import module 'no_such_mod'"):
        resolve_reward("no_such_mod:func")
    with pytest.raises(ValueError, match="module 'my_rewards' has no attribute 'missing'"):
        resolve_reward("my_rewards:missing")
    with pytest.raises(ValueError, match="'my_rewards:NOT_CALLABLE' is a int, not a callable"):
        resolve_reward("my_rewards:NOT_CALLABLE")


def test_resolve_reward_model_folder(reward_model_dir: Path, tmp_path: Path) -> None:
    scorer = resolve_reward(str(reward_model_dir))
    assert isinstance(scorer, RewardModelScorer)
    assert scorer.__name__ == reward_model_dir.name
    with_params = resolve_reward({"name": reward_model_dir, "batch_size": 2, "weight": 1.0})
    assert isinstance(with_params, RewardModelScorer) and with_params.batch_size == 2
    builtin = resolve_reward({"name": "reward_model", "path_or_model": str(reward_model_dir)})
    assert isinstance(builtin, RewardModelScorer)
    with pytest.raises(ValueError, match=r"has no config\.json"):
        resolve_reward(str(tmp_path))


def test_resolve_unknown_name_suggests_and_lists_builtins() -> None:
    with pytest.raises(ValueError, match=r"unknown reward `acuracy`; did you mean `accuracy`\?") as info:
        resolve_reward("acuracy")
    builtins = (
        "accuracy, reasoning_accuracy, exact_match, string_match, format, think_answer_format, think_format, length, "
        "soft_overlong_punishment, code_execution, reward_model"
    )
    assert builtins in str(info.value)
    with pytest.raises(ValueError, match=r"unknown reward `zzz`\. Built-in rewards"):
        resolve_reward("zzz")
    with pytest.raises(ValueError, match="did you mean `length`"):
        resolve_reward({"name": "lenght"})
    with pytest.raises(ValueError, match="is a int"):
        resolve_reward(3)


def test_resolve_callable_passes_through() -> None:
    assert resolve_reward(exact_match_reward) is exact_match_reward


def test_a_reward_module_in_the_current_folder_is_importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # before: `my_reward:score` next to the run file needed PYTHONPATH=. (TRL's CLI does not)
    (tmp_path / "cwd_reward_mod.py").write_text(
        "def score(completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert resolve_reward("cwd_reward_mod:score")(completions=["a", "b"]) == [1.0, 1.0]


# ---------------------------------------------------------------------------- TRL's reward names


def test_trl_reward_imports_work_from_rloo_rewards() -> None:
    from rloo.rewards import accuracy_reward as exported_accuracy
    from rloo.rewards import think_format_reward

    # TRL's examples: completions as conversations, the gold in a `solution` column
    completions = [[{"role": "assistant", "content": "so \\boxed{12}"}], [{"role": "assistant", "content": "13"}]]
    assert exported_accuracy(completions, solution=["$12$", "12"]) == [1.0, 0.0]
    assert exported_accuracy(["7"], answer=["7"], solution=["8"]) == [1.0]  # answer wins when both exist
    with pytest.raises(ValueError, match="needs an `answer` \\(or TRL's `solution`\\) column"):
        exported_accuracy(["7"])
    # TRL's docstring example
    texts = ["<think>\nThis is my reasoning.\n</think>\nThis is my answer.", "<think>\nThis is my reasoning.\nanswer."]
    assert think_format_reward([[{"content": t}] for t in texts]) == [1.0, 0.0]
    assert think_format_reward(["<think>a</think><think>b</think>"]) == [0.0]


def test_a_reward_needing_one_of_two_columns_is_checked_when_the_trainer_is_built() -> None:
    funcs = [resolve_reward("accuracy")]
    check_reward_arguments(funcs, ["accuracy"], ["prompt", "solution"])
    check_reward_arguments(funcs, ["accuracy"], ["prompt", "answer"])
    with pytest.raises(ValueError, match="requires argument\\(s\\) answer or solution"):
        check_reward_arguments(funcs, ["accuracy"], ["prompt"])
    with pytest.raises(ValueError, match="requires argument\\(s\\) answer"):  # a wrapped builtin keeps its signature
        check_reward_arguments([resolve_reward("exact_match")], ["exact_match"], ["prompt"])


def test_soft_overlong_punishment_follows_dapo_eq_13_by_hand() -> None:
    # L_max = 10, L_cache = 4: free up to 6 tokens, then -1/4 per token, -1 past 10
    reward = resolve_reward({"name": "soft_overlong_punishment", "max_completion_len": 10, "soft_punish_cache": 4})
    lengths = [0, 6, 7, 8, 10, 11, 30]
    assert reward(completion_ids=[[1] * n for n in lengths]) == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]
    hard = resolve_reward({"name": "soft_overlong_punishment", "max_completion_len": 3, "soft_punish_cache": 0})
    assert hard(completion_ids=[[1] * 3, [1] * 4]) == [0.0, -1.0]
    with pytest.raises(ValueError, match="0 <= soft_punish_cache <= max_completion_len"):
        resolve_reward({"name": "soft_overlong_punishment", "max_completion_len": 3, "soft_punish_cache": 5})


def test_reasoning_accuracy_scores_only_the_text_after_the_reasoning() -> None:
    reward = resolve_reward("reasoning_accuracy")
    completions = [
        "<think>maybe 5</think> so 7",  # the answer after </think> is right
        "<think>it is 7</think> so 5",  # 7 only inside the reasoning: wrong
        "<think>still thinking about 7",  # reasoning never ends: 0, as TRL
        [{"role": "assistant", "content": "<think>x</think>\\boxed{7}"}],
    ]
    assert reward(completions=completions, solution=["7"] * 4) == [1.0, 0.0, 0.0, 1.0]
    assert reward(completions=["<think></think> 7"], answer=["no number"]) == [None]  # gold unparseable: skip
