"""RLOO on arithmetic questions, in TRL's style: a dataset of prompts with a ``solution`` column, a built-in
reward and one of your own, ``RLOOConfig`` and ``RLOOTrainer``.

  python examples/rloo_arithmetic.py          # offline: a tiny random model built here; under a minute on a CPU
  python examples/rloo_arithmetic.py --gpu    # the same run at size: Qwen/Qwen2.5-0.5B-Instruct on one GPU

Offline, the tiny model knows no arithmetic: watch ``reward`` rise from about 0.1 to about 0.5 in 150 steps as it
learns to answer with digits only (``number_only``; the accuracy stays near 0). Near the end the health monitor may
warn of a KL explosion: the tiny model has moved far from where it started, which is what that monitor watches for
(docs/reliability.md). With ``--gpu`` it downloads the model from the hub (the only thing it needs the network for)
and trains all its weights (no LoRA) in bf16 autocast, with the one-card settings of docs/installation.md's "GPU
set-up": ``rloo plan`` puts the peak at 12 GiB (13.5 with the CUDA context, for 64-token prompts), so a 24 GB card
holds it. The GPU version has not been run by the tests (they have neither a GPU nor the network). The run folder
(``runs/rloo``, ``runs/rloo-2``, ... or ``--output-dir``) holds ``report.html``, ``metrics.jsonl`` and the trained
model in ``final/``.
"""

from __future__ import annotations

import argparse
import random
import tempfile

from rloo import RLOOConfig, RLOOTrainer
from rloo.rewards import accuracy_reward
from rloo.tiny import save_tiny_model

# The settings that change with the model's size; every other setting is the same in both runs.
TINY = {
    "num_generations": 4,  # K completions per prompt
    "per_device_train_batch_size": 32,  # completions per micro-batch: 8 prompts x 4
    "max_completion_length": 8,
    "learning_rate": 2e-3,  # a random 2-layer model moves fast
    "max_steps": 150,
    "logging_steps": 15,
    "eval_steps": 75,  # evaluation on the held-out questions: eval_reward in the log and the report
}
GPU = {
    "num_generations": 8,
    "per_device_train_batch_size": 32,  # 4 prompts x 8 completions per micro-batch
    "gradient_accumulation_steps": 2,  # 8 prompts x 8 completions per optimizer step
    "max_completion_length": 128,
    "learning_rate": 1e-6,  # full fine-tuning of an instruction-tuned model: small steps
    "max_steps": 300,
    "gradient_checkpointing": True,  # TRL's default; rloo's is False (docs/migrating-from-trl.md)
    "logging_steps": 10,
    "eval_steps": 100,
    "save_steps": 100,
}


def questions(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` two-digit sums and products as TRL-style rows: a text ``prompt`` and its ``solution``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b, op = rng.randint(10, 99), rng.randint(2, 99), rng.choice("+*")
        answer = a + b if op == "+" else a * b
        rows.append({"prompt": f"What is {a} {op} {b}? Answer with the number only.\n", "solution": str(answer)})
    return rows


def number_only(completions: list[str], **kwargs: object) -> list[float]:
    """1.0 for a completion that is a number and nothing else; otherwise the share of its characters that are
    digits, halved (a reward function: one float per completion, ``None`` where it does not apply)."""
    rewards = []
    for completion in completions:
        text = completion.strip()
        if text.isdigit():
            rewards.append(1.0)
        else:
            rewards.append(0.5 * sum(ch.isdigit() for ch in text) / max(1, len(text)))
    return rewards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="Qwen/Qwen2.5-0.5B-Instruct with the GPU settings")
    parser.add_argument("--max-steps", type=int, help="optimizer steps (default: the settings')")
    parser.add_argument("--output-dir", help="run folder (default: a fresh runs/rloo, runs/rloo-2, ...)")
    options = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        model = "Qwen/Qwen2.5-0.5B-Instruct" if options.gpu else str(save_tiny_model(f"{scratch}/tiny", hidden_size=64))
        settings = dict(GPU if options.gpu else TINY)
        if options.max_steps is not None:
            settings["max_steps"] = options.max_steps
        args = RLOOConfig(output_dir=options.output_dir, seed=0, **settings)
        trainer = RLOOTrainer(
            model=model,
            reward_funcs=[accuracy_reward, number_only],
            args=args,
            train_dataset=questions(2000),
            eval_dataset=questions(64, seed=1),
        )
        trainer.train()  # writes the run folder: config.yaml, metrics.jsonl, report.html, final/


if __name__ == "__main__":
    main()
