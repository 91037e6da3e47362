"""A long run that does not drift (issue 42): thousands of steps of a tiny model, sampled every few steps.

    .venv/bin/python benchmarks/soak.py --json benchmarks/soak.json  # 10,000 steps, then 3,000 with a worker
    .venv/bin/python benchmarks/soak.py --steps 200 --worker-steps 0   # a quick look

Each sample reads, from the training process: its resident memory (and its rollout worker's), open file
descriptors, OS threads, child processes, the mean step time since the last sample, the bytes of the run folder
outside the checkpoints (the logs: metrics.jsonl, completions.jsonl, ...) and the checkpoints (their count and
bytes; ``save_total_limit=2`` rotates them). A quantity drifts when its median over the last tenth of the run
exceeds its median over the tenth after the warm-up (the first fifth) by more than 5%. Two grow by design and are
compared per step: the logs (what must stay flat is how much each step adds) and a checkpoint's
``trainer_state.json``, which holds every row logged so far (transformers' format; a resume rewrites
``metrics.jsonl`` from it), so its bytes per step covered; the rest of a checkpoint must keep its size. Step
times are wall-clock: run it on otherwise idle cores. Every logged row stays in memory
(``trainer.state.log_history``, as in transformers' Trainer) and in each checkpoint's ``trainer_state.json``, so
with ``--logging-steps 1`` memory and the checkpoints' writing grow with the run: that run shows by how much.
The numbers go to BENCHMARKS.md; ``tests/test_soak.py``
runs a short version.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
from transformers import TrainerCallback

DRIFT_LIMIT = 0.05  # the largest growth after the warm-up that counts as flat
FLAT = (
    "rss_mb",
    "fds",
    "threads",
    "children",
    "checkpoint_count",
    "checkpoint_bytes",
    "log_bytes_per_step",
    "trainer_state_bytes_per_step",
)
# reported, not judged: wall-clock times wander with the machine (a 2-core CPU shared with the OS), and a
# checkpoint write grows with the log history it holds (by design)
TIMES = ("worker_rss_mb", "step_seconds", "step_seconds_between_saves", "save_seconds", "cpu_seconds_per_step")
STATE_FILE = "trainer_state.json"


@dataclass
class Sample:
    step: int
    rss_mb: float  # the training process
    worker_rss_mb: float  # its children (a rollout worker), 0 without
    fds: int
    threads: int
    children: int
    step_seconds: float  # mean over the steps since the last sample
    step_seconds_between_saves: float  # the same without the checkpoint writes (their time grows by design)
    save_seconds: float  # the newest checkpoint write since the last sample (0: none)
    cpu_seconds_per_step: float  # CPU time of the process and its children (a worker): no wait for other work
    log_bytes: int  # the run folder outside checkpoints
    log_bytes_per_step: float  # added since the last sample, per step
    checkpoint_count: int
    checkpoint_bytes: int  # all but trainer_state.json, which holds every logged row (as transformers' does)
    trainer_state_bytes_per_step: float  # the newest checkpoint's trainer_state.json over its step


def folder_bytes(folder: Path) -> tuple[int, int, int, float]:
    """``(bytes outside checkpoint folders, checkpoint folders, their bytes but trainer_state.json's, the newest
    checkpoint's trainer_state.json bytes per step it covers)`` of a run folder."""
    logs = checkpoints = count = state = newest = 0
    for entry in os.scandir(folder):
        if entry.is_dir() and entry.name.startswith("checkpoint-"):
            count += 1
            files = [f for f in Path(entry.path).rglob("*") if f.is_file()]
            checkpoints += sum(f.stat().st_size for f in files if f.name != STATE_FILE)
            step = int(entry.name.rsplit("-", 1)[1])
            if step > newest:
                newest, state = step, sum(f.stat().st_size for f in files if f.name == STATE_FILE)
        elif entry.is_dir():
            logs += sum(f.stat().st_size for f in Path(entry.path).rglob("*") if f.is_file())
        else:
            logs += entry.stat().st_size
    return logs, count, checkpoints, state / newest if newest else 0.0


class SoakProbe(TrainerCallback):
    """A ``TrainerCallback`` sampling the process every ``every`` optimizer steps (:class:`Sample`)."""

    def __init__(self, output_dir: Path, every: int) -> None:
        super().__init__()
        self.output_dir, self.every = output_dir, every
        self.process = psutil.Process()
        self.samples: list[Sample] = []
        self._last: tuple[int, float, int, float] | None = None  # step, time, log bytes, CPU seconds
        self._step_ended = 0.0  # when the last step ended: a checkpoint write follows it
        self._saving = self._last_save = 0.0  # seconds of checkpoint writes since the last sample, the newest

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._last_save = time.perf_counter() - self._step_ended
        self._saving += self._last_save

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._step_ended = time.perf_counter()
        step = state.global_step
        if step % self.every:
            return
        now = time.perf_counter()
        logs, count, checkpoint_bytes, state_per_step = folder_bytes(self.output_dir)
        children = self.process.children(recursive=True)
        worker_rss = sum(_rss(child) for child in children)
        cpu = _cpu_seconds(self.process) + sum(_cpu_seconds(child) for child in children)
        if self._last is not None:
            last_step, last_time, last_logs, last_cpu = self._last
            self.samples.append(
                Sample(
                    step=step,
                    rss_mb=self.process.memory_info().rss / 2**20,
                    worker_rss_mb=worker_rss / 2**20,
                    fds=self.process.num_fds(),
                    threads=self.process.num_threads(),
                    children=len(children),
                    step_seconds=(now - last_time) / (step - last_step),
                    step_seconds_between_saves=(now - last_time - self._saving) / (step - last_step),
                    save_seconds=self._last_save,
                    cpu_seconds_per_step=(cpu - last_cpu) / (step - last_step),
                    log_bytes=logs,
                    log_bytes_per_step=(logs - last_logs) / (step - last_step),
                    checkpoint_count=count,
                    checkpoint_bytes=checkpoint_bytes,
                    trainer_state_bytes_per_step=state_per_step,
                )
            )
        self._last = (step, now, logs, cpu)
        self._saving = 0.0


def _cpu_seconds(process: psutil.Process) -> float:
    """User and system CPU seconds of ``process`` (0 when it ended between the listing and the reading)."""
    try:
        times = process.cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def _rss(process: psutil.Process) -> int:
    try:
        return int(process.memory_info().rss)
    except psutil.Error:  # it ended between the listing and the reading
        return 0


def growth(samples: list[Sample], key: str) -> float:
    """The median of ``key`` over the last tenth of ``samples`` over its median over the tenth after the warm-up
    (the first fifth), minus 1 (0.03: 3% higher at the end). Medians: a step time is wall-clock, and a burst of
    other work on the machine should not read as drift."""
    n = len(samples)
    tenth = max(1, n // 10)
    warm = n // 5
    early = [getattr(s, key) for s in samples[warm : warm + tenth]]
    late = [getattr(s, key) for s in samples[-tenth:]]
    base = statistics.median(early)
    return statistics.median(late) / base - 1 if base else float(statistics.median(late) > 0)


def soak(
    output_dir: Path, steps: int, every: int = 25, worker: bool = False, seed: int = 0, logging_steps: int = 10
) -> list[Sample]:
    """Train a tiny model for ``steps`` steps (``worker``: sampled by a rollout worker, ``max_staleness=1``),
    checkpointing every 10 steps with ``save_total_limit=2``, logging every ``logging_steps`` (10: rloo's and
    TRL's default); the samples."""
    from rloo import RLOOConfig, RLOOTrainer
    from rloo.tiny import build_char_tokenizer, save_tiny_model

    model = save_tiny_model(output_dir.parent / f"{output_dir.name}-model", chars="0123456789+= ")
    prompts = [{"prompt": f"{a}+{b}="} for a in range(10) for b in range(10)]
    args = RLOOConfig(
        output_dir=str(output_dir),
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=4,
        learning_rate=1e-3,
        max_steps=steps,
        logging_steps=logging_steps,
        save_steps=10,
        save_total_limit=2,
        report_to=[],
        seed=seed,
        **({"max_staleness": 1, "rollout_workers": 1} if worker else {}),
    )
    probe = SoakProbe(output_dir, every)
    trainer = RLOOTrainer(
        model=str(model),
        reward_funcs=_sevens,
        args=args,
        train_dataset=prompts,
        processing_class=build_char_tokenizer("0123456789+= "),
        callbacks=[probe],
    )
    trainer.train()
    return probe.samples


def _sevens(completions: list[str], **kwargs: Any) -> list[float]:
    return [text.count("7") / max(len(text), 1) for text in completions]


def summary(samples: list[Sample]) -> dict[str, Any]:
    """First and last values, growth after the warm-up, and whether each flat quantity held."""
    keys = [*FLAT, *TIMES]
    out: dict[str, Any] = {"samples": len(samples), "steps": samples[-1].step if samples else 0}
    for key in keys:
        values = [getattr(s, key) for s in samples]
        out[key] = {"first": values[0], "last": values[-1], "max": max(values), "growth": growth(samples, key)}
    out["drift"] = [key for key in FLAT if out[key]["growth"] > DRIFT_LIMIT]
    return out


def table(name: str, result: dict[str, Any]) -> str:
    rows = [f"{name}: {result['steps']} steps, {result['samples']} samples; drift: {result['drift'] or 'none'}"]
    for key in [*FLAT, *TIMES]:
        v = result[key]
        rows.append(f"  {key:20s} first {v['first']:>12.4g}  last {v['last']:>12.4g}  growth {v['growth']:+.1%}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--worker-steps", type=int, default=3000, help="a second run with a rollout worker (0: none)")
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--logging-steps", type=int, default=10, help="10: the default; 1 logs (and keeps) every step")
    parser.add_argument("--out", type=Path, default=Path("runs/soak"))
    parser.add_argument("--json", type=Path, default=None, help="write the samples and the summary here")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    runs = [("synchronous", args.steps, False), ("rollout worker", args.worker_steps, True)]
    for name, steps, worker in runs:
        if steps <= 0:
            continue
        folder = args.out / name.replace(" ", "-")
        if folder.exists():
            sys.exit(f"{folder} exists: remove it or give another --out")
        start = time.perf_counter()
        samples = soak(folder, steps, args.every, worker, logging_steps=args.logging_steps)
        result = summary(samples)
        result["seconds"] = time.perf_counter() - start
        result["logging_steps"] = args.logging_steps
        results[name] = {"summary": result, "samples": [asdict(s) for s in samples]}
        print(table(name, result), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 1 if any(r["summary"]["drift"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
