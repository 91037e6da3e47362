"""Child process (a TRL virtual environment): run TRL's RLOOTrainer (1.13 or 1.16) on one case.

Phases are timed by wrapping TRL's own methods: ``_generate`` (sampling),
``_calculate_rewards`` (scoring), and the no-grad ``_get_per_token_logps_and_entropies``
calls made while scoring (old and reference log-probs); the rest of a step is training.
TRL 1.16's fused LM head multiplies by ``lm_head.weight`` directly (no module call), so its
FLOPs are counted by wrapping that function (:class:`common.FlopCounter` counts the rest).
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
import trl
from common import (
    BenchCase,
    FlopCounter,
    RunInfo,
    StepRecord,
    current_rss_mib,
    model_sizes,
    prompts,
    reward_sevens,
    write_result,
)
from datasets import Dataset
from transformers import TrainerCallback
from trl import RLOOConfig, RLOOTrainer

PHASES = {"generate": 0.0, "score": 0.0, "logprobs": 0.0}
COUNTER = FlopCounter()


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


def count_fused_head() -> None:
    """TRL >= 1.16: count the fused head's rows (forward, and 3 more in a backward that recomputes)."""
    try:
        from trl.trainer import utils
    except ImportError:
        return
    function = getattr(utils, "_ChunkedLogProbFunction", None)
    if function is None:
        return
    original = function.apply

    def apply(hidden: torch.Tensor, weight: torch.Tensor, *args: Any) -> Any:
        grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
        COUNTER.flops += 2.0 * weight.numel() * hidden.shape[0] * (4 if grad else 1)
        return original(hidden, weight, *args)

    function.apply = apply


class Timer(TrainerCallback):  # type: ignore[misc]
    def __init__(self) -> None:
        self.last, self.flops, self.rss = 0.0, 0.0, 0.0
        self.steps: list[StepRecord] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.rss = current_rss_mib()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.last:
            self.last = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        seconds = now - self.last
        rest = PHASES["generate"] + PHASES["score"] + PHASES["logprobs"]
        self.steps.append(
            StepRecord(
                seconds,
                PHASES["generate"],
                PHASES["score"],
                PHASES["logprobs"],
                seconds - rest,
                0,
                0,
                flops=COUNTER.flops - self.flops,
            )
        )
        for key in PHASES:
            PHASES[key] = 0.0
        self.last, self.flops = now, COUNTER.flops

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs and "completions/mean_length" in logs and self.steps:
            step = self.steps[-1]
            step.mean_length = logs["completions/mean_length"]
            step.clipped_ratio = logs.get("completions/clipped_ratio", 0.0)
            step.completion_tokens = round(step.mean_length * args.per_device_train_batch_size)


def main() -> None:
    case = BenchCase(**json.loads(sys.argv[2]))
    model_dir, out = sys.argv[1], sys.argv[3]
    RLOOTrainer._generate = timed("generate", RLOOTrainer._generate)
    RLOOTrainer._calculate_rewards = timed("score", RLOOTrainer._calculate_rewards)
    RLOOTrainer._get_per_token_logps_and_entropies = timed("logprobs", RLOOTrainer._get_per_token_logps_and_entropies)
    count_fused_head()
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
        train_dataset=Dataset.from_list(prompts(case.num_prompts * case.steps, case.prompt_chars)),
        callbacks=[timer],
    )
    COUNTER.attach(trainer.model)
    COUNTER.attach(trainer.ref_model)
    trainer.train()
    total, head, body = model_sizes(trainer.model)
    prompt_length = len(trainer.processing_class(prompts(1, case.prompt_chars)[0]["prompt"])["input_ids"])
    info = RunInfo(total, head, body, prompt_length, timer.rss, {"trl": trl.__version__})
    write_result(out, case, f"trl-{trl.__version__}", timer.steps, info)


if __name__ == "__main__":
    main()
