"""A training run with tools, launched by ``tests/tools/test_episodes.py`` under ``torchrun`` (2 processes) or
plain ``python`` (one): the same global batch either way, so the same episodes (each is seeded by its group),
the same weights and metrics. ``python tests/helpers/tool_runs.py OUT`` writes ``OUT/weights.safetensors`` and
``OUT/metrics.json`` from the main process; with LoRA adapters, and an evaluation after each step."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from peft import LoraConfig
from safetensors.torch import save_file

from rloo import RLOOConfig, RLOOTrainer
from tests.helpers.tools import multiply, question, taught_model, tool_tokenizer


def product(completions: list[Any], a: list[int], b: list[int], **_: Any) -> list[float]:
    return [float(c[-1]["content"].strip() == str(x * y)) for c, x, y in zip(completions, a, b, strict=True)]


def main(out: Path) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rows = [{"prompt": question(a, b), "a": a, "b": b} for a, b in [(3, 4), (2, 5), (3, 4), (2, 5)] * 2]
    args = RLOOConfig(
        output_dir=str(out / f"world{world}"),
        num_generations=2,
        per_device_train_batch_size=8 // world,
        max_completion_length=120,
        max_tool_calling_iterations=2,
        temperature=1.1,
        learning_rate=3e-3,
        max_steps=2,
        logging_steps=1,
        eval_steps=1,
        sampler_compaction=None,
        report_to=[],
        seed=0,
    )
    trainer = RLOOTrainer(
        taught_model(),
        product,
        args=args,
        train_dataset=rows,
        eval_dataset=rows[:3],
        processing_class=tool_tokenizer(),
        tools=[multiply],
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    )
    trainer.train()
    if trainer.ranks.is_main:
        weights = {k: v.contiguous() for k, v in trainer.unwrapped_model.state_dict().items() if "lora_" in k}
        save_file(weights, str(out / "weights.safetensors"))
        (out / "metrics.json").write_text(json.dumps(trainer.state.log_history[:-1]))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
