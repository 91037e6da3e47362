"""The cost of coordination: 2 processes (torchrun, gloo on CPU) vs 1 process on the same global batch.

    .venv/bin/python benchmarks/distributed.py [--repeats 3] [--steps 5] [--model small] [--fsdp]

Both sides train the same run file on the same benchmark model (benchmarks/common.py) with the
same global batch: 1 process x 8 prompts, or 2 processes x 4 prompts, K = 4 completions of up to
32 tokens (random-init models never emit EOS, so every completion has 32). Each run is a fresh
``rloo train``; the two alternate. Reported: the median ``timing/step`` over steps 2..N (the
step as logged by the main process, generation included) and the wall time of the whole
command, with min-max over repeats. On a 2-core machine two processes share the cores that
one process's threads use, so no speed-up is expected: the ratio measures what sharding,
the collectives and the per-step gathers cost. ``--fsdp`` adds 2 processes under FSDP2 (the
variables ``accelerate launch --config_file examples/accelerate/fsdp2_cpu.yaml`` sets): every
forward all-gathers each layer's parameters and generation decodes in lockstep.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(HERE))
from common import MODEL_SIZES  # noqa: E402

GLOBAL_PROMPTS, K, T = 8, 4, 32


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_run_file(
    folder: Path, model: Path, processes: int, steps: int, repeat: int, fsdp: bool = False
) -> tuple[Path, Path]:
    """The run file of one run and its output folder."""
    data = folder / "prompts.jsonl"
    if not data.exists():
        data.write_text(
            "".join(json.dumps({"prompt": f"Compute {a} plus {b}."}) + "\n" for a in range(20) for b in range(20))
        )
    name = f"run-{processes}{'-fsdp' if fsdp else ''}-{repeat}"
    out, run_file = folder / name, folder / f"{name}.yaml"
    values = {
        "model": str(model),
        "dataset": str(data),
        "reward_funcs": ["length"],
        "output_dir": str(out),
        "num_generations": K,
        "per_device_train_batch_size": GLOBAL_PROMPTS * K // processes,
        "max_completion_length": T,
        "max_steps": steps,
        "logging_steps": 1,
        "save_steps": 10_000,
        "learning_rate": 1e-5,
        "seed": 0,
    }
    run_file.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in values.items()))
    return run_file, out


FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}


def run(run_file: Path, out: Path, processes: int, fsdp: bool = False) -> tuple[list[float], float]:
    """``(timing/step of each step, wall seconds)`` of one ``rloo train``."""
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // processes))}
    env.update(FSDP_ENV if fsdp else {})
    if processes == 1:
        command = [sys.executable, "-m", "rloo", "train", str(run_file)]
    else:
        launcher = [str(BIN / "torchrun"), f"--nproc_per_node={processes}", "--master_addr=127.0.0.1"]
        command = [*launcher, f"--master_port={free_port()}", "-m", "rloo", "train", str(run_file)]
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row["timing/step"] for row in rows if "timing/step" in row], wall  # not the summary row


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model", choices=sorted(MODEL_SIZES), default="small")
    parser.add_argument("--fsdp", action="store_true", help="also 2 processes under FSDP2")
    options = parser.parse_args()
    from rloo.tiny import save_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        size = MODEL_SIZES[options.model]
        model = save_tiny_model(
            folder / "model",
            vocab_size=size["vocab_size"],
            hidden_size=size["hidden_size"],
            num_layers=size["num_layers"],
            num_heads=size["num_heads"],
            intermediate_size=size["intermediate_size"],
        )
        sides = ["1", "2"] + (["2 FSDP2"] if options.fsdp else [])
        step_times: dict[str, list[float]] = {side: [] for side in sides}
        walls: dict[str, list[float]] = {side: [] for side in sides}
        for repeat in range(options.repeats):
            for side in sides if repeat % 2 == 0 else sides[::-1]:
                processes = int(side[0])
                run_file, out = write_run_file(folder, model, processes, options.steps, repeat, side.endswith("FSDP2"))
                steps, wall = run(run_file, out, processes, fsdp=side.endswith("FSDP2"))
                step_times[side].append(statistics.median(steps[1:]))
                walls[side].append(wall)
                print(f"repeat {repeat} processes {side}: step {step_times[side][-1]:.3f} s, wall {wall:.1f} s")
    print(
        f"\n{options.model} model, {GLOBAL_PROMPTS} prompts x {K} completions x {T} tokens per step, "
        f"{os.cpu_count()} CPU cores, medians (min-max) over {options.repeats} repeats"
    )
    print("| processes | step time (s) | wall time (s) |\n|---|---|---|")
    for side in sides:
        print(f"| {side} | {summary(step_times[side])} | {summary(walls[side])} |")
    for side in sides[1:]:
        ratio = statistics.median(step_times[side]) / statistics.median(step_times["1"])
        print(f"\nstep time ratio {side} processes / 1 process: {ratio:.2f}")


if __name__ == "__main__":
    main()
