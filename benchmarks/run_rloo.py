"""Child process: run rloo on one benchmark case and write per-step timings as JSON."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch
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

from rloo import RLOOConfig, RLOOTrainer


class Timer:
    def __init__(self, counter: FlopCounter) -> None:
        self.last, self.flops, self.rss = 0.0, 0.0, 0.0
        self.counter = counter
        self.steps: list[StepRecord] = []

    def on_train_begin(self, trainer: Any) -> None:
        self.counter.attach(trainer.unwrapped_model)
        self.counter.attach(trainer.ref_model)
        self.rss = current_rss_mib()
        self.last = time.perf_counter()

    def on_log(self, trainer: Any, logs: dict[str, float]) -> None:
        if "timing/generate" not in logs:  # the run's summary at the end
            return
        now = time.perf_counter()
        rows = trainer.args.completions_per_generation
        self.steps.append(
            StepRecord(
                seconds=now - self.last,
                generate=logs["timing/generate"],
                score=logs["timing/score"],
                logprobs=logs["timing/logprobs"],
                train=logs["timing/update"],
                completion_tokens=round(logs["completions/mean_length"] * rows),
                prompt_tokens=int(logs["num_tokens"]),
                flops=self.counter.flops - self.flops,
                mean_length=logs["completions/mean_length"],
                clipped_ratio=logs["completions/clipped_ratio"],
            )
        )
        self.last, self.flops = now, self.counter.flops


def count_fused_head(counter: FlopCounter) -> None:
    """The fused LM head (a CPU's default) multiplies by the head's weight without calling the head module, whose
    hook counts the chunked head: count its rows here (forward, and 3 more in a backward that recomputes), as
    ``run_trl.py`` counts TRL 1.16's."""
    try:
        from rloo.forward import fused_head
    except ImportError:  # an older rloo (an A/B run): its head calls the module
        return
    function = getattr(fused_head, "_FusedHead", None)
    if function is None:
        return
    original = function.apply

    def apply(hidden: Any, weight: Any, *args: Any) -> Any:
        grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
        counter.flops += 2.0 * weight.numel() * hidden.shape[0] * (4 if grad else 1)
        return original(hidden, weight, *args)

    function.apply = apply


def main() -> None:
    case = BenchCase(**json.loads(sys.argv[2]))
    model_dir, out = sys.argv[1], sys.argv[3]
    options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    timer = Timer(FlopCounter())
    count_fused_head(timer.counter)
    args = RLOOConfig(
        output_dir=tempfile.mkdtemp(),
        num_generations=case.num_generations,
        per_device_train_batch_size=case.num_prompts * case.num_generations,
        max_completion_length=case.max_completion_length,
        max_prompt_length=None,
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
        train_dataset=prompts(case.num_prompts * case.steps, case.prompt_chars),
        callbacks=[timer],
    )
    trainer.console.quiet = True
    trainer.train()
    total, head, body = model_sizes(trainer.unwrapped_model)
    prompt_length = len(trainer.processing_class(prompts(1, case.prompt_chars)[0]["prompt"])["input_ids"])
    write_result(out, case, "rloo", timer.steps, RunInfo(total, head, body, prompt_length, timer.rss))


if __name__ == "__main__":
    main()
