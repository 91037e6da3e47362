"""``load_best_model_at_end`` with ``metric_for_best_model`` / ``greater_is_better``.

After every evaluation the metric (``eval_reward`` by default; a name without the ``eval_``
prefix gets it, as in transformers) is compared with the best so far; a new best saves the
policy, just evaluated, to ``output_dir/best`` (written to ``tmp-best`` and renamed, so a crash
leaves the old or the new one whole) and records ``best_metric``, ``best_global_step`` and
``best_model_checkpoint`` in the trainer state (checkpointed, so a resumed run keeps them). At the
end of training those weights are loaded back before the final model is saved.

Where we depart from transformers: it points at the checkpoint written at the evaluation step;
rloo writes checkpoints at generation-batch boundaries (so they resume exactly), which may come
after further optimizer steps, so the evaluated weights are saved on their own instead. The
``best`` folder is not a checkpoint, so ``save_total_limit`` never rotates it away.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rloo.training.checkpointing.checkpoints import full_weights, load_model_weights


def metric_name(args: Any) -> str:
    """``metric_for_best_model`` with transformers' ``eval_`` prefix (default ``eval_reward``)."""
    name = args.metric_for_best_model or "reward"
    return name if name.startswith("eval_") else f"eval_{name}"


def is_better(value: float, best: float | None, greater: bool) -> bool:
    return best is None or (value > best if greater else value < best)


class BestModel:
    """Tracks the best evaluation of one run; does nothing unless ``args.load_best_model_at_end``."""

    def __init__(self, *, args: Any, output_dir: Path) -> None:
        self.enabled = bool(args.load_best_model_at_end)
        self.metric = metric_name(args)
        # transformers' default: greater is better unless the metric is a loss
        self.greater = args.greater_is_better if args.greater_is_better is not None else "loss" not in self.metric
        self.folder = output_dir / "best"

    def observe(
        self,
        best_so_far: float | None,
        logs: dict[str, float],
        write: Callable[[Path], Any],
        on_main: Callable[[Any], Any],
    ) -> float | None:
        """Compare an evaluation's ``logs`` with ``best_so_far`` (None: no evaluation yet); a new best is
        written with ``write(folder)`` on the main process (``on_main``) and returned, else None."""
        if not self.enabled:
            return None
        if self.metric not in logs:
            raise ValueError(
                f"RLOOConfig.metric_for_best_model reads {self.metric!r}, which evaluation does not log; "
                f"choose one of {sorted(k for k in logs if k.startswith('eval_'))}"
            )
        value = float(logs[self.metric])
        if not is_better(value, best_so_far, self.greater):
            return None
        on_main(lambda: self._replace(write))
        return value

    def track(
        self, state: Any, logs: dict[str, float], model: Any, write: Callable[..., Any], on_main: Callable[[Any], Any]
    ) -> None:
        """:meth:`observe` an evaluation and record a new best in the trainer ``state`` (``best_metric``,
        ``best_global_step``, ``best_model_checkpoint``). ``model``'s full weights are gathered on every process
        (sharded under FSDP) and a new best is written with ``write(folder, weights=...)``."""
        weights = full_weights(model) if self.enabled else None
        best = self.observe(state.best_metric, logs, lambda folder: write(folder, weights=weights), on_main)
        if best is not None:
            state.best_metric, state.best_global_step = best, state.global_step
            state.best_model_checkpoint = str(self.folder)

    def _replace(self, write: Callable[[Path], Any]) -> None:
        tmp = self.folder.with_name("tmp-best")
        if tmp.exists():
            shutil.rmtree(tmp)
        write(tmp)
        if self.folder.exists():
            shutil.rmtree(self.folder)
        os.replace(tmp, self.folder)

    def restore(self, model: Any, state: Any) -> bool:
        """Load the best weights into ``model`` (when there are any); True if it did."""
        if not self.enabled or state.best_model_checkpoint is None:
            return False
        load_model_weights(model, Path(state.best_model_checkpoint))
        return True
