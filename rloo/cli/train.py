"""``rloo train``: build the trainer from a checked :class:`rloo.cli.run_file.RunSpec` and run it."""

from __future__ import annotations

from typing import Any

from rloo.cli.run_file import RunSpec, build_peft_config
from rloo.rewards.builtins import resolve_reward


def build_trainer(spec: RunSpec) -> Any:
    """An ``RLOOTrainer`` for the run file; the resolved run file becomes its ``config.yaml``."""
    from rloo.training.trainer import RLOOTrainer

    trainer = RLOOTrainer(
        model=spec.model,
        reward_funcs=[resolve_reward(r) for r in spec.reward_funcs],
        args=spec.config,
        train_dataset=spec.dataset.load(),
        eval_dataset=None if spec.eval_dataset is None else spec.eval_dataset.load(),
        peft_config=None if spec.peft is None else build_peft_config(spec.peft),
    )
    trainer.run_config = spec.to_dict()
    return trainer


def train_from_spec(spec: RunSpec, resume: bool, console: Any) -> Any:
    """Train; afterwards (re)build the run report."""
    from rloo.cli.report import build_report

    trainer = build_trainer(spec)
    trainer.train(resume_from_checkpoint=True if resume else None)
    path = build_report(spec.config.output_dir)
    console.print(f"done: model in {trainer.output_dir / 'final'}, report in {path}", highlight=False)
    return trainer
