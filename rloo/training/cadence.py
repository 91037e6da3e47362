"""When to evaluate and checkpoint: transformers' ``eval_strategy`` / ``save_strategy``
(``steps``, ``epoch``, ``no``) over rloo's optimizer steps.

An epoch ends at the step whose generation batch took the last prompt of a pass over the
train dataset (a streaming one's end); the checkpoint it asks for is written at the end of
that generation batch, like every checkpoint, so it resumes exactly.
"""

from __future__ import annotations

from rloo.config import RLOOConfig


def evaluation_due(args: RLOOConfig, step: int, max_steps: int, epoch_ended: bool) -> bool:
    strategy = args.evaluation_strategy
    if strategy == "steps":
        every = args.steps("eval_steps", max_steps)
        return every > 0 and step % every == 0
    return strategy == "epoch" and epoch_ended


def checkpoint_due(args: RLOOConfig, step: int, max_steps: int, epoch_ended: bool) -> bool:
    if args.save_strategy == "steps":
        return step % args.steps("save_steps", max_steps) == 0
    return args.save_strategy == "epoch" and epoch_ended


def evaluation_setting(args: RLOOConfig) -> str | None:
    """The setting that asks for evaluation, as ``field=value`` (for an error naming it), or None."""
    if args.evaluation_strategy == "steps":
        return f"eval_steps={args.eval_steps}"
    return None if args.evaluation_strategy == "no" else f"eval_strategy={args.evaluation_strategy!r}"
