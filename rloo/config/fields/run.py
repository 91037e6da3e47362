"""The run's identity: its folder, name, seed and algorithm preset.

``preset`` is checked where it is resolved (:meth:`rloo.config.rloo_config.RLOOConfig.__post_init__`), before
every other check, since the algorithm knobs it fills are checked by :mod:`rloo.config.fields.algorithm`.
"""

from __future__ import annotations

from dataclasses import dataclass

from rloo.config.fields.declare import option
from rloo.config.presets import PRESETS


@dataclass
class RunFields:
    """The first fields of ``RLOOConfig``: where the run writes, what it is called, its seed and preset."""

    output_dir: str | None = option(
        None,
        "Run folder: checkpoint-STEP/, config.yaml, metrics.jsonl, the final model. None = a fresh runs/rloo, "
        "runs/rloo-2, ... (printed at start-up; config.yaml records it).",
        trl="output_dir",
    )
    run_name: str | None = option(
        None, "The run's name: printed at start-up and given to W&B; None = output_dir's folder name.", trl="run_name"
    )
    overwrite_output_dir: bool = option(
        False,
        "Allow a fresh run into an output_dir holding an earlier run (its logs are kept renamed, the rest "
        "replaced), or a resume behind newer checkpoints (they are deleted). False refuses, changing nothing.",
        trl="overwrite_output_dir",
    )
    seed: int = option(42, "Seed of the model init, the prompt order and sampling (eval: seed + 1).", trl="seed")
    preset: str = option(
        "trl",
        f"Algorithm preset filling every algorithm knob left None: one of {', '.join(PRESETS)}; trl is the math "
        "of TRL 1.13's RLOOTrainer. An explicit knob wins over the preset (printed at start-up).",
        trl=None,
    )
