"""RLOO with tool calling, in TRL GRPO's style: ``tools=[multiply]`` lets the model call a Python function in
the middle of its answer; each completion is an episode (the model's turns, the tool's answers between them),
and the reward reads its last message.

  python examples/rloo_tools.py          # offline: a tiny random model built here; under a minute on a CPU
  python examples/rloo_tools.py --gpu    # the same run at size: Qwen/Qwen3-0.6B on one GPU

The task: three-digit by two-digit products ("What is 347 * 29?"), easy with the tool, scored by ``correct`` and by
``number_answer`` (a shaping reward for answering with digits). Offline, the tiny model is random: it almost never
writes a well-formed call, so this run shows the wiring (the tool's schema in the prompt, episodes,
``tools/call_frequency`` in metrics.jsonl) and ``reward`` rising from under 0.1 to about 0.2 in 100 steps as it
learns to answer with digits, not tool use being learned; ``rloo demo-tools`` shows a tiny model learning when to
call the tool (docs/tools.md). With ``--gpu`` it downloads Qwen3-0.6B from the hub (the only thing it needs the
network for; Qwen3's chat template renders tools in the Hermes format rloo parses) and trains all its weights in
bf16 autocast, thinking off, with the one-card settings of docs/installation.md's "GPU set-up": ``rloo plan`` puts
the peak at 15.4 GiB (17 with the CUDA context, for 256-token prompts), so a 24 GB card holds it. The GPU version
has not been run by the tests (they have neither a GPU nor the network).
"""

from __future__ import annotations

import argparse
import random
import tempfile

from rloo import RLOOConfig, RLOOTrainer
from rloo.tiny import TOOL_CHARS, TOOL_CHAT_TEMPLATE, save_tiny_model

# The settings that change with the model's size; every other setting is the same in both runs.
TINY = {
    "num_generations": 4,  # K episodes per prompt
    "per_device_train_batch_size": 32,  # episodes per micro-batch: 8 prompts x 4
    "max_completion_length": 24,  # the whole episode after the prompt: turns and tool answers
    "learning_rate": 2e-3,
    "max_steps": 100,
    "logging_steps": 10,
}
GPU = {
    "num_generations": 8,
    "per_device_train_batch_size": 16,  # 2 prompts x 8 episodes per micro-batch
    "gradient_accumulation_steps": 4,  # 8 prompts x 8 episodes per optimizer step
    "max_completion_length": 512,
    "learning_rate": 1e-6,  # full fine-tuning: small steps
    "max_steps": 300,
    "gradient_checkpointing": True,  # TRL's default; rloo's is False (docs/migrating-from-trl.md)
    "chat_template_kwargs": {"enable_thinking": False},  # Qwen3 answers without a <think> block
    "logging_steps": 10,
    "save_steps": 100,
}


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b


def products(n: int, seed: int = 0) -> list[dict[str, object]]:
    """``n`` conversational rows (tools need them: the chat template renders the tools' schemas) with the
    factors as columns, which the reward functions receive by name."""
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    for _ in range(n):
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} * {b}?"}], "a": a, "b": b})
    return rows


def correct(completions: list[list[dict[str, str]]], a: list[int], b: list[int], **kwargs: object) -> list[float]:
    """1.0 when the episode's last message is the product. A completion is the episode's messages: the model's
    turns (with their ``tool_calls``) and the tools' answers."""
    answers = [episode[-1]["content"].strip() for episode in completions]
    return [float(answer == str(x * y)) for answer, x, y in zip(answers, a, b, strict=True)]


def number_answer(completions: list[list[dict[str, str]]], **kwargs: object) -> list[float]:
    """The share of the last message's characters that are digits, halved: a small push toward a bare number."""
    texts = [episode[-1]["content"].strip() for episode in completions]
    return [0.5 * sum(ch.isdigit() for ch in text) / max(1, len(text)) for text in texts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="Qwen/Qwen3-0.6B with the GPU settings")
    parser.add_argument("--max-steps", type=int, help="optimizer steps (default: the settings')")
    parser.add_argument("--output-dir", help="run folder (default: a fresh runs/rloo, runs/rloo-2, ...)")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        # the tiny model's tokenizer has the characters of a Hermes call and a chat template that renders tools
        tiny = f"{scratch}/tiny"
        model = (
            "Qwen/Qwen3-0.6B"
            if options.gpu
            else str(save_tiny_model(tiny, chars=TOOL_CHARS, chat_template=TOOL_CHAT_TEMPLATE, initializer_range=0.2))
        )
        settings = dict(GPU if options.gpu else TINY)
        if options.max_steps is not None:
            settings["max_steps"] = options.max_steps
        trainer = RLOOTrainer(
            model=model,
            reward_funcs=[correct, number_answer],
            args=RLOOConfig(output_dir=options.output_dir, max_tool_calling_iterations=2, seed=0, **settings),
            train_dataset=products(2000),
            tools=[multiply],
        )
        trainer.train()  # writes the run folder: config.yaml, metrics.jsonl, report.html, final/


if __name__ == "__main__":
    main()
