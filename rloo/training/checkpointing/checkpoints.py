"""Checkpoints that are never half-written, resuming from them, and loading saved weights back.

A checkpoint is written into ``output_dir/tmp-checkpoint-<step>`` and renamed to
``checkpoint-<step>`` only once complete; ``trainer_state.json`` is written last, and
:func:`latest_checkpoint` only picks folders that have it. An older checkpoint with the
same name is moved aside before the rename and deleted after, so a crash at any point
leaves either the old or the new one whole. A write that fails (a full disk, a folder made
read-only) removes its ``tmp-`` folder, puts a moved-aside checkpoint back, and raises
:class:`CheckpointWriteError` naming the run folder, the newest intact checkpoint and the resume.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from rloo.generation.device import is_peft_model
from rloo.training.checkpointing.manifest import manifest_problem, newest_good_checkpoint, write_manifest
from rloo.training.checkpointing.state_files import load_state, save_state
from rloo.training.monitoring.nonfinite import require_finite_weights
from rloo.training.parallel.fsdp import (
    full_model_state,
    full_optimizer_state,
    full_state_loading,
    is_sharded,
    load_full_optimizer_state,
)
from rloo.training.setup.reference_adapter import saved_adapters

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"
TRAINING_STATE = "training_state"  # .json + .safetensors, see rloo.training.checkpointing.state_files
LEGACY_TRAINING_FILE = "training_state.pt"


@contextlib.contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """Silence transformers' per-save progress bars ("Writing model shards") for a moment."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


def save_pretrained_quietly(obj: Any, path: Path, state_dict: dict[str, Any] | None = None) -> None:
    """``obj.save_pretrained(path)`` with safetensors and without progress bars; ``state_dict``:
    the weights to write instead of ``obj``'s own (a sharded model's, gathered: :func:`full_weights`).
    A PEFT policy's frozen reference adapter is left out: the policy's adapter alone is saved."""
    with quiet_progress_bars():
        if hasattr(obj, "config"):
            extra = {**saved_adapters(obj), **({} if state_dict is None else {"state_dict": state_dict})}
            obj.save_pretrained(path, safe_serialization=True, **extra)
        else:
            obj.save_pretrained(path)


def full_weights(model: nn.Module) -> dict[str, Any] | None:
    """A sharded (FSDP) model's full state dict, gathered onto the main process (every process
    must call it); None for a model that is not sharded (it saves its own weights). Tied weights
    (a head tied to the embeddings) are left out, as ``save_pretrained`` leaves them out."""
    if not is_sharded(model):
        return None
    tied = _tied_parameter_names(model)
    return {name: tensor for name, tensor in full_model_state(model).items() if name not in tied}


def checked_weights(model: nn.Module, what: str) -> dict[str, Any] | None:
    """:func:`full_weights`, after refusing to write ``what`` with a non-finite weight
    (:func:`rloo.training.monitoring.nonfinite.require_finite_weights`); every process must call it."""
    require_finite_weights(model, what)
    return full_weights(model)


def rng_state() -> dict[str, Any]:
    """This process's global random states (Python, NumPy, torch, CUDA). Sampling needs none:
    each completion has its own seed (:func:`rloo.generation.sampling.completion_seed`)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointPart(Protocol):
    """A piece of the trainer a checkpoint keeps beside the optimizer's: its :meth:`state` is saved under
    its key in the training state (:func:`training_state`) and handed back to :meth:`restore` on resume
    (:func:`restore_training_state`; ``{}`` when the checkpoint has none). The trainer names its parts
    once (the reference's refresh, the rollout source): adding one is one entry there."""

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


def training_state(
    optimizer: Any,
    scheduler: Any,
    sampler: Any,
    rng_per_rank: list[Any] | None = None,
    model: Any = None,
    scaler: Any = None,
    parts: Mapping[str, CheckpointPart] | None = None,
) -> dict[str, Any]:
    """What resuming needs besides the weights: optimizer, schedule, RNG states, prompt position,
    and fp16's gradient scaler (``scaler``; else a resumed run restarts its scale and skips steps
    finding it again); each of ``parts``' state under its key. ``rng_per_rank``: every process's
    :func:`rng_state` (this process's alone when None); ``model`` sharded (FSDP): the optimizer state is
    gathered full, keyed by parameter name."""
    sharded = model is not None and is_sharded(model)
    state = {
        "optimizer": full_optimizer_state(model, optimizer) if sharded else optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_per_rank if rng_per_rank is not None else [rng_state()],
        "sampler": sampler.state_dict(),
    }
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    state.update({key: part.state() for key, part in (parts or {}).items()})
    return state


def restore_training_state(
    state: dict[str, Any],
    optimizer: Any,
    scheduler: Any,
    sampler: Any,
    rank: int = 0,
    model: Any = None,
    scaler: Any = None,
    parts: Mapping[str, CheckpointPart] | None = None,
) -> None:
    """The inverse of :func:`training_state`, in place, for process ``rank`` (a checkpoint without a
    scaler's state leaves ``scaler`` as it starts; a part it does not hold is restored from ``{}``)."""
    if scaler is not None and "scaler" in state:
        scaler.load_state_dict(state["scaler"])
    if model is not None and is_sharded(model):
        load_full_optimizer_state(model, optimizer, state["optimizer"])  # each process keeps its shards
    else:
        optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    rng = state["rng"]
    restore_rng_state(rng[rank] if isinstance(rng, list) else rng)  # a dict: one process (older)
    sampler.load_state_dict(state["sampler"])
    for key, part in (parts or {}).items():
        part.restore(state.get(key) or {})


class RowTexts:
    """Each logged row's JSON text, encoded once for all the checkpoints that hold it: a row is never changed
    once logged, so a checkpoint encodes only the rows logged since the last (about 25 us a row; at 10,000
    rows, 250 ms a checkpoint otherwise). Rows are matched by identity: a log history replaced (a resume) or
    a row replaced is encoded anew."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.texts: list[str] = []

    def __call__(self, rows: list[dict[str, Any]]) -> list[str]:
        kept = 0
        for row, seen in zip(rows, self.rows, strict=False):
            if row is not seen:
                break
            kept += 1
        self.texts = self.texts[:kept] + [json.dumps(row) for row in rows[kept:]]
        self.rows = list(rows)
        return self.texts


def state_json(trainer_state: dict[str, Any], row_texts: RowTexts | None = None) -> str:
    """``trainer_state.json``'s text: transformers' fields, ``log_history`` a row a line. Every logged row is
    in it (a resume rewrites ``metrics.jsonl`` from it), so it grows with the run; each row goes through
    json's C encoder (an indented dump runs the pure-Python one: 0.9 s against 0.2 s at 10,000 rows), once
    with ``row_texts`` (the trainer's: :class:`RowTexts`)."""
    head = {key: value for key, value in trainer_state.items() if key != "log_history"}
    history = trainer_state.get("log_history", [])
    rows = ",\n".join(row_texts(history) if row_texts is not None else [json.dumps(row) for row in history])
    fields = json.dumps(head, indent=1)
    if "log_history" not in trainer_state:
        return fields
    return f'{fields[:-2]},\n "log_history": [\n{rows}\n ]\n}}' if head else f'{{"log_history": [\n{rows}\n]}}'


def save_checkpoint(
    output_dir: Path,
    step: int,
    *,
    model: Any,
    model_state: dict[str, Any] | None = None,
    tokenizer: Any,
    training_state: dict[str, Any],
    trainer_state: dict[str, Any],
    config_yaml: str,
    save_total_limit: int | None,
    row_texts: RowTexts | None = None,
) -> Path:
    """Write ``checkpoint-<step>`` atomically; returns its path (``row_texts``: the log rows' JSON, kept from
    the last checkpoint: :class:`RowTexts`).

    ``model.save_pretrained`` writes safetensors (only the adapter for a PEFT model), of
    ``model_state`` when given (a sharded model's full weights: :func:`full_weights`);
    ``training_state`` (optimizer, scheduler, RNG states) goes to JSON + safetensors, which
    loading never executes (:mod:`rloo.training.checkpointing.state_files`).

    A write that fails (a full disk, a folder made read-only) raises :class:`CheckpointWriteError`,
    leaving the earlier checkpoints as they were and no partial ``checkpoint-<step>``.
    """
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f"tmp-checkpoint-{step}"
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        save_pretrained_quietly(model, tmp, model_state)
        save_pretrained_quietly(tokenizer, tmp)
        save_state(training_state, tmp, TRAINING_STATE)
        (tmp / "config.yaml").write_text(config_yaml)
        (tmp / STATE_FILE).write_text(state_json(trainer_state, row_texts))
        write_manifest(tmp)
        old = output_dir / f"old-checkpoint-{step}"
        if final.exists():
            os.replace(final, old)
        try:
            os.replace(tmp, final)
        except OSError:
            if old.exists() and not final.exists():
                with contextlib.suppress(OSError):  # else tidy_interrupted_writes puts it back on resume
                    os.replace(old, final)
            raise
        if old.exists():
            remove_folder(old)
        rotate_checkpoints(output_dir, save_total_limit)
    except (OSError, SafetensorError) as error:  # a full disk, a folder made read-only
        if tmp.exists():  # never a half checkpoint; one left is tidied on resume (it is not named checkpoint-N)
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(_write_failed(output_dir, final.name, error)) from error
    return final


class CheckpointWriteError(OSError):
    """A checkpoint that could not be written (a full disk, a folder made read-only); its message
    names the run folder, the newest intact checkpoint and how to resume once fixed."""


def _write_failed(output_dir: Path, name: str, error: BaseException) -> str:
    """:class:`CheckpointWriteError`'s message: the cause, what is intact, and the fix."""
    failed = f"could not write {name} in run folder {output_dir} ({type(error).__name__}: {error})"
    fix = "free disk space or fix the folder's permissions"
    good = newest_good_checkpoint(checkpoint_folders(output_dir))
    if good is None:
        return (
            f"{failed}; no earlier checkpoint exists to resume from: {fix}, then start the run again with "
            "overwrite_output_dir=True (its logs are kept renamed), or choose another output_dir"
        )
    return (
        f"{failed}; the earlier checkpoints are intact (the newest is {good.name}) and nothing written was lost: "
        f"{fix}, then resume with `rloo train {output_dir / 'config.yaml'} --resume` or "
        "trainer.train(resume_from_checkpoint=True)"
    )


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints in ``output_dir``, oldest step first."""
    if not output_dir.is_dir():
        return []
    found = []
    for path in output_dir.iterdir():
        match = CHECKPOINT_PATTERN.match(path.name)
        if match and path.is_dir() and (path / STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(output_dir: Path) -> Path | None:
    checkpoints = list_checkpoints(output_dir)
    return checkpoints[-1] if checkpoints else None


def rotate_checkpoints(output_dir: Path, save_total_limit: int | None) -> None:
    """Delete the oldest checkpoints beyond ``save_total_limit``."""
    if save_total_limit is None:
        return
    checkpoints = list_checkpoints(output_dir)
    for path in checkpoints[: max(0, len(checkpoints) - save_total_limit)]:
        remove_folder(path)


def remove_folder(path: Path) -> None:
    """Delete ``path`` so that a kill midway never leaves a partial folder under its name: it is
    renamed to ``deleting-<name>`` (atomic) first, and :func:`tidy_interrupted_writes` finishes it."""
    doomed = path.with_name(f"deleting-{path.name}")
    os.replace(path, doomed)
    shutil.rmtree(doomed)


def tidy_interrupted_writes(output_dir: Path) -> None:
    """Finish what a killed run left: half-deleted folders go, a partial ``tmp-checkpoint-N``
    goes, and an ``old-checkpoint-N`` whose replacement never arrived becomes ``checkpoint-N``
    again (whole: it was complete when it was moved aside)."""
    if not output_dir.is_dir():
        return
    for path in sorted(output_dir.iterdir()):
        if not path.is_dir():
            continue
        if path.name.startswith(("deleting-", "tmp-checkpoint-")):
            shutil.rmtree(path)
        elif path.name.startswith("old-checkpoint-"):
            current = path.with_name(path.name.removeprefix("old-"))
            if current.exists():
                remove_folder(path)
            else:
                os.replace(path, current)


def checkpoint_folders(output_dir: Path) -> list[Path]:
    """Every ``checkpoint-<step>`` folder in ``output_dir``, complete or not, oldest step first."""
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name))]
    return [path for _, path in sorted(found) if path.is_dir()]


def checkpoint_problem(path: Path) -> str | None:
    """What makes ``path`` unfit to resume from (its manifest first: it names any edited, truncated
    or missing file), or None."""
    problem = manifest_problem(path)
    if problem is not None:
        return problem
    needed = [STATE_FILE, f"{TRAINING_STATE}.json", f"{TRAINING_STATE}.safetensors"]
    missing = [name for name in needed if not (path / name).is_file()]
    return f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing" if missing else None


def load_checkpoint_states(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(trainer_state, training_state)`` of a checkpoint folder."""
    trainer_state = json.loads((path / STATE_FILE).read_text())
    return trainer_state, load_state(path, TRAINING_STATE)


def restore_checkpoint(
    path: Path,
    model: nn.Module,
    optimizer: Any,
    scheduler: Any,
    sampler: Any,
    rank: int = 0,
    scaler: Any = None,
    parts: Mapping[str, CheckpointPart] | None = None,
) -> dict[str, Any]:
    """Load a checkpoint's weights and process ``rank``'s training state (with ``parts``') in place; returns
    its trainer state."""
    trainer_state, training_state = load_checkpoint_states(path)
    load_model_weights(model, path)
    restore_training_state(training_state, optimizer, scheduler, sampler, rank, model, scaler, parts)
    return trainer_state


def load_model_weights(model: nn.Module, folder: Path) -> None:
    """Load ``folder``'s safetensors into ``model`` in place.

    A PEFT model loads ``adapter_model.safetensors``; a full model every ``*.safetensors``
    shard. Keys missing from the files must be tied weights (e.g. the LM head tied to the
    embeddings), which ``save_pretrained`` leaves out; anything else is an error.
    """
    if is_peft_model(model):
        from peft import set_peft_model_state_dict

        with full_state_loading(model):
            set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))
        return
    shards = sorted(folder.glob("model*.safetensors"))  # not the training state's tensors
    if not shards:
        raise ValueError(f"no model*.safetensors weights in {folder}")
    state = {}
    for shard in shards:
        state.update(load_file(str(shard)))
    with full_state_loading(model):
        missing, unexpected = model.load_state_dict(state, strict=False)
    tied = _tied_parameter_names(model)
    untied_missing = [k for k in missing if k not in tied]
    if untied_missing or unexpected:
        raise ValueError(
            f"checkpoint {folder} does not match the model: missing {untied_missing[:5]}, unexpected {unexpected[:5]}"
        )


def _tied_parameter_names(model: nn.Module) -> set[str]:
    """Names of parameters that share storage with an earlier-named parameter."""
    seen: dict[int, str] = {}
    tied = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        else:
            seen[id(param)] = name
    return tied
