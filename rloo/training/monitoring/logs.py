"""Where metrics go: the trainer state's history and ``metrics.jsonl`` (trackers:
:mod:`rloo.training.monitoring.trackers`; callbacks: :mod:`rloo.training.callbacks`)."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console

from rloo.report import metric_names as names
from rloo.training.state import TrainerState


def log_console(stderr: bool = False, quiet: bool = False) -> Console:
    """A rich console for logs: in a terminal lines wrap at its width; piped (``tee``, a
    scheduler's log file) a line stays one line, where rich would hard-wrap it at 80 columns."""
    console = Console(stderr=stderr, quiet=quiet)
    console.soft_wrap = not console.is_terminal
    return console


def train_summary(state: TrainerState, runtime: float, steps: int, completions_per_step: int) -> dict[str, float]:
    """The end-of-training entry transformers' Trainer logs: ``train_loss`` (the mean loss of every
    step, resumed runs included), and over this call's ``steps`` and ``runtime`` seconds
    ``train_runtime``, ``train_samples_per_second`` (completions, every process's) and
    ``train_steps_per_second``."""
    return {
        "train_runtime": runtime,
        "train_samples_per_second": steps * completions_per_step / max(runtime, 1e-9),
        "train_steps_per_second": steps / max(runtime, 1e-9),
        "train_loss": state.total_loss / max(state.global_step, 1),
    }


def mean_metrics(window: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over the steps in ``window`` (NaN values ignored)."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for metrics in window:
        for key, value in metrics.items():
            if value is not None and not math.isnan(value):
                sums[key] += value
                counts[key] += 1
    return {key: sums[key] / counts[key] for key in sums}


class MetricsSink:
    """Writes logs to ``output_dir/metrics.jsonl`` (the report reads it); trackers get a copy
    through :mod:`rloo.training.monitoring.trackers`."""

    def __init__(self, output_dir: Path, enabled: bool = True) -> None:
        """``enabled=False`` (every process but the main one) writes nothing."""
        self.path = output_dir / "metrics.jsonl"
        self.enabled = enabled

    def rewrite(self, history: list[dict[str, float]]) -> None:
        """Replace ``metrics.jsonl`` with ``history`` (after resuming from a checkpoint)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(json.dumps(row) + "\n" for row in history))

    def write(self, logs: dict[str, float]) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(json.dumps(logs) + "\n")


def device_text(device: Any, mixed_precision: str, sharded: bool) -> str:
    """Where a run trains, for its start-up line: ``cpu (fp32)``, ``cuda:0 (bf16, FSDP2)``
    (accelerate's ``mixed_precision`` says ``no`` for full precision)."""
    precision = {"no": "fp32"}.get(mixed_precision, mixed_precision)
    return f"{device} ({precision}{', FSDP2' if sharded else ''})"


def announce(console: Any, args: Any, accelerator: Any, model: Any, max_steps: int, ranks: Any) -> None:
    """The run's first lines: the algorithm's formulas, then the model, the device and the plan of steps, and the
    defaults left as rloo's where they differ from TRL's (:mod:`rloo.config.trl.defaults`)."""
    from rloo.config.trl.defaults import start_up_note
    from rloo.training.setup.models import count_parameters

    console.print(args.describe_algorithm())
    from rloo.training.parallel.fsdp import is_sharded

    # sharded: over several processes, or over one to offload its parameters
    where = device_text(accelerator.device, accelerator.mixed_precision, is_sharded(model))
    console.print(run_summary(args, count_parameters(model), where, max_steps, ranks.world_size))
    note = start_up_note(args, accelerator.mixed_precision)
    if note is not None:
        console.print(note, highlight=False, markup=False)


def run_summary(args: Any, parameters: tuple[int, int], where: str, max_steps: int, world_size: int = 1) -> str:
    """The start-up line: parameters, device, the batch shape (over every process) and the run folder."""
    trainable, total = parameters
    prompts = f"{args.prompts_per_generation} prompts"
    if world_size > 1:
        prompts = f"{world_size} processes x {prompts} = {world_size * args.prompts_per_generation} prompts"
    name = args.run_name or Path(args.output_dir).name
    per_generation = "per generation"
    if getattr(args, "dynamic_sampling", False):
        per_generation += f" (dynamic sampling: groups with a signal, up to {args.max_num_gen_batches} rounds)"
    return (
        f"run {name}: {trainable:,} trainable / {total:,} parameters on {where}; {max_steps} steps of "
        f"{prompts} x {args.num_generations} completions {per_generation}; run folder {args.output_dir}"
    )


# below this a console number is float rounding of a 0 (a group's equal rewards give reward_std ~4e-9; the
# policy-gradient loss is ~0 by construction, its advantages summing to 0): shown as 0, kept exact in metrics.jsonl
CONSOLE_ZERO = 1e-6


def console_number(value: float) -> str:
    """``value`` for the console: 4 significant digits, or ``0`` when its magnitude is below :data:`CONSOLE_ZERO`."""
    return "0" if abs(value) < CONSOLE_ZERO else f"{value:.4g}"


def log_line(step: int, max_steps: int, logs: dict[str, float]) -> str:
    """The console line of a log: ``step 10/100 reward=0.5 kl=0.01 ...``; the end-of-training
    entry (:func:`train_summary`) as ``trained to step 100/100 in 12.3 s, train_loss=...``."""
    if "train_runtime" in logs:  # it holds none of a step's metrics: never a bare "step 100/100"
        return (
            f"trained to step {step}/{max_steps} in {logs['train_runtime']:.1f} s "
            f"({logs['train_steps_per_second']:.3g} steps/s), train_loss={console_number(logs['train_loss'])}"
        )
    shown = (names.REWARD, names.REWARD_STD, names.KL, names.LOSS, names.ENTROPY, names.MEAN_LENGTH, names.EVAL_REWARD)
    return f"step {step}/{max_steps} " + " ".join(f"{k}={console_number(logs[k])}" for k in shown if k in logs)


class RunWarnings:
    """Each warning once: printed, and appended to ``output_dir/warnings.log`` (the report shows it)."""

    def __init__(self, output_dir: Path, console: Any, write: bool = True) -> None:
        self.path, self.console, self.write = output_dir / "warnings.log", console, write
        self._seen: set[str] = set()

    def warn(self, message: str, step: int) -> None:
        if message in self._seen:
            return
        self._seen.add(message)
        self.console.print(f"[yellow]warning:[/yellow] {message}", highlight=False)
        if not self.write:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as handle:
            handle.write(f"step {step}: {message}\n")
