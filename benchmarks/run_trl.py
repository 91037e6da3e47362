"""Child process (TRL's virtual environment): run TRL 1.13's RLOOTrainer on one case.

Phases are timed by wrapping TRL's own methods: ``_generate`` (sampling),
``_calculate_rewards`` (scoring), and the no-grad ``_get_per_token_logps_and_entropies``
calls made while scoring (old and reference log-probs); the rest of a step is training.
"""

from __future__ import annotations

import functools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
from common import BenchCase, StepRecord, prompts, reward_sevens, write_result
from datasets import Dataset
from transformers import TrainerCallback
from trl import RLOOConfig, RLOOTrainer

PHASES = {"generate": 0.0, "score": 0.0, "logprobs": 0.0}
TOKENS = {"completion": 0, "prompt": 0}


def timed(phase: str, func: Any) -> Any:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            if phase != "logprobs" or not torch.is_grad_enabled():
                PHASES[phase] += time.perf_counter() - start

    return wrapper


class Timer(TrainerCallback):  # type: ignore[misc]
    def __init__(self) -> None:
        self.last = 0.0
        self.steps: list[StepRecord] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.last:
            self.last = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        seconds = now - self.last
        rest = PHASES["generate"] + PHASES["score"] + PHASES["logprobs"]
        self.steps.append(
            StepRecord(seconds, PHASES["generate"], PHASES["score"], PHASES["logprobs"], seconds - rest, 0, 0)
        )
        for key in PHASES:
            PHASES[key] = 0.0
        self.last = now

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs and "completions/mean_length" in logs and self.steps:
            per_step = args.per_device_train_batch_size
            self.steps[-1].completion_tokens = int(logs["completions/mean_length"] * per_step)


def main() -> None:
    case = BenchCase(**json.loads(sys.argv[2]))
    model_dir, out = sys.argv[1], sys.argv[3]
    RLOOTrainer._generate = timed("generate", RLOOTrainer._generate)
    RLOOTrainer._calculate_rewards = timed("score", RLOOTrainer._calculate_rewards)
    RLOOTrainer._get_per_token_logps_and_entropies = timed("logprobs", RLOOTrainer._get_per_token_logps_and_entropies)
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
        save_strategy="no",
        report_to="none",
        seed=case.seed,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    timer = Timer()
    trainer = RLOOTrainer(
        model=model_dir,
        reward_funcs=reward_sevens,
        args=args,
        train_dataset=Dataset.from_list(prompts(case.num_prompts * case.steps)),
        callbacks=[timer],
    )
    trainer.train()
    params = sum(p.numel() for p in trainer.model.parameters())
    write_result(out, case, "trl", timer.steps, params)


if __name__ == "__main__":
    main()
