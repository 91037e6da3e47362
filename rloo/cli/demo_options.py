"""The sizes both offline demos take (``rloo demo``, ``rloo demo-tools``), checked before the warm start so a
typo costs no minutes; each demo's options add their own (:class:`rloo.cli.demo.DemoOptions`,
:class:`rloo.cli.tool_demo.ToolDemoOptions`)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DemoSizes:
    steps: int
    num_generations: int
    prompts_per_step: int
    learning_rate: float
    warm_start_steps: int
    hidden_size: int = 128
    num_layers: int = 2
    seed: int = 0
    output_dir: str = "runs/demo"

    def __post_init__(self) -> None:
        for option, value, minimum in (
            ("--steps", self.steps, 1),
            ("--num-generations", self.num_generations, 2),
            ("--prompts-per-step", self.prompts_per_step, 1),
            ("--warm-start-steps", self.warm_start_steps, 1),
            ("--hidden-size", self.hidden_size, 4),
            ("--num-layers", self.num_layers, 1),
        ):
            if value < minimum:
                raise ValueError(f"{option}={value} is invalid: it must be >= {minimum}")
        if self.hidden_size % 4:
            raise ValueError(
                f"--hidden-size={self.hidden_size} is invalid: it must be a multiple of 4 (attention heads)"
            )
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"--learning-rate={self.learning_rate} is invalid: it must be a finite number > 0")
