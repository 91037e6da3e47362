"""Child process: run rloo on one benchmark case and write per-step timings as JSON."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BenchCase, StepRecord, prompts, reward_sevens, write_result

from rloo import RLOOConfig, RLOOTrainer


class Timer:
    def __init__(self) -> None:
        self.last = 0.0
        self.steps: list[StepRecord] = []

    def on_train_begin(self, trainer: Any) -> None:
        self.last = time.perf_counter()

    def on_log(self, trainer: Any, logs: dict[str, float]) -> None:
        now = time.perf_counter()
        self.steps.append(
            StepRecord(
                seconds=now - self.last,
                generate=logs["timing/generate"],
                score=logs["timing/score"],
                logprobs=logs["timing/reference"],
                train=logs["timing/train"],
                completion_tokens=int(logs["completions/mean_length"] * trainer.args.completions_per_generation),
                prompt_tokens=int(logs["num_tokens"]),
            )
        )
        self.last = now


def main() -> None:
    case = BenchCase(**json.loads(sys.argv[2]))
    model_dir, out = sys.argv[1], sys.argv[3]
    options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    timer = Timer()
    args = RLOOConfig(
        output_dir=tempfile.mkdtemp(),
        num_generations=case.num_generations,
        per_device_train_batch_size=case.num_prompts * case.num_generations,
        max_completion_length=case.max_completion_length,
        learning_rate=1e-5,
        beta=0.05,
        temperature=1.0,
        max_steps=case.steps,
        logging_steps=1,
        save_steps=10_000,
        seed=case.seed,
        bf16=False,
        **options,
    )
    trainer = RLOOTrainer(
        model=model_dir,
        reward_funcs=reward_sevens,
        args=args,
        train_dataset=prompts(case.num_prompts * case.steps),
        callbacks=[timer],
    )
    trainer.console.quiet = True
    trainer.train()
    params = sum(p.numel() for p in trainer.unwrapped_model.parameters())
    write_result(out, case, "rloo", timer.steps, params)


if __name__ == "__main__":
    main()
