"""The learning study's tasks: small verifiable tasks for a tiny Llama with a character tokenizer.

A :class:`Task` is its problems (rows with a ``prompt`` and an ``answer``), the demonstrations its
warm start is taught on, a 0/1 reward and sizes. Two kinds:

* ``arithmetic``: the demo's (``rloo demo``): two-digit ``+``/``-`` taught by a teacher that never
  carries nor borrows (wrong on about 45% of problems), reward = the exact number;
* ``reversal``: reverse a string of 3-5 letters over ``abcdef`` (``"cab>"`` -> ``"bac"``), taught
  with correct demonstrations but stopped early; reward = the exact string, character for character.

Both warm-start the same way (:func:`warm_start`: supervised on the demonstrations, stopped once
greedy accuracy on 200 training problems reaches ``warm_start_accuracy``) so RL has room to improve.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rloo.cli.demo import DEMO_CHARS, DEMO_COMPLETION_LENGTH, build_demo_model, make_problems, teacher_answer
from rloo.cli.supervised import Demonstration, greedy_accuracy, supervised_train
from rloo.rewards.builtins import accuracy_reward, string_match_reward

Row = dict[str, Any]
REVERSAL_ALPHABET = "abcdef"
REVERSAL_LENGTHS = (3, 4, 5)


@dataclass(frozen=True)
class Task:
    name: str
    chars: str  # the tokenizer's characters
    completion_length: int  # max_completion_length: the longest answer, EOS and one to spare
    train: list[Row]
    held_out: list[Row]
    demonstrations: list[Demonstration]  # what the warm start is taught (not always right)
    reward: Callable[..., Any]
    warm_start_accuracy: float

    def accuracy(self, model: Any, tokenizer: Any, rows: list[Row]) -> float:
        """Greedy accuracy on ``rows``: the share whose greedy completion gets reward 1."""
        return greedy_accuracy(model, tokenizer, rows, self.reward, self.completion_length)


def arithmetic_task(seed: int) -> Task:
    """The demo's task, split as the demo splits it for ``seed``."""
    train, held_out = make_problems(seed)
    return Task(
        name="arithmetic",
        chars=DEMO_CHARS,
        completion_length=DEMO_COMPLETION_LENGTH,
        train=[{"prompt": p.prompt, "answer": p.answer} for p in train],
        held_out=[{"prompt": p.prompt, "answer": p.answer} for p in held_out],
        demonstrations=[(p.prompt, str(teacher_answer(p))) for p in train],
        reward=accuracy_reward,
        warm_start_accuracy=0.40,
    )


def reversal_rows(alphabet: str = REVERSAL_ALPHABET, lengths: tuple[int, ...] = REVERSAL_LENGTHS) -> list[Row]:
    """Every string over ``alphabet`` of each length in ``lengths``: ``{"prompt": "abc>", "answer": "cba"}``."""
    words = ("".join(letters) for n in lengths for letters in itertools.product(alphabet, repeat=n))
    return [{"prompt": f"{word}>", "answer": word[::-1]} for word in words]


def reversal_task(seed: int, warm_start_accuracy: float = 0.30) -> Task:
    """String reversal, split 80/20 (shuffled by ``seed``), taught with correct demonstrations."""
    rows = reversal_rows()
    random.Random(seed).shuffle(rows)
    cut = int(0.8 * len(rows))
    train, held_out = rows[:cut], rows[cut:]
    return Task(
        name="reversal",
        chars=REVERSAL_ALPHABET + ">",
        completion_length=max(REVERSAL_LENGTHS) + 2,
        train=train,
        held_out=held_out,
        demonstrations=[(row["prompt"], row["answer"]) for row in train],
        reward=string_match_reward("answer", normalize=False),
        warm_start_accuracy=warm_start_accuracy,
    )


TASKS: dict[str, Callable[[int], Task]] = {"arithmetic": arithmetic_task, "reversal": reversal_task}


def warm_start(task: Task, seed: int, max_steps: int = 3000) -> tuple[Any, Any, float]:
    """``(model, tokenizer, held-out accuracy)``: the tiny Llama supervised on ``task.demonstrations``
    until greedy accuracy on 200 training problems reaches ``task.warm_start_accuracy`` (checked every
    25 steps), or ``max_steps``. Held-out accuracy is on the first 300 held-out problems."""
    import torch

    torch.manual_seed(seed)
    model, tokenizer = build_demo_model(seed, chars=task.chars)
    check = task.train[:200]
    supervised_train(
        model,
        tokenizer,
        task.demonstrations,
        steps=max_steps,
        seed=seed,
        stop_when=lambda m: task.accuracy(m, tokenizer, check) >= task.warm_start_accuracy,
        check_every=25,
    )
    return model, tokenizer, task.accuracy(model, tokenizer, task.held_out[:300])
