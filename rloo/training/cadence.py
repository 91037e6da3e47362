"""When to log, evaluate and checkpoint: ``logging_steps``, transformers' ``eval_strategy`` /
``save_strategy`` (``steps``, ``epoch``, ``no``) over rloo's optimizer steps.

An epoch ends at the step whose generation batch took the last prompt of a pass over the
train dataset (a streaming one's end); the checkpoint it asks for is written at the end of
that generation batch, like every checkpoint, so it resumes exactly.
"""

from __future__ import annotations

from rloo.config import RLOOConfig


def logging_due(args: RLOOConfig, step: int, max_steps: int) -> bool:
    """Whether optimizer step ``step`` (1-based) writes a metrics row: every ``logging_steps``, the last
    step, and step 1 with ``logging_first_step``."""
    every = args.steps("logging_steps", max_steps)
    return step % every == 0 or step == max_steps or (args.logging_first_step and step == 1)


def completions_step(args: RLOOConfig, step: int, max_steps: int) -> int | None:
    """The step a generation batch drawn at ``global_step`` = ``step`` logs its completions under: the
    first optimizer step it trains (``step + 1`` on, ``optimizer_steps_per_generation`` of them) that
    writes a metrics row, so ``completions.jsonl``'s ``step`` is the ``step`` of the ``metrics.jsonl``
    row whose numbers include the batch; None when none of them writes one."""
    last = min(step + args.optimizer_steps_per_generation, max_steps)
    return next((trained for trained in range(step + 1, last + 1) if logging_due(args, trained, max_steps)), None)


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
