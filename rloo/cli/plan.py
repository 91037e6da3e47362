"""``rloo plan``: the memory plan of a run file (or TRL flags) on a device, before renting it.

Reads the run file's config and ``peft:``, and the model's ``config.json`` only (a local folder, a
``config.json`` file, or a hub id already in the local cache: no weights are read), then prints
:func:`rloo.training.setup.memory_plan.plan_memory`'s phases, the peak, whether it fits the device,
and the single changes that would make it fit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from rloo.training.setup.memory_plan import (
    CUDA_OVERHEAD,
    GiB,
    MemoryPlan,
    ModelShape,
    Workload,
    device_bytes,
    fits,
    fixes,
    plan_memory,
)


def load_model_config(model: str) -> Any:
    """A transformers config from a folder, a ``config.json`` file or a cached hub id (never weights)."""
    from transformers import AutoConfig, PretrainedConfig

    path = Path(model)
    try:
        if path.is_file():
            return AutoConfig.for_model(**PretrainedConfig.get_config_dict(str(path))[0])
        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(
            f"model {model!r}: no readable config.json ({str(error).splitlines()[0]}); give a model folder, its "
            "config.json, or a hub id in the local cache (rloo plan reads no weights)"
        ) from None


def plan_run(run_file: Any, prompt_length: int | None, shards: int = 1) -> tuple[ModelShape, Workload, MemoryPlan]:
    """The memory plan of a checked run file (:class:`rloo.cli.run_file.RunFile`)."""
    from rloo.cli.run_file import build_peft_config

    args = run_file.config
    length = prompt_length or args.max_prompt_length
    if not length:
        raise ValueError(
            "the prompt length is unknown: set max_prompt_length in the run file or give --prompt-length (tokens)"
        )
    lora = None if run_file.peft is None else build_peft_config(run_file.peft)
    shape = ModelShape.from_config(load_model_config(run_file.model))
    work = Workload.from_config(args, length, lora, shards)
    return shape, work, plan_memory(shape, work)


def _size(value: float) -> str:
    return f"{value / GiB:,.2f} GiB" if value >= GiB / 10 else f"{value / 2**20:,.1f} MiB"


def plan_table(plan: MemoryPlan) -> Table:
    table = Table(title="Predicted peak memory per phase (tensors allocated, worst-case lengths)")
    table.add_column("phase")
    table.add_column("peak", justify="right")
    table.add_column("made of")
    for phase in plan.phases:
        parts = ", ".join(f"{name} {_size(value)}" for name, value in phase.parts.items() if value > 0)
        marker = " (peak)" if phase is plan.peak else ""
        table.add_row(phase.name + marker, _size(phase.total), parts)
    return table


def verdict(shape: ModelShape, work: Workload, plan: MemoryPlan, device: str) -> list[str]:
    """Lines saying whether the plan fits ``device`` and, if not, what would."""
    capacity, cuda = device_bytes(device)
    need = plan.peak.total + (CUDA_OVERHEAD if cuda else 0.0)
    overhead = f" + {_size(CUDA_OVERHEAD)} CUDA context and allocator slack" if cuda else ""
    head = f"{device}: {_size(capacity)}; the peak ({plan.peak.name}) needs {_size(plan.peak.total)}{overhead}"
    if fits(plan, capacity, cuda):
        return [f"{head}: fits, {_size(capacity - need)} to spare"]
    options = fixes(shape, work, capacity, cuda)
    if not options:
        return [f"{head}: does not fit, and no single change here makes it fit; combine them or use more GPUs"]
    return [f"{head}: does not fit. Each of these alone makes it fit:", *(f"  {option}" for option in options)]
