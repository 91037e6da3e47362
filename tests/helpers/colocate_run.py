"""Train 3 steps with vLLM colocated (``use_vllm=True``, TRL's default mode) and print what the test checks.

Run by tests/generation/test_vllm.py with ``.venv-vllm``'s Python (vLLM must be importable in the training
process): ``python tests/helpers/colocate_run.py OUT``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rloo import RLOOConfig, RLOOTrainer
from rloo.report import metric_names as names
from rloo.tiny import save_tiny_model


def main(out: Path) -> None:
    model = save_tiny_model(out / "model", hidden_size=64, num_heads=2, max_positions=256)
    trainer = RLOOTrainer(
        model=str(model),
        reward_funcs=lambda completions, **_: [float(c.count("7")) for c in completions],
        args=RLOOConfig(
            output_dir=str(out / "run"),
            use_vllm=True,  # vllm_mode stays TRL's default, colocate
            vllm_max_model_length=256,
            num_generations=4,
            per_device_train_batch_size=8,
            max_completion_length=8,
            learning_rate=1e-2,
            max_steps=3,
            logging_steps=1,
            save_steps=1000,
            report_to=[],
            seed=0,
        ),
        train_dataset=[{"prompt": f"{a}+{b}="} for a in range(5) for b in range(5)],
    )
    trainer.train()
    sampler = trainer.rollout_settings.engine
    logs = [e for e in trainer.state.log_history if names.ENGINE_GAP_MAX in e]
    print(
        "RESULT "
        + json.dumps(
            {
                "mode": trainer.args.vllm_mode,
                "engine": type(sampler.client).__name__,
                "synced_step": sampler.synced_step,
                "last_gap": sampler.last_gap,
                "gaps": [e[names.ENGINE_GAP_MAX] for e in logs],
            }
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
