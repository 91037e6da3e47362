"""``rloo demo``: RLOO visibly improving a tiny model at arithmetic, offline, on a CPU.

The story, and what it does and does not show:

1. A tiny Llama (about 100k parameters) and a character tokenizer are built locally.
2. The task is two-digit addition and subtraction ("47+38=" -> "85"), with train and
   held-out problems.
3. The demonstrations are *imperfect*, like real ones: the teacher forgets to carry (and
   to borrow), so it is wrong on roughly half the problems, always in the same way.
4. Warm start: a short supervised phase on those demonstrations, stopped early (RL cannot
   explore from a policy that never produces a right answer).
5. RLOO with the exact-answer reward, from the warm start.
6. Controls: the warm start trained with as many supervised steps as RLOO took, each on as
   many demonstrations as RLOO has prompts per step ("same steps"), or as many as RLOO
   generates completions per step ("same tokens": prompts x K sequences, the tokens RLOO
   trains on). The budgets are counted in steps and sequences, not seconds, so a slow or
   loaded machine costs time, never a different result.

Supervised learning can at best copy the teacher, mistakes included; RLOO is scored by
the true answer, so it can go past the teacher. The demo shows that an online RL loop with
a verifiable reward fixes systematic errors in its demonstrations; it says nothing about
large models or natural-language tasks.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rloo.cli.demo_options import DemoSizes
from rloo.cli.supervised import Demonstration, greedy_scores, supervised_train
from rloo.pipeline import RolloutSettings, generate_and_score
from rloo.rewards.builtins import accuracy_reward
from rloo.rewards.calling import RewardFunctions
from rloo.tiny import build_char_tokenizer, build_tiny_llama

DEMO_CHARS = "0123456789+-="
DEMO_COMPLETION_LENGTH = 5  # tokens: up to 3 digits, EOS, and one to spare
CONTROL = "control: + SFT, same steps"
CONTROL_TOKENS = "control: + SFT, same tokens"


@dataclass(frozen=True)
class Problem:
    a: int
    b: int
    op: str

    @property
    def prompt(self) -> str:
        return f"{self.a}{self.op}{self.b}="

    @property
    def answer(self) -> int:
        return self.a + self.b if self.op == "+" else self.a - self.b


def make_problems(seed: int) -> tuple[list[Problem], list[Problem]]:
    """All two-digit additions and subtractions with a non-negative result, split 80/20."""
    problems = [Problem(a, b, op) for a in range(10, 100) for b in range(10, 100) for op in "+-"]
    problems = [p for p in problems if p.answer >= 0]
    random.Random(seed).shuffle(problems)
    cut = int(0.8 * len(problems))
    return problems[:cut], problems[cut:]


def teacher_answer(problem: Problem) -> int:
    """The imperfect teacher: digit-wise arithmetic that never carries nor borrows."""
    ones_a, ones_b, tens_a, tens_b = problem.a % 10, problem.b % 10, problem.a // 10, problem.b // 10
    if problem.op == "+":
        return (tens_a + tens_b) * 10 + (ones_a + ones_b) % 10
    return abs(tens_a - tens_b) * 10 + abs(ones_a - ones_b)


def build_demo_model(
    seed: int, hidden_size: int = 128, num_layers: int = 2, chars: str = DEMO_CHARS
) -> tuple[Any, Any]:
    """The demo's tiny Llama and a character tokenizer of ``chars`` (the learning study's other tasks
    pass theirs)."""
    tokenizer = build_char_tokenizer(chars)
    model = build_tiny_llama(
        len(tokenizer), hidden_size=hidden_size, num_layers=num_layers, num_heads=4, max_positions=32, seed=seed
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


def demonstrations(problems: list[Problem]) -> list[Demonstration]:
    """The teacher's (carry-less) answers to ``problems``, as supervised examples."""
    return [(p.prompt, str(teacher_answer(p))) for p in problems]


def reached(tokenizer: Any, problems: list[Problem], level: float) -> Callable[[nn.Module], bool]:
    """Whether a model's greedy accuracy on ``problems`` reaches ``level`` (the warm start's stop)."""
    return lambda model: evaluate(model, tokenizer, problems, num_generations=0).greedy >= level


@dataclass(frozen=True)
class Accuracy:
    greedy: float
    pass_at_k: float
    teacher_agreement: float


def demo_rewards() -> RewardFunctions:
    """Correctness (weight 1) and agreement with the teacher (weight 0: reported, not rewarded)."""

    def teacher_agreement(completions: list[Any], teacher: list[int], **kwargs: Any) -> list[float | None]:
        return accuracy_reward(completions, teacher)

    return RewardFunctions([accuracy_reward, teacher_agreement], weights=[1.0, 0.0])


@torch.no_grad()
def evaluate(
    model: nn.Module, tokenizer: Any, problems: list[Problem], num_generations: int = 4, seed: int = 0
) -> Accuracy:
    """Greedy accuracy, pass@k with ``num_generations`` samples (temperature 1), and how often
    the greedy answer equals the teacher's (wrong or right); scored by the training pipeline."""
    rows = [{"prompt": p.prompt, "answer": p.answer, "teacher": teacher_answer(p)} for p in problems]
    rewards = demo_rewards()
    greedy = greedy_scores(model, tokenizer, rows, rewards, DEMO_COMPLETION_LENGTH)
    correct, teacher = greedy[:, 0], greedy[:, 1]
    pass_k = correct
    if num_generations:
        generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
        settings = RolloutSettings(num_generations, DEMO_COMPLETION_LENGTH)
        prompts = [row["prompt"] for row in rows]
        columns = {key: [row[key] for row in rows] for key in ("answer", "teacher")}
        sampled = generate_and_score(model, tokenizer, prompts, columns, rewards, settings, generator=generator)
        pass_k = sampled.rewards.scores.values[:, 0].view(-1, num_generations).amax(dim=1)
    n = len(problems)
    return Accuracy(float(correct.sum()) / n, float(pass_k.sum()) / n, float(teacher.sum()) / n)


@dataclass(frozen=True)
class DemoOptions(DemoSizes):
    """Sizes of the demo; the defaults finish in about 2 minutes on 2 CPU cores."""

    steps: int = 500
    num_generations: int = 4
    prompts_per_step: int = 64
    learning_rate: float = 5e-4
    warm_start_steps: int = 3000
    warm_start_accuracy: float = 0.40
    eval_problems: int = 500

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eval_problems < 1:
            raise ValueError(f"--eval-problems={self.eval_problems} is invalid: it must be >= 1")


@dataclass(frozen=True)
class DemoResult:
    """Held-out accuracy of each model, and the seconds each training phase took."""

    rows: dict[str, Accuracy]
    seconds: dict[str, float]
    output_dir: Path


def run_demo(options: DemoOptions, log: Any = print) -> DemoResult:
    """Warm start, then RLOO vs. same-steps and same-tokens supervised controls; evaluated on held-out
    problems."""
    from rloo.config import RLOOConfig
    from rloo.training.trainer import RLOOTrainer

    torch.manual_seed(options.seed)
    train, held_out = make_problems(options.seed)
    held_out = held_out[: options.eval_problems]
    model, tokenizer = build_demo_model(options.seed, options.hidden_size, options.num_layers)
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    seconds: dict[str, float] = {}
    log(
        f"1/4 warm start: supervised on the teacher's (carry-less) answers until {options.warm_start_accuracy:.0%} "
        f"(at most {options.warm_start_steps} steps)"
    )
    start = time.perf_counter()
    taught = demonstrations(train)
    supervised_train(
        model,
        tokenizer,
        taught,
        steps=options.warm_start_steps,
        seed=options.seed,
        stop_when=reached(tokenizer, train[:200], options.warm_start_accuracy),
    )
    seconds["warm start"] = time.perf_counter() - start
    controls = {CONTROL: copy.deepcopy(model), CONTROL_TOKENS: copy.deepcopy(model)}
    k = options.num_generations
    rows = {"teacher (demonstrations)": teacher_accuracy(held_out)}
    rows["warm start"] = evaluate(model, tokenizer, held_out, k, options.seed)

    log(f"2/4 RLOO: {options.steps} steps of {options.prompts_per_step} prompts x {k} completions, accuracy reward")
    args = RLOOConfig(
        output_dir=options.output_dir,
        num_generations=k,
        per_device_train_batch_size=options.prompts_per_step * k,
        max_completion_length=DEMO_COMPLETION_LENGTH,
        learning_rate=options.learning_rate,
        max_steps=options.steps,
        beta=0.0,
        logging_steps=max(1, options.steps // 20),
        save_steps=options.steps,
        log_completions=True,
        seed=options.seed,
    )
    dataset = [{"prompt": p.prompt, "answer": p.answer} for p in train]
    trainer = RLOOTrainer(model, accuracy_reward, args=args, train_dataset=dataset, processing_class=tokenizer)
    start = time.perf_counter()
    trainer.train()
    seconds["RLOO"] = time.perf_counter() - start

    log(
        f"3/4 controls: the warm start trained {options.steps} supervised steps (as many as RLOO took) of "
        f"{options.prompts_per_step} demonstrations (same steps) and of {options.prompts_per_step * k} "
        "(same tokens: as many sequences as RLOO generated)"
    )
    for offset, (name, batch_size) in enumerate(
        ((CONTROL, options.prompts_per_step), (CONTROL_TOKENS, options.prompts_per_step * k)), start=1
    ):
        start = time.perf_counter()
        supervised_train(
            controls[name], tokenizer, taught, steps=options.steps, batch_size=batch_size, seed=options.seed + offset
        )
        seconds[name] = time.perf_counter() - start

    log(f"4/4 evaluating on {len(held_out)} held-out problems")
    for name, control in controls.items():
        rows[name] = evaluate(control, tokenizer, held_out, k, options.seed)
    rows["+ RLOO"] = evaluate(model, tokenizer, held_out, k, options.seed)
    return DemoResult(rows, seconds, Path(options.output_dir))


def teacher_accuracy(problems: list[Problem]) -> Accuracy:
    """The demonstrations' own accuracy: the ceiling of copying them."""
    share = sum(teacher_answer(p) == p.answer for p in problems) / len(problems)
    return Accuracy(share, share, 1.0)


def demo_table(result: DemoResult, k: int) -> Any:
    """The table ``rloo demo`` prints: accuracy of each model, and its training time."""
    from rich.table import Table

    table = Table(title="Two-digit + and -: accuracy on held-out problems")
    for name in ("model", "greedy", f"pass@{k}", "= teacher", "train time"):
        table.add_column(name, justify="left" if name == "model" else "right")
    times = {"+ RLOO": "RLOO"}
    for name, acc in result.rows.items():
        seconds = result.seconds.get(times.get(name, name), None)
        table.add_row(
            name,
            f"{acc.greedy:.1%}",
            f"{acc.pass_at_k:.1%}",
            f"{acc.teacher_agreement:.1%}",
            "" if seconds is None else f"{seconds:.0f} s",
        )
    return table
