"""RLOO with a LoRA adapter on chat prompts: only the adapter trains, and the frozen base model, with the adapter
switched off, is the KL reference (no second copy of the weights).

  python examples/rloo_lora.py          # offline: a tiny random model built here; under a minute on a CPU
  python examples/rloo_lora.py --gpu    # the same run at size: Qwen/Qwen2.5-1.5B-Instruct on one GPU

The task: word problems about counting ("Ann has 12 apples and gets 7 more. How many apples does Ann have?"),
scored by the built-in ``accuracy_reward`` and by ``ends_with_number`` (your own reward function). Offline, the
tiny model cannot count: watch ``reward`` rise from under 0.3 to about 0.75 in 120 steps as it learns to end its
answer with a number. With ``--gpu`` it
downloads the model from the hub (the only thing it needs the network for) and trains a rank-16 adapter on
every linear layer in bf16 autocast, with the one-card settings of docs/installation.md's "GPU set-up":
``rloo plan`` puts the peak at 8 GiB (9.5 with the CUDA context), so a 16 GB card holds it. The GPU version
has not been run by the tests (they have neither a GPU nor the network). The run folder holds the adapter in
``final/`` (load it with ``peft.PeftModel.from_pretrained``), ``report.html`` and ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile

from peft import LoraConfig

from rloo import RLOOConfig, RLOOTrainer
from rloo.rewards import accuracy_reward
from rloo.tiny import save_tiny_model

LINEAR_LAYERS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # Llama's, Qwen's

# The settings that change with the model's size; every other setting is the same in both runs.
TINY = {
    "num_generations": 4,  # K completions per prompt
    "per_device_train_batch_size": 32,  # completions per micro-batch: 8 prompts x 4
    "max_completion_length": 8,
    "learning_rate": 2e-3,  # a LoRA adapter on a random 2-layer model
    "max_steps": 120,
    "logging_steps": 15,
}
GPU = {
    "num_generations": 8,
    "per_device_train_batch_size": 16,  # 2 prompts x 8 completions per micro-batch
    "gradient_accumulation_steps": 4,  # 8 prompts x 8 completions per optimizer step
    "max_completion_length": 256,  # room to reason before the number
    "learning_rate": 1e-5,  # LoRA takes larger steps than full fine-tuning
    "lr_scheduler_type": "cosine",
    "warmup_steps": 0.05,  # a fraction of max_steps
    "max_steps": 500,
    "gradient_checkpointing": True,  # TRL's default; rloo's is False (docs/migrating-from-trl.md)
    "logging_steps": 10,
    "save_steps": 100,
}
LORA = {"tiny": {"r": 8, "lora_alpha": 16}, "gpu": {"r": 16, "lora_alpha": 32}}

NAMES = ["Ann", "Bo", "Cy", "Dee"]
THINGS = ["apples", "books", "coins", "shells"]


def word_problems(n: int, seed: int = 0) -> list[dict[str, object]]:
    """``n`` conversational rows: a user turn asking a counting question, and its ``solution``."""
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    for _ in range(n):
        name, thing, have, change = rng.choice(NAMES), rng.choice(THINGS), rng.randint(5, 60), rng.randint(1, 30)
        if rng.random() < 0.5:
            question, answer = f"{name} has {have} {thing} and gets {change} more.", have + change
        else:
            question, answer = f"{name} has {have + change} {thing} and gives away {change}.", have
        content = f"{question} How many {thing} does {name} have now? End with the number."
        rows.append({"prompt": [{"role": "user", "content": content}], "solution": str(answer)})
    return rows


def ends_with_number(completions: list[list[dict[str, str]]], **kwargs: object) -> list[float]:
    """1.0 when the answer's last word is a number, else 0.0. Conversational prompts give conversational
    completions: each is a list of messages, the last one the model's."""
    return [float(re.search(r"\d+\W*$", completion[-1]["content"]) is not None) for completion in completions]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="Qwen/Qwen2.5-1.5B-Instruct with the GPU settings")
    parser.add_argument("--max-steps", type=int, help="optimizer steps (default: the settings')")
    parser.add_argument("--output-dir", help="run folder (default: a fresh runs/rloo, runs/rloo-2, ...)")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        # the tiny model's weights drawn wider than transformers' 0.02, so that its output depends on the adapter's
        tiny = f"{scratch}/tiny"
        model = "Qwen/Qwen2.5-1.5B-Instruct" if options.gpu else str(save_tiny_model(tiny, initializer_range=0.2))
        settings = dict(GPU if options.gpu else TINY)
        if options.max_steps is not None:
            settings["max_steps"] = options.max_steps
        trainer = RLOOTrainer(
            model=model,
            reward_funcs=[accuracy_reward, ends_with_number],
            args=RLOOConfig(output_dir=options.output_dir, seed=0, **settings),
            train_dataset=word_problems(2000),
            peft_config=LoraConfig(
                **LORA["gpu" if options.gpu else "tiny"], lora_dropout=0.0, target_modules=LINEAR_LAYERS
            ),
        )
        trainer.train()  # writes the run folder: config.yaml, metrics.jsonl, report.html, final/ (the adapter)


if __name__ == "__main__":
    main()
