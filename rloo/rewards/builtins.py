"""Built-in reward functions and :data:`BUILTIN_REWARDS`, the names a run file can use
(resolved by :mod:`rloo.rewards.resolve`).

Every reward function has TRL's signature: it is called with keyword arguments
``prompts``, ``completions``, ``completion_ids``, every dataset column by name and
``trainer_state``, and returns one float per completion, or ``None`` where it does not
apply (see :mod:`rloo.rewards.calling`). Completions may be strings or conversations
(``[{"role": "assistant", "content": text}]``); :func:`rloo.rewards.signatures.completion_text` turns either into
the text that is scored.

Where we depart from TRL's ``trl.rewards``:

- ``accuracy_reward`` compares numbers (``7.0 == 7``, ``1,000 == 1000``, GSM8K's
  ``#### 72``) with a regex extractor instead of ``math_verify``'s symbolic checker, so it
  has no extra dependency; it answers ``None`` (does not apply) when the gold answer has no
  number, where TRL skips the sample the same way.
- Factories (``format_reward(pattern)``, ``length_reward(...)``) build named functions, so
  the logged metric is ``rewards/format/mean`` rather than the name of a lambda.
- ``code_execution`` (:mod:`rloo.rewards.code_execution`) runs completions' code against test
  cases under bubblewrap (:mod:`rloo.rewards.sandbox`); TRL has no such built-in.

``import rloo.rewards.builtins`` stays light: transformers is loaded only when a reward model
is built (:func:`rloo.rewards.reward_model.reward_model`).
"""

from __future__ import annotations

import functools
import math
import numbers
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from rloo.rewards.code_execution import code_execution_reward
from rloo.rewards.overlong import soft_overlong_punishment
from rloo.rewards.signatures import completion_text

if TYPE_CHECKING:
    from rloo.rewards.calling import RewardFunc

Rewards = list[float | None]


# ---------------------------------------------------------------------------- accuracy

_NUM = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+"
# A sign counts only when not glued to a word or number ("10-3" is 10 and 3, not -3).
_SIGNED = rf"(?:(?<![\w.])[-+])?(?:{_NUM})"
_FRAC = rf"\\[dt]?frac\{{\s*({_SIGNED})\s*\}}\{{\s*({_SIGNED})\s*\}}"
_NUMBER_TOKEN = re.compile(rf"(?:(?<![\w.])-)?{_FRAC}|({_SIGNED})")
_SLASH_FRACTION = re.compile(rf"\s*({_SIGNED})\s*/\s*({_SIGNED})\s*")
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\{([^{}]*)\}")
_LATEX_NOISE = re.compile(r"\\[$%!,;: ]|\\(?:left|right|circ|quad|qquad|displaystyle)\b")


def extract_final_number(text: str) -> float | None:
    """The final numeric answer in ``text``, or ``None`` when there is none.

    - If the last ``\\boxed{`` in ``text`` is closed (nested braces allowed), only its content
      counts, and it must be a single number: ``a/b`` or a numeric
      ``\\frac{a}{b}`` (also ``\\dfrac``, ``\\tfrac``) is ``a / b``; ``\\text{..}`` keeps its
      content; ``\\$``, ``\\%``, ``^\\circ``, ``\\left``/``\\right`` and spacing commands are
      ignored; ``{,}`` is a comma. So ``\\boxed{x = 7}`` and ``\\boxed{\\$1{,}000}`` are numbers,
      while ``\\boxed{\\frac{x}{2}}``, ``\\boxed{3\\sqrt{2}}`` and ``\\boxed{(1, 2)}`` are
      ``None``. The text outside the box is then never used.
    - Otherwise the last number in the text, a numeric ``\\frac{a}{b}`` counting as one.

    A number is an integer or decimal with an optional ``-``/``+`` sign (a sign glued to a
    preceding word or digit is an operator: ``10-3`` ends with 3), and thousands separated
    by commas in groups of three (``1,000``, ``-1,234.5``). Scientific notation is not read.
    A zero denominator gives ``None``.
    """
    boxed = _last_boxed(text)
    return _last_number(text) if boxed is None else _boxed_number(boxed)


def _boxed_number(content: str) -> float | None:
    content = _TEXT_COMMAND.sub(r"\1", content.replace("{,}", ","))
    content = _LATEX_NOISE.sub(" ", content)
    slash = _SLASH_FRACTION.fullmatch(content)
    if slash:
        return _divide(slash.group(1), slash.group(2))
    tokens = list(_NUMBER_TOKEN.finditer(content))
    # A command left over (\sqrt, \pi, a non-numeric \frac) means an expression, not a number.
    if len(tokens) != 1 or "\\" in _NUMBER_TOKEN.sub(" ", content):
        return None
    return _token_value(tokens[0])


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``, braces balanced; ``None`` if absent or unclosed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                return text[begin:i]
            depth -= 1
    return None


def _last_number(text: str) -> float | None:
    tokens = list(_NUMBER_TOKEN.finditer(text))
    return _token_value(tokens[-1]) if tokens else None


def _token_value(token: re.Match[str]) -> float | None:
    if token.group(3) is not None:
        return _to_float(token.group(3))
    value = _divide(token.group(1), token.group(2))
    return -value if value is not None and token.group(0).startswith("-") else value


def _to_float(token: str) -> float:
    return float(token.replace(",", ""))


def _divide(numerator: str, denominator: str) -> float | None:
    bottom = _to_float(denominator)
    return None if bottom == 0 else _to_float(numerator) / bottom


def _gold_number(value: Any) -> float | None:
    """The number in an ``answer`` cell (a number, or text read like a completion)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    return extract_final_number(str(value))


def accuracy_reward(
    completions: Sequence[Any],
    answer: Sequence[Any] | None = None,
    solution: Sequence[Any] | None = None,
    **kwargs: Any,
) -> Rewards:
    """1.0 if the completion's final number equals the ``answer`` column's (or, as TRL's
    ``accuracy_reward`` reads it, the ``solution`` column's), else 0.0.

    Both sides go through :func:`extract_final_number` (so ``#### 1,234``, ``\\boxed{7}``
    and ``7.0`` all work); a numeric ``answer`` is used as is. Equal means
    ``math.isclose(predicted, gold, rel_tol=1e-6)``. A completion with no number gets 0.0.
    An ``answer`` that is ``None``, empty or has no number gives ``None`` (does not apply).
    Where TRL's differs: TRL parses LaTeX answers with ``math_verify`` (expressions, sets,
    intervals); this one compares final numbers only, so a non-numeric solution does not apply.
    """
    gold_column = answer if answer is not None else solution
    if gold_column is None:
        raise ValueError("accuracy_reward needs an `answer` (or TRL's `solution`) column in the dataset")
    rewards: Rewards = []
    for completion, gold_value in zip(completions, gold_column, strict=True):
        gold = _gold_number(gold_value)
        if gold is None:
            rewards.append(None)
            continue
        predicted = extract_final_number(completion_text(completion))
        rewards.append(float(predicted is not None and math.isclose(predicted, gold, rel_tol=1e-6)))
    return rewards


accuracy_reward.required_columns = (("answer", "solution"),)  # type: ignore[attr-defined]  # checked at build


def reasoning_accuracy_reward(
    completions: Sequence[Any],
    answer: Sequence[Any] | None = None,
    solution: Sequence[Any] | None = None,
    reasoning_delimiters: Sequence[str] = ("</think>",),
    **kwargs: Any,
) -> Rewards:
    """TRL's ``reasoning_accuracy_reward``: :func:`accuracy_reward` on what follows the reasoning (the
    text after the first of ``reasoning_delimiters`` found); 0.0 when the reasoning never ends."""
    texts = [completion_text(completion) for completion in completions]
    answers: list[str | None] = []
    for text in texts:
        delimiter = next((d for d in reasoning_delimiters if d in text), None)
        answers.append(None if delimiter is None else text.split(delimiter)[-1])
    scored = accuracy_reward([a or "" for a in answers], answer=answer, solution=solution)
    return [0.0 if a is None else r for a, r in zip(answers, scored, strict=True)]


reasoning_accuracy_reward.required_columns = accuracy_reward.required_columns  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- string match

# Stripped from both ends when normalizing; signs, $, %, # and / are kept ("-3" != "3").
_STRIP_CHARS = ".,;:!?\"'`()[]{}<>*_“”‘’«»"


def normalize_text(text: str) -> str:
    """Lowercase, collapse whitespace runs to one space, strip whitespace and the characters
    ``.,;:!?"'`()[]{}<>*_`` and curly quotes from both ends."""
    collapsed = " ".join(text.lower().split())
    previous = None
    while previous != collapsed:
        previous = collapsed
        collapsed = collapsed.strip(_STRIP_CHARS).strip()
    return collapsed


def _string_match(completions: Sequence[Any], targets: Sequence[Any], normalize: bool) -> Rewards:
    rewards: Rewards = []
    for completion, target in zip(completions, targets, strict=True):
        if target is None:
            rewards.append(None)
            continue
        text, gold = completion_text(completion), str(target)
        if normalize:
            text, gold = normalize_text(text), normalize_text(gold)
        rewards.append(float(text == gold))
    return rewards


def exact_match_reward(completions: Sequence[Any], answer: Sequence[Any], **kwargs: Any) -> Rewards:
    """1.0 if the whole completion equals the ``answer`` column after :func:`normalize_text`
    on both (non-string answers are ``str()``-ed), else 0.0; ``None`` where the answer is ``None``."""
    return _string_match(completions, answer, normalize=True)


def string_match_reward(column: str = "answer", normalize: bool = True) -> RewardFunc:
    """A reward named ``string_match``: 1.0 if the completion equals dataset column ``column``
    (after :func:`normalize_text` when ``normalize``, else character for character), else 0.0;
    ``None`` where the column's value is ``None``."""

    def string_match(completions: Sequence[Any], **kwargs: Any) -> Rewards:
        if column not in kwargs:
            raise KeyError(f"string_match needs dataset column {column!r}; columns given: {sorted(kwargs)}")
        return _string_match(completions, kwargs[column], normalize)

    return string_match


# ---------------------------------------------------------------------------- format and length


def format_reward(pattern: str, flags: int = re.DOTALL) -> RewardFunc:
    """A reward named ``format``: 1.0 if ``re.fullmatch(pattern, text.strip(), flags)``, else 0.0.

    Raises ``ValueError`` naming the pattern if it is not a valid regular expression.
    """
    try:
        compiled = re.compile(pattern, flags)
    except re.error as error:
        raise ValueError(f"format_reward: pattern {pattern!r} is not a valid regular expression: {error}") from None

    def format(completions: Sequence[Any], **kwargs: Any) -> Rewards:
        return _fullmatch_rewards(compiled, completions)

    return format


def _fullmatch_rewards(compiled: re.Pattern[str], completions: Sequence[Any]) -> Rewards:
    return [float(compiled.fullmatch(completion_text(c).strip()) is not None) for c in completions]


THINK_ANSWER_PATTERN = r"<think>(?:(?!</?think>).)*</think>\s*<answer>(?:(?!</?answer>).)*</answer>"
_THINK_ANSWER = re.compile(THINK_ANSWER_PATTERN, re.DOTALL)


_THINK = re.compile(r"^<think>(?!.*<think>)(.*?)</think>.*$", re.DOTALL | re.MULTILINE)


def think_format_reward(completions: Sequence[Any], **kwargs: Any) -> Rewards:
    """TRL's ``think_format_reward``: 1.0 if the completion starts with ``<think>``, closes it
    with ``</think>`` and opens no second one (``^<think>(?!.*<think>)(.*?)</think>.*$``,
    ``re.DOTALL | re.MULTILINE``, matched at the start as TRL does), else 0.0."""
    return [1.0 if _THINK.match(completion_text(c)) else 0.0 for c in completions]


def think_answer_format_reward(completions: Sequence[Any], **kwargs: Any) -> Rewards:
    """1.0 if the stripped completion is ``<think>...</think>`` then ``<answer>...</answer>``
    (whitespace between them allowed, contents may span lines, no repeated or nested tags;
    :data:`THINK_ANSWER_PATTERN` with ``re.DOTALL``), else 0.0."""
    return _fullmatch_rewards(_THINK_ANSWER, completions)


def length_reward(
    min_words: int = 10,
    max_words: int = 50,
    short_penalty: float = -0.5,
    in_range_bonus: float = 1.0,
    sentence_bonus: float = 0.5,
) -> RewardFunc:
    """A reward named ``length`` preferring medium-length, complete answers.

    With ``words = len(text.split())``: ``in_range_bonus`` if ``min_words <= words <= max_words``,
    ``short_penalty`` if ``words < min_words``, 0 if longer; plus ``sentence_bonus`` if the
    stripped text ends with ``"."``. Raises ``ValueError`` unless ``0 <= min_words <= max_words``.
    """
    if min_words < 0 or min_words > max_words:
        raise ValueError(
            f"length_reward: min_words={min_words} and max_words={max_words} are invalid; "
            "need 0 <= min_words <= max_words"
        )

    def length(completions: Sequence[Any], **kwargs: Any) -> Rewards:
        rewards: Rewards = []
        for completion in completions:
            text = completion_text(completion).strip()
            words = len(text.split())
            score = in_range_bonus if min_words <= words <= max_words else short_penalty if words < min_words else 0.0
            rewards.append(score + (sentence_bonus if text.endswith(".") else 0.0))
        return rewards

    return length


# ---------------------------------------------------------------------------- reward models


# ---------------------------------------------------------------------------- registry


def _reward_model(path_or_model: Any, tokenizer: Any = None, batch_size: int | None = None) -> RewardFunc:
    """:func:`rloo.rewards.reward_model.reward_model`, imported on use (it loads transformers)."""
    from rloo.rewards.reward_model import reward_model

    return reward_model(path_or_model, tokenizer, batch_size)


def _plain(func: Callable[..., Rewards], name: str) -> Callable[[], RewardFunc]:
    """A parameterless factory for a plain reward function, renamed ``name`` for the metrics."""

    def factory() -> RewardFunc:
        def reward(*args: Any, **kwargs: Any) -> Rewards:
            return func(*args, **kwargs)

        # its signature and required_columns are func's (inspect.signature follows __wrapped__),
        # so the columns it needs are checked when the trainer is built
        functools.update_wrapper(reward, func)
        reward.__name__ = reward.__qualname__ = name
        return reward

    factory.__name__ = name
    return factory


BUILTIN_REWARDS: dict[str, Callable[..., RewardFunc]] = {
    "accuracy": _plain(accuracy_reward, "accuracy"),
    "reasoning_accuracy": _plain(reasoning_accuracy_reward, "reasoning_accuracy"),
    "exact_match": _plain(exact_match_reward, "exact_match"),
    "string_match": string_match_reward,
    "format": format_reward,
    "think_answer_format": _plain(think_answer_format_reward, "think_answer_format"),
    "think_format": _plain(think_format_reward, "think_format"),
    "length": length_reward,
    "soft_overlong_punishment": soft_overlong_punishment,
    "code_execution": code_execution_reward,
    "reward_model": _reward_model,
}
# the built-ins that execute completions (in rloo.rewards.sandbox): refused without a working sandbox
RUNS_MODEL_CODE = ("code_execution",)
