"""``rloo demo-tools``: RLOO teaches a tiny model to use a calculator tool, offline, on a CPU.

The story, and what it does and does not show:

1. A tiny Llama and a character tokenizer (the chat template's markers and the tool-call JSON's fixed
   parts are single tokens) are built locally; the model may call ``multiply(a, b)``.
2. The task is a two-digit number times a one-digit one ("47*8?" -> "376"): too hard for the model to
   compute in its head, trivial with the tool.
3. The demonstrations are *imperfect*: the teacher calls the tool on a minority of the problems and
   answers the others in its head, by rounding the two-digit number to its tens (47*8 -> 400): right
   only when nothing was rounded.
4. Warm start: supervised on those episodes (the tool's answers are context, not trained on), until
   its greedy answers are as often right as the teacher's are.
5. RLOO with the exact-answer reward, K episodes per prompt, each a real multi-turn episode: the model's
   call is parsed, the tool runs, its answer is inserted as tokens, the model writes the final answer.
6. Control: the warm start trained with as many supervised steps as RLOO took, of as many
   demonstrations as RLOO has prompts per step ("same steps").

Copying the teacher copies its habit of answering in its head; RLOO is scored by the true answer, and
the episodes that called the tool are the ones that were right, so the model learns to call it.
The demo shows an online RL loop learning *when to use a tool* from outcome rewards; it says nothing
about large models or natural-language tool use.
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rloo.cli.demo_options import DemoSizes
from rloo.cli.supervised import supervised_train
from rloo.generation.sampling import SamplingParams
from rloo.pipeline import RolloutSettings, generate_and_score
from rloo.rewards.calling import RewardFunctions
from rloo.tiny import TOOL_CHAT_TEMPLATE, TOOL_TEMPLATE_TAIL, TOOLS_LINE, build_char_tokenizer, build_tiny_llama
from rloo.tools.agent import AgentSettings
from rloo.tools.episodes import EpisodeLimits

TOOL_DEMO_CHARS = "0123456789*?.:\n _"
# the chat template's markers and the call's fixed text, one token each (the episode stays ~30 tokens)
TOOL_DEMO_TOKENS = (
    "<system>tools: multiply.",
    "<user>",
    "<assistant>",
    "<tool>",
    "<tool_call>",
    "</tool_call>",
    '{"name": "multiply", "arguments": {"a": ',
    ', "b": ',
    "}}",
)
# the reasoning block's markers, one token each (added only under the thinking template: the default demo's
# vocabulary, and so its model and its numbers, stay as they were)
THINK_TOKENS = ("<think>", "</think>")
# a thinking model's template (Qwen3's rules, in the demo's markers): an assistant turn shows its reasoning
# (``reasoning_content``, or a ``<think>...</think>`` the model wrote into its content) only after the last
# user message, and the last turn shows an empty block when it has none. So it is not prefix-preserving: the
# turn a model just sampled renders differently once tool messages follow it.
THINKING_TOOL_CHAT_TEMPLATE = (
    TOOLS_LINE + "{% set ns = namespace(last_query=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_query = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}"
    "{% set content = m['content'] or '' %}{% set reasoning = m.reasoning_content or '' %}"
    "{% if '</think>' in content %}{% set reasoning = content.split('</think>')[0].split('<think>')[-1] %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "<assistant>{% if loop.index0 > ns.last_query and (loop.last or reasoning) %}<think>{{ reasoning }}</think>"
    "{% endif %}{{ content }}" + TOOL_TEMPLATE_TAIL
)
TEMPLATES = {"hermes": TOOL_CHAT_TEMPLATE, "thinking": THINKING_TOOL_CHAT_TEMPLATE}
EPISODE_TOKENS = 32
THINKING_EPISODE_TOKENS = 40  # the reasoning blocks' tokens on top
CONTROL = "control: + SFT, same steps"


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b


@dataclass(frozen=True)
class Product:
    a: int
    b: int

    @property
    def prompt(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"{self.a}*{self.b}?"}]

    @property
    def answer(self) -> int:
        return self.a * self.b

    @property
    def head_answer(self) -> int:
        """The teacher's answer without the tool: the two-digit number rounded to its tens."""
        return round(self.a, -1) * self.b


def make_products(seed: int) -> tuple[list[Product], list[Product]]:
    """Every two-digit number times every one-digit one from 2, split 80/20."""
    products = [Product(a, b) for a in range(10, 100) for b in range(2, 10)]
    random.Random(seed).shuffle(products)
    cut = int(0.8 * len(products))
    return products[:cut], products[cut:]


def build_tool_demo_model(
    seed: int, hidden_size: int = 128, num_layers: int = 2, template: str = "hermes"
) -> tuple[Any, Any]:
    """The demo's tiny Llama and its tokenizer, whose chat template renders tool calls (Hermes format); ``template``
    "thinking": a thinking model's (:data:`THINKING_TOOL_CHAT_TEMPLATE`)."""
    tokenizer = build_char_tokenizer(TOOL_DEMO_CHARS)
    tokenizer.add_tokens(list(TOOL_DEMO_TOKENS) + (list(THINK_TOKENS) if template == "thinking" else []))
    tokenizer.chat_template = TEMPLATES[template]
    model = build_tiny_llama(
        len(tokenizer), hidden_size=hidden_size, num_layers=num_layers, num_heads=4, max_positions=64, seed=seed
    )
    model.config.pad_token_id, model.config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    return model, tokenizer


def teacher_episode(problem: Product, uses_tool: bool, thinking: bool = False) -> list[dict[str, Any]]:
    """The teacher's episode: a call and the tool's answer copied, or an answer from its head; ``thinking``: each
    turn reasons first (``reasoning_content``): the product it will compute, rounded when in its head ("50*8")."""
    if not uses_tool:
        head = {"role": "assistant", "content": str(problem.head_answer)}
        return [{**head, "reasoning_content": f"{round(problem.a, -1)}*{problem.b}"} if thinking else head]
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": problem.a, "b": problem.b}}}
    calling = {"role": "assistant", "content": "", "tool_calls": [call]}
    return [
        {**calling, "reasoning_content": f"{problem.a}*{problem.b}"} if thinking else calling,
        {"role": "tool", "name": "multiply", "content": str(problem.answer)},
        {"role": "assistant", "content": str(problem.answer)},
    ]


def encode_episode(tokenizer: Any, problem: Product, episode: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of a demonstrated episode: labels on the model's turns (and their EOS) only."""

    def ids(messages: list[dict[str, Any]], generation_prompt: bool) -> list[int]:
        text = tokenizer.apply_chat_template(
            messages, tools=[multiply], tokenize=False, add_generation_prompt=generation_prompt
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompt = ids(problem.prompt, True)
    full = ids(problem.prompt + episode, False)
    labels = [-100] * len(full)
    for i, message in enumerate(episode):  # each assistant turn: from its start to its EOS
        if message["role"] != "assistant":
            continue
        start = len(ids(problem.prompt + episode[:i], True))
        end = len(ids(problem.prompt + episode[: i + 1], False))
        end = max(j for j in range(start, end) if full[j] == tokenizer.eos_token_id) + 1  # the turn ends at its EOS
        labels[start:end] = full[start:end]
    full, labels = full[: len(full) - 1], labels[: len(full) - 1]  # the template's newline after the last EOS
    assert full[: len(prompt)] == prompt
    return full, labels


def tool_rewards() -> RewardFunctions:
    """The exact answer in the episode's last message (weight 1)."""

    def correct(completions: list[Any], answer: list[int], **_: Any) -> list[float]:
        return [float(final_answer(c[-1]) == str(x)) for c, x in zip(completions, answer, strict=True)]

    return RewardFunctions([correct])


def final_answer(message: dict[str, Any]) -> str:
    """A model turn's answer: its content after any reasoning block."""
    return str(message.get("content", "")).split("</think>")[-1].strip()


@dataclass(frozen=True)
class ToolAccuracy:
    """Greedy episodes on held-out problems: right answers, episodes that called the tool, and calls with the
    problem's own numbers."""

    greedy: float
    tool_use: float
    right_call: float


def episode_tokens(tokenizer: Any) -> int:
    """An episode's token budget: more under the thinking template, for the reasoning blocks."""
    return THINKING_EPISODE_TOKENS if tokenizer.chat_template == THINKING_TOOL_CHAT_TEMPLATE else EPISODE_TOKENS


def agent_settings(tokens: int = EPISODE_TOKENS) -> AgentSettings:
    return AgentSettings((multiply,), EpisodeLimits(max_iterations=2, max_tokens=tokens, timeout=10.0))


@torch.no_grad()
def evaluate_tools(model: nn.Module, tokenizer: Any, problems: list[Product]) -> ToolAccuracy:
    """Greedy episodes (with the real tool) scored by the training pipeline."""
    tokens = episode_tokens(tokenizer)
    settings = RolloutSettings(1, tokens, SamplingParams(top_k=1), agent=agent_settings(tokens))
    columns = {"answer": [p.answer for p in problems]}
    scored = generate_and_score(model, tokenizer, [p.prompt for p in problems], columns, tool_rewards(), settings)
    assert scored.episodes is not None
    correct = float(scored.rewards.scores.values[:, 0].sum())
    used = sum(e.tool_calls > 0 for e in scored.episodes)
    right = sum(
        any(c["function"]["arguments"] == {"a": p.a, "b": p.b} for c in e.messages[0].get("tool_calls", []))
        for e, p in zip(scored.episodes, problems, strict=True)
    )
    n = len(problems)
    return ToolAccuracy(correct / n, used / n, right / n)


@dataclass(frozen=True)
class ToolDemoOptions(DemoSizes):
    """Sizes of the demo; the defaults finish in a few minutes on 2 CPU cores."""

    steps: int = 40
    num_generations: int = 4
    prompts_per_step: int = 32
    learning_rate: float = 1e-3
    warm_start_steps: int = 1500
    output_dir: str = "runs/demo-tools"
    tool_share: float = 0.3
    chat_template: str = "hermes"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.tool_share < 1:
            raise ValueError(f"--tool-share={self.tool_share} is invalid: the teacher's share of tool calls, in (0, 1)")
        if self.chat_template not in TEMPLATES:
            raise ValueError(
                f"--chat-template={self.chat_template!r} is invalid: one of {', '.join(map(repr, TEMPLATES))}"
            )


@dataclass(frozen=True)
class ToolDemoResult:
    rows: dict[str, ToolAccuracy]
    seconds: dict[str, float]
    output_dir: Path


def teacher_accuracy(problems: list[Product], uses_tool: dict[Product, bool]) -> ToolAccuracy:
    right = sum(uses_tool[p] or p.head_answer == p.answer for p in problems) / len(problems)
    used = sum(uses_tool[p] for p in problems) / len(problems)
    return ToolAccuracy(right, used, used)


def run_tool_demo(options: ToolDemoOptions, log: Any = print) -> ToolDemoResult:
    """Warm start on the teacher's episodes, then RLOO with the real tool vs. a same-steps supervised control."""
    from rloo.config import RLOOConfig
    from rloo.training.trainer import RLOOTrainer

    torch.manual_seed(options.seed)
    train, held_out = make_products(options.seed)
    chooser = random.Random(options.seed + 1)
    uses_tool = {p: chooser.random() < options.tool_share for p in train + held_out}
    template = options.chat_template
    model, tokenizer = build_tool_demo_model(options.seed, options.hidden_size, options.num_layers, template)
    thinking = template == "thinking"
    encoded = [encode_episode(tokenizer, p, teacher_episode(p, uses_tool[p], thinking)) for p in train]
    seconds: dict[str, float] = {}
    rows = {"teacher (demonstrations)": teacher_accuracy(held_out, uses_tool)}
    level = rows["teacher (demonstrations)"].greedy
    log(f"1/4 warm start: supervised on the teacher's episodes (tool on {options.tool_share:.0%}) until {level:.0%}")
    start = time.perf_counter()
    probe = train[:128]
    supervised_train(
        model,
        tokenizer,
        [],
        steps=options.warm_start_steps,
        seed=options.seed,
        encoded=encoded,
        stop_when=lambda m: evaluate_tools(m, tokenizer, probe).greedy >= level,
    )
    seconds["warm start"] = time.perf_counter() - start
    control = copy.deepcopy(model)
    rows["warm start"] = evaluate_tools(model, tokenizer, held_out)

    k = options.num_generations
    log(f"2/4 RLOO: {options.steps} steps of {options.prompts_per_step} prompts x {k} episodes with the tool")
    args = RLOOConfig(
        output_dir=options.output_dir,
        num_generations=k,
        per_device_train_batch_size=options.prompts_per_step * k,
        max_completion_length=episode_tokens(tokenizer),
        max_tool_calling_iterations=2,
        tool_timeout=10.0,
        learning_rate=options.learning_rate,
        max_steps=options.steps,
        beta=0.0,
        logging_steps=max(1, options.steps // 15),
        save_steps=options.steps,
        log_completions=True,
        seed=options.seed,
    )
    dataset = [{"prompt": p.prompt, "answer": p.answer} for p in train]
    rewards = tool_rewards().funcs
    trainer = RLOOTrainer(
        model, rewards, args=args, train_dataset=dataset, processing_class=tokenizer, tools=[multiply]
    )
    start = time.perf_counter()
    trainer.train()
    seconds["RLOO"] = time.perf_counter() - start

    log(f"3/4 control: the warm start trained {options.steps} supervised steps of {options.prompts_per_step} episodes")
    start = time.perf_counter()
    supervised_train(
        control,
        tokenizer,
        [],
        steps=options.steps,
        batch_size=options.prompts_per_step,
        seed=options.seed + 1,
        encoded=encoded,
    )
    seconds[CONTROL] = time.perf_counter() - start

    log(f"4/4 evaluating greedy episodes on {len(held_out)} held-out problems")
    rows[CONTROL] = evaluate_tools(control, tokenizer, held_out)
    rows["+ RLOO"] = evaluate_tools(model, tokenizer, held_out)
    return ToolDemoResult(rows, seconds, Path(options.output_dir))


def tool_demo_table(result: ToolDemoResult) -> Any:
    """The table ``rloo demo-tools`` prints."""
    from rich.table import Table

    table = Table(title="Two-digit x one-digit with a multiply tool: greedy episodes on held-out problems")
    for name in ("model", "right answer", "called the tool", "right call", "train time"):
        table.add_column(name, justify="left" if name == "model" else "right")
    times = {"+ RLOO": "RLOO"}
    for name, acc in result.rows.items():
        seconds = result.seconds.get(times.get(name, name))
        table.add_row(
            name,
            f"{acc.greedy:.1%}",
            f"{acc.tool_use:.1%}",
            f"{acc.right_call:.1%}",
            "" if seconds is None else f"{seconds:.0f} s",
        )
    return table
