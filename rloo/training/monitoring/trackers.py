"""Experiment trackers (``report_to``) through accelerate's tracker integrations.

Every tracker accelerate ships works (the one list: :data:`rloo.config.fields.reporting.TRACKERS`), and so
does a class registered with ``accelerate.tracking.register_tracker_class``: rloo writes no tracker code of
its own. What rloo adds on top:

- names as TRL logs them (transformers' ``rewrite_logs``): ``eval_x`` -> ``eval/x``, everything
  else ``train/x`` (``reward`` -> ``train/reward``, ``eval_rewards/acc/mean`` -> ``eval/rewards/acc/mean``);
- the run's resolved config as the tracker's hyperparameters, flattened to the scalars every
  tracker takes (nested keys joined with ``.``; lists, tuples and None written as text);
- a tracker whose package is missing is an error naming the package (accelerate alone skips it
  with a debug message, so a run would go untracked without a word);
- W&B runs offline unless credentials or ``WANDB_MODE`` say otherwise (no network: no hang).

``metrics.jsonl`` stays the run's own record (the report reads it); trackers get a copy.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rloo.config.fields.reporting import TRACKERS

PROJECT = "rloo"  # accelerate's project_name: wandb/trackio project, tensorboard sub-folder


def registered_trackers() -> list[str]:
    """Names accelerate knows: its own trackers and any registered with ``register_tracker_class``."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    return list(LOGGER_TYPE_TO_CLASS)


def tracker_names(report_to: Sequence[str]) -> list[str]:
    """The trackers to start: ``report_to`` without ``none``; ``all`` -> every installed one
    (accelerate's ``get_available_trackers``), as transformers reads ``report_to="all"``.
    A named tracker whose package is not installed raises ``ValueError`` naming the package."""
    from accelerate.tracking import get_available_trackers

    available = [str(name) for name in get_available_trackers()]
    names: list[str] = []
    for name in report_to:
        if name == "none":
            continue
        wanted = available if name == "all" else [name]
        names += [tracker for tracker in wanted if tracker not in names]
    for name in names:
        if name in TRACKERS and name not in available:
            package = TRACKERS[name]
            raise ValueError(
                f"report_to includes {name!r} but the {package} package is not installed: pip install {package} "
                "(or remove it from report_to; metrics.jsonl is written either way)"
            )
    return names


def tracker_key(key: str) -> str:
    """TRL's metric name: ``eval_reward`` -> ``eval/reward``, ``test_x`` -> ``test/x``, ``reward`` ->
    ``train/reward`` (transformers' ``rewrite_logs``)."""
    for prefix in ("eval", "test"):
        if key.startswith(prefix + "_"):
            return f"{prefix}/{key[len(prefix) + 1 :]}"
    return f"train/{key}"


def tracked_values(logs: Mapping[str, float]) -> dict[str, float]:
    """A log entry as trackers get it: TRL's names, without the ``step`` (passed apart) and without
    values that are not numbers."""
    return {
        tracker_key(key): float(value)
        for key, value in logs.items()
        if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
    }


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """The run's config as hyperparameters: ``{"peft": {"r": 8}}`` -> ``{"peft.r": 8}``; lists,
    tuples and None as their text (TensorBoard's hparams take scalars and strings only)."""
    flat: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_config(value, prefix=f"{name}."))
        elif isinstance(value, bool | int | str) or (isinstance(value, float) and math.isfinite(value)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def init_kwargs(names: Sequence[str], run_name: str, output_dir: Path) -> dict[str, dict[str, Any]]:
    """Per-tracker keyword arguments: the run's name where the tracker takes one; W&B offline
    without credentials (it would otherwise wait on the network)."""
    kwargs: dict[str, dict[str, Any]] = {}
    if "wandb" in names:
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        kwargs["wandb"] = {"name": run_name, "dir": str(output_dir), "mode": mode}
    if "trackio" in names:
        kwargs["trackio"] = {"name": run_name}
    if "mlflow" in names:
        kwargs["mlflow"] = {"run_name": run_name}
    return kwargs


def accelerator_with_trackers(mixed_precision: str, report_to: Sequence[str]) -> tuple[Any, Trackers]:
    """The run's ``Accelerator`` (CPU processes under a launcher without CUDA: see
    :func:`rloo.training.parallel.distributed.cpu_processes`) with the ``report_to`` trackers; TensorBoard
    writes under ``output_dir/tensorboard`` (set by :meth:`Trackers.start`: a fresh run folder is
    chosen once the processes are known, after the accelerator)."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    from rloo.training.parallel.distributed import cpu_processes

    names = tracker_names(report_to)
    accelerator = Accelerator(
        mixed_precision=mixed_precision,
        cpu=cpu_processes(),
        log_with=names or None,
        project_config=ProjectConfiguration(logging_dir="tensorboard"),  # accelerate wants one now; start() sets it
    )
    return accelerator, Trackers(accelerator, names)


class Trackers:
    """The run's trackers on ``accelerator`` (created with ``log_with=tracker_names(report_to)``):
    started once the run folder is ready, given every log entry, finished at the end. accelerate
    runs them on the main process only."""

    def __init__(self, accelerator: Any, names: Sequence[str]) -> None:
        self.accelerator, self.names = accelerator, list(names)

    def start(self, config: Mapping[str, Any], run_name: str, output_dir: Path) -> None:
        """Start the trackers with ``config`` (the run file as ``config.yaml`` records it) as
        hyperparameters, writing under the run folder ``output_dir``."""
        if not self.names:
            return
        self.accelerator.trackers = []  # a second train() starts them afresh
        project = self.accelerator.project_configuration
        project.project_dir, project.logging_dir = str(output_dir), str(output_dir / "tensorboard")
        self.accelerator.init_trackers(
            PROJECT, config=flat_config(config), init_kwargs=init_kwargs(self.names, run_name, output_dir)
        )

    def log(self, logs: Mapping[str, float], step: int) -> None:
        if self.names:
            self.accelerator.log(tracked_values(logs), step=step)

    def finish(self) -> None:
        """Close every tracker (not ``accelerator.end_training()``: it also destroys the process group)."""
        for tracker in self.accelerator.trackers:
            tracker.finish()
        self.accelerator.trackers = []
