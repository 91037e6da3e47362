"""What a run may do to its ``output_dir``: never delete or overwrite what it did not write.

- A fresh run refuses a folder that holds an earlier run's files (its checkpoints, ``final/``,
  ``config.yaml``, logs or report) unless ``overwrite_output_dir=True``; with it, the earlier
  logs are kept under another name and the rest is replaced.
- Resuming from a checkpoint older than the newest one in the folder would overwrite the
  newer ones (and a later ``resume_from_checkpoint=True`` would pick them): refused unless
  ``overwrite_output_dir=True``, which removes them first, saying so. Newer *damaged* ones
  never block it: they are renamed ``damaged-checkpoint-<step>``, saying so, never deleted.

- Which checkpoint a resume loads (:func:`resolve_resume_path`): the newest, or the one named; a damaged
  one, or a folder without checkpoints, is refused (:class:`ResumeRefused`) naming the damage and the fix.

``overwrite_output_dir`` is the explicit opt-in, as in transformers.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.markup import escape

from rloo.training.checkpointing.checkpoints import (
    CHECKPOINT_PATTERN,
    LEGACY_TRAINING_FILE,
    STATE_FILE,
    TRAINING_STATE,
    checkpoint_folders,
    checkpoint_problem,
    list_checkpoints,
    remove_folder,
    tidy_interrupted_writes,
)
from rloo.training.checkpointing.manifest import MANIFEST, newest_good_checkpoint
from rloo.training.checkpointing.run_record import notes_header

if TYPE_CHECKING:
    from rloo.config import RLOOConfig

# the run folder of a run given no output_dir: runs/rloo, then runs/rloo-2, runs/rloo-3... (as rloo demo's)
FRESH_RUN_BASE = Path("runs/rloo")
RUN_FILES = ("final", "config.yaml", "metrics.jsonl", "completions.jsonl", "warnings.log", "report.html")
LOG_FILES = ("metrics.jsonl", "completions.jsonl", "warnings.log", "tensorboard")


class ResumeRefused(ValueError):
    """A refused resume, its message in the Python API's words (``resume_from_checkpoint=...``);
    ``cli``: the same message in ``rloo train``'s (``--resume``, ``--resume-from PATH``)."""

    def __init__(self, message: str, cli: str) -> None:
        super().__init__(message)
        self.cli = cli


def open_run(
    output_dir: Path, resume_from_checkpoint: bool | str | None, config: dict[str, Any], world_size: int, console: Any
) -> Path | None:
    """Check and prepare ``output_dir`` for this run (main process only); the checkpoint to resume
    from, or None for a fresh run."""
    path = resolve_resume_path(resume_from_checkpoint, output_dir)
    if path is None:
        prepare_fresh_run(output_dir, bool(config["overwrite_output_dir"]), console)
    else:
        prepare_resume(output_dir, path, config, console)
        check_same_world_size(path, world_size)
    return path


def fresh_run_folder(base: Path = FRESH_RUN_BASE) -> Path:
    """``base`` if it is free (missing or empty), else the first free ``base-2``, ``base-3``... Not
    created: the run creates it when training starts (:func:`write_run_files`), so a start that
    fails (a model that does not load) leaves nothing behind. Two runs started together may pick the
    same one; the one that starts training after the other wrote its config.yaml is then refused
    (:func:`check_fresh_run`), as in any folder that holds a run."""
    candidate, n = base, 1
    while candidate.exists() and (not candidate.is_dir() or any(candidate.iterdir())):
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def with_run_folder(args: RLOOConfig, on_main: Callable[[Callable[[], Path]], Path]) -> tuple[RLOOConfig, Path]:
    """``args`` with its run folder, and that folder. No ``output_dir`` (TRL's
    quickstart, run twice) gets a fresh one (:func:`fresh_run_folder`), chosen by the main process
    and shared with the others (``on_main``: ``Ranks.on_main``), and recorded in the returned config,
    so config.yaml names it and ``rloo train FOLDER/config.yaml --resume`` continues the run."""
    from rloo.config import as_config  # the trainer's reading of a config: read-only from now on

    if args.output_dir is not None:
        return args, Path(args.output_dir)
    folder = on_main(fresh_run_folder)
    return as_config(args.replace(output_dir=str(folder))), folder


def check_same_world_size(checkpoint: Path, world_size: int) -> None:
    """A checkpoint holds one random state per process and its processes' prompt shards: resuming
    with another process count would not continue its run."""
    saved = json.loads((checkpoint / STATE_FILE).read_text()).get("world_size", 1)
    if saved != world_size:
        raise ValueError(
            f"{checkpoint.name} was written by a run of {saved} process(es) and this run has {world_size}: "
            f"resume with {saved} (e.g. torchrun --nproc_per_node {saved} or accelerate launch --num_processes "
            f"{saved}), or start a new run from its weights (model={str(checkpoint)!r})"
        )


def write_run_files(output_dir: Path, config_text: str, sink: Any, state: Any, resumed_from: Path | None) -> None:
    """``config.yaml``, and after a resume the logs as of the checkpoint (replayed steps are not
    logged twice). ``sink``: the run's ``MetricsSink``; ``state``: its ``TrainerState``. A folder that
    cannot be written is a ``ValueError`` naming it (:func:`unwritable`)."""
    try:
        if resumed_from is not None:
            sink.rewrite(state.log_history)
            keep_completions_until(output_dir, state.global_step)
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "config.yaml").write_text(config_text)
    except OSError as error:  # a read-only folder, a parent that cannot be created, a full disk
        raise unwritable(output_dir, error) from error


def write_report(output_dir: Path, warn: Any, console: Any = None) -> Path | None:
    """``report.html`` at the end of a run, as ``rloo report`` builds it (main process only): its path,
    printed as the run's last line on ``console`` (default: stderr, where the trainer's console writes),
    or None after ``warn(message)`` if it could not be built. The run and its model are done by then,
    so a failing report never fails them."""
    from rloo.report.page import build_report  # torch-free; the report's plots import matplotlib
    from rloo.training.monitoring.logs import log_console

    try:
        path = build_report(output_dir)
    except Exception as error:  # a report is a view of the run: it must not lose the run
        warn(
            f"report.html was not written ({type(error).__name__}: {error}); rebuild it with `rloo report {output_dir}`"
        )
        return None
    (console or log_console(stderr=True)).print(
        f"report: {path} (open it in a browser; `rloo report {output_dir}` rebuilds it)", highlight=False
    )
    return path


def config_yaml(config: dict[str, Any], run_config: dict[str, Any] | None) -> str:
    """``config.yaml``: the run file as given (when trained by ``rloo train``), or what a Python-API run's
    arguments name (a :class:`rloo.training.checkpointing.run_record.RunRecord`, its notes as comments
    above), with every ``RLOOConfig`` field as resolved."""
    header = notes_header(getattr(run_config, "notes", []))
    return header + yaml.safe_dump(config if run_config is None else {**run_config, **config}, sort_keys=False)


def earlier_run_files(output_dir: Path) -> list[str]:
    """Names in ``output_dir`` that an earlier run wrote (checkpoints first)."""
    if not output_dir.is_dir():
        return []
    found = [path.name for path in list_checkpoints(output_dir)]
    return found + [name for name in RUN_FILES if (output_dir / name).exists()]


def check_run_folder(output_dir: Path) -> None:
    """Raise ``ValueError`` if ``output_dir`` cannot be a run folder: a file, a path under a file, or
    in a folder that is not writable (as ``os.access`` reads it: root writes anywhere, so a failing
    write says it too, :func:`unwritable`). Cheap, and creates nothing."""
    shown = repr(str(output_dir))
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(
            f"output_dir {shown} is a file, not a folder: choose a folder for output_dir (a new path or an existing "
            "folder; nothing was changed)"
        )
    existing = output_dir  # the nearest folder that exists: the run creates the rest
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise ValueError(
            f"output_dir {shown} cannot be created: {str(existing)!r} is a file, not a folder; choose a folder for "
            "output_dir elsewhere (nothing was changed)"
        )
    if existing.exists() and not os.access(existing, os.W_OK | os.X_OK):
        where = "is not writable" if existing == output_dir else f"cannot be created: {str(existing)!r} is not writable"
        raise ValueError(
            f"output_dir {shown} {where}; choose a writable folder for output_dir, or fix its permissions "
            "(nothing was changed)"
        )


def unwritable(output_dir: Path, error: OSError) -> ValueError:
    """The error of a run folder that could not be created or written when the run starts."""
    return ValueError(
        f"output_dir {str(output_dir)!r} is not writable ({type(error).__name__}: {error}); choose a writable "
        "folder for output_dir, or fix its permissions or free disk space"
    )


def check_fresh_run(output_dir: Path, overwrite: bool) -> None:
    """Raise ``ValueError`` if a fresh run may not start in ``output_dir`` (cheap: no model needed):
    it is not a usable folder (:func:`check_run_folder`), or it holds an earlier run."""
    check_run_folder(output_dir)
    found = earlier_run_files(output_dir)
    if found and not overwrite:
        resume = (
            "pass resume_from_checkpoint=True (rloo train ... --resume) to continue it, "
            if any(CHECKPOINT_PATTERN.match(name) for name in found)
            else ""
        )
        raise ValueError(
            f"output_dir {str(output_dir)!r} already holds an earlier run ({', '.join(found[:6])}); "
            f"{resume}choose a new output_dir (or leave it unset: each run then gets a fresh runs/rloo-N), or set "
            "overwrite_output_dir=True to replace it (nothing was changed)"
        )


def prepare_fresh_run(output_dir: Path, overwrite: bool, console: Any) -> None:
    """Refuse a folder holding an earlier run, or (``overwrite``) set its logs aside."""
    check_fresh_run(output_dir, overwrite)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in LOG_FILES:
        path = output_dir / name
        if path.exists():
            kept = path.with_name(f"{path.stem}.before-{stamp}{path.suffix}")
            path.rename(kept)
            console.print(f"kept the earlier run's {name} as {kept.name}")


def prepare_resume(output_dir: Path, checkpoint: Path, config: dict[str, Any], console: Any) -> None:
    """Refuse a resume that would not continue the checkpoint's run: with other batch-shaping
    settings, or behind newer intact checkpoints of ``output_dir`` (removed with ``overwrite_output_dir``).
    Newer damaged checkpoints never block it: they are moved aside (:func:`set_aside`), never deleted.
    ``config``: this run's ``RLOOConfig.to_dict()``."""
    check_same_batch_shape(checkpoint, config)
    overwrite = bool(config["overwrite_output_dir"])
    step = _step(checkpoint)
    later = [path for path in checkpoint_folders(output_dir) if step is not None and (_step(path) or 0) > step]
    damaged = {path: problem for path in later if (problem := checkpoint_problem(path)) is not None}
    newer = [path for path in later if path not in damaged]
    if newer and not overwrite:
        names = ", ".join(path.name for path in newer)
        refusal = (
            f"{output_dir} holds checkpoints newer than {checkpoint.name} ({names}); resuming from it would "
            "overwrite them. Resume from the newest ({}), move them away, or set overwrite_output_dir={} to delete "
            "them (nothing was changed)"
        )
        raise ResumeRefused(
            refusal.format("resume_from_checkpoint=True", "True"), refusal.format("rloo train ... --resume", "true")
        )
    for path, problem in damaged.items():
        aside = set_aside(path)
        console.print(
            f"moved {path.name} aside to {aside.name}: it is damaged ({escape(problem)}); kept, not resumed from",
            highlight=False,
        )
    for path in newer:
        remove_folder(path)
        console.print(f"removed {path.name}, newer than {checkpoint.name} (overwrite_output_dir=True)")


def set_aside(checkpoint: Path) -> Path:
    """Rename a damaged ``checkpoint-<step>`` to ``damaged-checkpoint-<step>`` (``-2``, ``-3``... if
    taken), out of the way of resuming and of the run's next checkpoints; returns the new path."""
    target, n = checkpoint.with_name(f"damaged-{checkpoint.name}"), 1
    while target.exists():
        n += 1
        target = checkpoint.with_name(f"damaged-{checkpoint.name}-{n}")
    checkpoint.rename(target)
    return target


# the fields that decide which prompts form a generation batch and how it maps to optimizer steps
BATCH_SHAPE = (
    "num_generations",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "generation_batch_size",
    "num_iterations",
    "seed",
    "shuffle_dataset",
)


def check_same_batch_shape(checkpoint: Path, config: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the field and both values if this run shapes its batches
    differently from the run that wrote ``checkpoint`` (its ``config.yaml``)."""
    saved = yaml.safe_load((checkpoint / "config.yaml").read_text()) or {}
    for name in BATCH_SHAPE:
        if name in saved and saved[name] != config[name]:
            raise ValueError(
                f"cannot resume {checkpoint}: it was trained with {name}={saved[name]!r}, this run has "
                f"{name}={config[name]!r}; resume with the same value, or start a new run from its weights"
            )


def keep_completions_until(output_dir: Path, step: int) -> None:
    """After a resume to ``step``, drop the completions logged under the abandoned later steps
    (they are logged again as the run replays them); a row's step is the optimizer step that logged it
    (:func:`rloo.training.cadence.completions_step`), so those up to ``step`` were trained before it."""
    path = output_dir / "completions.jsonl"
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines(keepends=True):
        try:
            row_step = json.loads(line).get("step", 0)
        except (json.JSONDecodeError, AttributeError):
            continue  # a half-written last line of the interrupted run
        if isinstance(row_step, int | float) and row_step <= step:
            kept.append(line)
    path.write_text("".join(kept))


def _step(path: Path) -> int | None:
    match = CHECKPOINT_PATTERN.match(path.name)
    return int(match.group(1)) if match else None


def resolve_resume_path(resume_from_checkpoint: bool | str | None, output_dir: Path) -> Path | None:
    """``True`` -> the latest checkpoint in ``output_dir``; a string -> that folder.

    First tidies what a killed run may have left in ``output_dir`` (:func:`tidy_interrupted_writes`).
    A damaged checkpoint is refused naming the damage and the newest intact checkpoint
    (:class:`ResumeRefused`).
    """
    tidy_interrupted_writes(output_dir)
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if not isinstance(resume_from_checkpoint, str | os.PathLike | bool):
        raise ValueError(
            f"resume_from_checkpoint={resume_from_checkpoint!r} is invalid: give True (the latest checkpoint in "
            f"{output_dir}), a checkpoint folder such as '{output_dir / 'checkpoint-500'}', or None"
        )
    if resume_from_checkpoint is True:
        folders = checkpoint_folders(output_dir)  # incomplete ones too: they are damaged, not skipped
        if not folders:
            raise _no_checkpoint(output_dir)
        return _checked(folders[-1], picked=True)
    return _checked(Path(resume_from_checkpoint), picked=False)


def _checked(path: Path, picked: bool) -> Path:
    """``path`` if it can be resumed from; else :class:`ResumeRefused` naming what is wrong and the
    newest intact checkpoint beside it. ``picked``: the newest folder of ``output_dir``
    (``resume_from_checkpoint=True``), not one the user named."""
    if (path / LEGACY_TRAINING_FILE).is_file() and not (path / f"{TRAINING_STATE}.json").is_file():
        raise ValueError(
            f"{path} was written by an older rloo: its training state is a pickle ({LEGACY_TRAINING_FILE}), "
            "which is not loaded because unpickling can run code. Start a new run from its weights "
            "(model=that folder) instead of resuming"
        )
    needed = [STATE_FILE, f"{TRAINING_STATE}.json", f"{TRAINING_STATE}.safetensors"]
    missing = [name for name in needed if not (path / name).is_file()]
    if missing and not picked and not (path / MANIFEST).is_file():  # a folder named that was never a checkpoint
        absent = f"is not a complete checkpoint (missing {', '.join(missing)}); pick a checkpoint-<step> folder"
        good = newest_good_checkpoint(p for p in checkpoint_folders(path.parent) if p != path)
        offer = (
            ("", "")
            if good is None
            else (f", e.g. resume_from_checkpoint={str(good)!r}", f", e.g. rloo train ... --resume-from {good}")
        )
        raise ResumeRefused(
            f"resume_from_checkpoint={str(path)!r} {absent}{offer[0]}", f"--resume-from {path} {absent}{offer[1]}"
        )
    problem = checkpoint_problem(path)  # the manifest first: it names any edited, truncated or missing file
    if problem is None:
        return path
    damaged = f"checkpoint {path} is damaged: {problem}; "
    good = newest_good_checkpoint(p for p in checkpoint_folders(path.parent) if p != path)
    if good is None:
        message = damaged + "no checkpoint beside it is intact: start a new run in a new output_dir"
        raise ResumeRefused(message, message)
    aside = "damaged checkpoints after it are moved aside (renamed damaged-checkpoint-<step>), never deleted"
    raise ResumeRefused(
        f"{damaged}the newest good checkpoint is {good}: resume from it with resume_from_checkpoint={str(good)!r} "
        f"({aside})",
        f"{damaged}the newest good checkpoint is {good}: resume from it with rloo train ... --resume-from {good} "
        f"({aside})",
    )


def _no_checkpoint(output_dir: Path) -> ResumeRefused:
    """Resuming a folder without checkpoints: the fresh start that works there, and what it replaces."""
    found = earlier_run_files(output_dir)
    if not found:  # nothing there: a fresh start works as it is
        message = (
            f"resume_from_checkpoint=True but {output_dir} has no complete checkpoint-<step> folder; "
            "train without resuming, or pass the checkpoint folder explicitly"
        )
        return ResumeRefused(message, message)
    start = f"resuming needs a checkpoint, and {output_dir} has no checkpoint-<step> folder to resume from"
    replaced = [name for name in found if name not in LOG_FILES]
    what = f"replaces {', '.join(replaced)}; its " if replaced else "its "
    holds = f"{start} (it holds {', '.join(found)}: a run that stopped before its first checkpoint)"
    if "final" in found:  # a finished run's model: never offered for replacement without naming it
        holds = f"{start} (it holds {', '.join(found)}: a run that finished without checkpoints)"
    return ResumeRefused(
        f"{holds}; start afresh with overwrite_output_dir=True and no resume_from_checkpoint ({what}logs are "
        "kept renamed), or choose a new output_dir",
        f"{holds}; start afresh with rloo train ... overwrite_output_dir=true (without --resume; {what}logs are "
        "kept renamed), or choose a new output_dir",
    )
