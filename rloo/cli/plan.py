"""``rloo plan``: the memory plan of a run (a run file, a model, TRL flags) on a device, before renting it.

Reads the run's config fields and ``peft:`` and the model's ``config.json`` only (a local folder, a
``config.json`` file, or a hub id already in the local cache: no weights are read; a run file's dataset,
rewards and tools are never loaded, so a run needs only ``model``), then prints what it assumed (dtype,
batch, lengths, processes), :func:`rloo.training.setup.memory_plan.plan_memory`'s phases, the peak,
whether it fits the device, and the single changes that would make it fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from rloo.config import RLOOConfig
from rloo.training.setup.memory_plan import (
    CUDA_OVERHEAD,
    DTYPE_BYTES,
    GiB,
    MemoryPlan,
    ModelShape,
    Workload,
    device_bytes,
    fits,
    fixes,
    plan_memory,
    weight_dtype,
)


@dataclass(frozen=True)
class PlanRun:
    """What ``rloo plan`` reads of a run: the model, the config fields and ``peft:``."""

    model: str
    config: RLOOConfig
    peft: dict[str, Any] | None = None


def load_plan_run(path: str | None, overrides: list[str] | None = None, flags: dict[str, Any] | None = None) -> PlanRun:
    """The run ``rloo plan`` was given: a run file, or a model's folder or ``config.json`` (planned with the
    config's defaults), with ``flags`` (run-file keys from TRL's flags) and ``key=value`` overrides."""
    from rloo.cli.run_file import RUN_KEYS, apply_overrides, build_config, build_peft_config

    loaded = {} if path is None else _read_run(path)
    flags = flags or {}
    if path is not None and loaded.get("model") == path and flags.get("model") not in (None, path):
        raise ValueError(f"two models: {path!r} and --model_name_or_path {flags['model']!r}; give one")
    values = apply_overrides({**loaded, **flags}, overrides or [])
    model = values.get("model")
    if model in (None, ""):
        raise ValueError(
            "rloo plan needs the model: `model` in the run file, or --model_name_or_path (a model folder, its "
            "config.json, or a hub id in the local cache)"
        )
    if not isinstance(model, str):
        raise ValueError(f"`model` expects a path or hub id (str), got {model!r}")
    peft = values.get("peft")
    if peft is not None and not isinstance(peft, dict):
        raise ValueError(f"`peft` expects a mapping of peft.LoraConfig fields, got {peft!r}")
    if peft is not None:
        build_peft_config(peft)
    return PlanRun(model, build_config({k: v for k, v in values.items() if k not in RUN_KEYS}), peft)


def _read_run(path: str) -> dict[str, Any]:
    """A run file's mapping; a model's folder or its ``config.json`` given instead is ``{"model": path}``."""
    from rloo.cli.run_file import is_model_config, read_run_file, refuse_trl_config

    if Path(path).is_dir() and (Path(path) / "config.json").is_file():
        return {"model": path}
    loaded = read_run_file(path)
    if is_model_config(loaded):
        return {"model": path}
    refuse_trl_config(path, loaded)
    return loaded


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


def plan_run(
    run: Any, prompt_length: int | None, shards: int = 1, device: str | None = None
) -> tuple[ModelShape, Workload, MemoryPlan]:
    """The memory plan of a run (:class:`PlanRun`, or a :class:`rloo.cli.run_file.RunFile`) on ``device``
    (a GPU runs bf16 where ``bf16`` is unset, a CPU does not; None: as this machine would)."""
    from rloo.cli.run_file import build_peft_config

    args = run.config
    length = prompt_length or args.max_prompt_length
    if not length:
        raise ValueError(
            "the prompt length is unknown: set max_prompt_length in the run file or give --prompt-length (tokens)"
        )
    lora = None if run.peft is None else build_peft_config(run.peft)
    shape = ModelShape.from_config(load_model_config(run.model))
    cuda = None if device is None else device_bytes(device)[1]
    device_type = None if cuda is None else "cuda" if cuda else "cpu"
    work = Workload.from_config(args, length, lora, shards, bf16_default=cuda, device_type=device_type)
    return shape, work, plan_memory(shape, work)


def plan_output(
    run: PlanRun, device: str, prompt_length: int | None, shards: int
) -> tuple[list[str], Table, list[str]]:
    """``rloo plan``'s output: the assumptions, the table of phases, and the notes and verdict."""
    shape, work, memory = plan_run(run, prompt_length, shards, device)
    source = "--prompt-length" if prompt_length else "max_prompt_length"
    head = assumptions(run.config, work, source, device_bytes(device)[1])
    tail = [f"note: {note}" for note in memory.notes] + verdict(shape, work, memory, device)
    return head, plan_table(memory), tail


def assumptions(args: RLOOConfig, work: Workload, prompt_source: str, cuda: bool) -> list[str]:
    """What the plan assumed, one line each: dtype (and why), batch, lengths, training, processes."""
    training = f"LoRA r={work.lora_rank}" if work.lora_rank is not None else "full fine-tuning"
    if work.reference_copy:
        training += f", a reference model copy (beta={args.algorithm.beta:g})"
    if work.gradient_checkpointing:
        training += ", gradient checkpointing"
    return [
        "Assumed (change any in the run file, as key=value or as --field value):",
        f"  dtype: {_dtype(args, work, cuda)}",
        f"  batch: {work.micro_batch} completions per pass (per_device_train_batch_size), "
        f"{work.prompts * work.num_generations} per generation batch "
        f"({work.prompts} prompts x num_generations {work.num_generations})",
        f"  lengths: prompt {work.prompt_length} tokens ({prompt_source}), completion {work.completion_length} "
        "tokens (max_completion_length), each at full length",
        f"  training: {training}, {work.optimizer_states} optimizer states per parameter ({args.optim})",
        f"  processes: {work.shards} (--processes: FSDP2 processes sharing weights, gradients and optimizer state)",
    ]


def _dtype(args: RLOOConfig, work: Workload, cuda: bool) -> str:
    """The weights' dtype and the compute's, with the setting (or the default) that chose them."""
    dtype = weight_dtype(args)
    if work.weight_bytes == 2:
        return f"{dtype} weights and compute (model_init_kwargs.dtype)"
    unknown = "" if dtype in DTYPE_BYTES else f"; model_init_kwargs.dtype {dtype!r} is planned as float32"
    if work.mixed_precision:
        why = "bf16=true" if args.bf16 else "bf16 unset: on, as on any GPU that has it; bf16=false plans without"
        kind = "fp16" if args.fp16 else "bf16"
        return f"float32 weights, {kind} autocast ({'fp16=true' if args.fp16 else why}{unknown})"
    why = (
        "bf16=false" if args.bf16 is False else ("bf16 unset: off on a CPU" if not cuda else "bf16 unset: no bf16 here")
    )
    return f"float32 throughout ({why}{unknown})"


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
