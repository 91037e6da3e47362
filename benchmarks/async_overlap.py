"""Does sampling in a worker process (``rollout_workers: 1``) overlap the trainer's steps on this machine?

    .venv/bin/python benchmarks/async_overlap.py            # 3 settings x 1 run, about 3 minutes on 2 cores
    .venv/bin/python benchmarks/async_overlap.py --steps 6  # shorter
    .venv/bin/python benchmarks/async_overlap.py --case varied --only "synchronous;worker"  # bench_vs_trl's case
    python3 benchmarks/async_overlap.py --only synchronous --no-cudnn-sdp --hidden 1024 --layers 8 --tokens 256
        # on a GPU, cuDNN attention off: issue 38's bf16 repro (benchmarks/gpu_vs_trl.sh runs it both ways)

The same run three ways, at equal completions (every setting trains the same number of generation batches of
the same size; ``max_staleness`` 1 everywhere but the first, so the batches are sampled by the same versions):

- ``synchronous``: ``max_staleness`` 0, one process, 2 torch threads;
- ``pipelined, in the trainer``: ``max_staleness`` 1, ``rollout_workers`` 0, one process, 2 threads;
- ``worker``: ``max_staleness`` 1, ``rollout_workers`` 1: the trainer with 1 thread and the worker with 1;
- ``worker, trainer with 2 threads``: the same, the trainer with 2 threads (3 threads on 2 cores);
- ``2 workers``, ``4 workers`` (not run by default): each samples a share of the batch; on one GPU, where a
  small model's decoding is bound by kernel launches, the shares decode side by side.

With workers it also prints the trainer's wait for the batch, the slowest worker's idle time and its time
receiving and loading weights (``async/*`` metrics), per step.

It prints seconds per step and per 1,000 completions, and the trainer's time in the rollout phase (waiting for
the worker, or sampling itself) against the rest of the step. A tiny Llama (hidden 256, 4 layers) on the demo's
arithmetic prompts, 64-token completions, so that sampling is most of a synchronous step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import prompts, reward_sevens

from rloo import RLOOConfig, RLOOTrainer
from rloo.tiny import build_char_tokenizer, build_tiny_llama

SETTINGS = {
    "synchronous": ({"max_staleness": 0}, 2),
    "pipelined, in the trainer": ({"max_staleness": 1}, 2),
    "worker": ({"max_staleness": 1, "rollout_workers": 1}, 1),
    "worker, trainer with 2 threads": ({"max_staleness": 1, "rollout_workers": 1}, 2),
    "2 workers": ({"max_staleness": 1, "rollout_workers": 2}, 1),  # for a GPU: on 2 CPU cores they share them
    "4 workers": ({"max_staleness": 1, "rollout_workers": 4}, 1),
    # on a GPU rloo trains under bf16 autocast by default, and the trainer's process samples in it too, while a
    # worker's copy samples in float32: these take autocast out of both
    "synchronous, fp32": ({"max_staleness": 0, "bf16": False}, 2),
    "worker, fp32": ({"max_staleness": 1, "rollout_workers": 1, "bf16": False}, 1),
    "4 workers, fp32": ({"max_staleness": 1, "rollout_workers": 4, "bf16": False}, 1),
    # free_running against the pipeline at s = 2: the mean staleness (lower when the worker is the bottleneck)
    "worker, s=2": ({"max_staleness": 2, "rollout_workers": 1}, 1),
    "worker, s=2, free_running": ({"max_staleness": 2, "rollout_workers": 1, "free_running": True}, 1),
    "synchronous, bf16": ({"max_staleness": 0, "bf16": True}, 2),  # bf16 autocast on a CPU too
    "worker, bf16": ({"max_staleness": 1, "rollout_workers": 1, "bf16": True}, 1),
}


def length_reward(completion_ids: list[list[int]], **_: object) -> list[float]:
    return [len(ids) / 64 for ids in completion_ids]  # rewards longer completions: the lengths move with training


def varied_model(folder: Path) -> Path:
    """bench_vs_trl.py's ``small-varied`` model folder (:mod:`varied_lengths`), built under ``folder``."""
    from bench_vs_trl import VARIED_REACH
    from sampler_speed import build_model
    from varied_lengths import arrange, hazard_for

    return arrange(build_model(folder, "small"), folder / "small-varied", hazard_for(128, VARIED_REACH))


def one_run(knobs: dict[str, int], threads: int, steps: int, out: Path, size: argparse.Namespace) -> dict[str, float]:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # one mixed-precision setting per process otherwise
    torch.set_num_threads(threads)
    model: Any
    reward, case = length_reward, {}
    if size.model_dir is not None:  # bench_vs_trl's varied case (run_rloo.py's settings): 4 prompts x 8
        tokenizer, model, generations = None, str(size.model_dir), 8
        rows = prompts(32 * steps)
        reward, case = reward_sevens, {"learning_rate": 1e-5, "beta": 0.05, "temperature": 1.0, "bf16": False}
    else:
        tokenizer, generations = build_char_tokenizer(), 4
        model = build_tiny_llama(
            len(tokenizer), hidden_size=size.hidden, num_layers=size.layers, tokenizer=tokenizer, seed=0
        )
        rows = [{"prompt": f"{a}+{b}="} for a in range(10, 99) for b in range(10, 20)]
    args = RLOOConfig(
        output_dir=str(out),
        num_generations=generations,
        per_device_train_batch_size=32,
        max_completion_length=size.tokens,
        max_steps=steps,
        logging_steps=1,
        save_steps=10_000,
        report_to=[],
        seed=0,
        **{**case, **knobs},
    )
    trainer = RLOOTrainer(model, reward, args=args, train_dataset=rows, processing_class=tokenizer)
    began = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - began
    logged = [row for row in trainer.state.log_history if "timing/rollout" in row][1:]  # the first: warm-up
    rollout = sum(row["timing/rollout"] for row in logged) / len(logged)
    step = sum(row["timing/step"] for row in logged) / len(logged)
    result = {
        "seconds": seconds,
        "per_step": step,
        "per_1000_completions": 1000 * step / 32,
        "rollout_phase": rollout,
        "rest_of_step": step - rollout,
        "staleness": sum(row.get("staleness", 0.0) for row in logged) / len(logged),
        "steps": [round(row["timing/step"], 3) for row in logged],
        "rollout_phases": [round(row["timing/rollout"], 3) for row in logged],
        # completions' mean and longest length per step (the longest is the decode steps of a synchronous step)
        "mean_lengths": [row.get("completions/mean_length") for row in logged],
        "max_lengths": [row.get("completions/max_length") for row in logged],
    }
    phases = sorted({key for row in logged for key in row if key.startswith("timing/") and key != "timing/step"})
    result["phases"] = {key[7:]: round(sum(row.get(key, 0.0) for row in logged) / len(logged), 3) for key in phases}
    for key in ("async/trainer_wait_seconds", "async/worker_idle_seconds", "async/weight_sync_seconds"):
        if all(key in row for row in logged):
            result[key.split("/")[1]] = sum(row[key] for row in logged) / len(logged)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=256, help="the Llama's hidden size")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64, help="max_completion_length")
    parser.add_argument(
        "--case",
        choices=["tiny-llama", "varied"],
        default="tiny-llama",
        help="varied: bench_vs_trl.py's varied-length case (its 36M-parameter model arranged to end completions "
        "at varied lengths, 4 prompts x 8 of up to 128 tokens); --hidden/--layers/--tokens are then ignored",
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here (after each setting)")
    parser.add_argument("--merge", action="store_true", help="add to the results already in --out")
    parser.add_argument(
        "--no-cudnn-sdp",
        action="store_true",
        help="torch.backends.cuda.enable_cudnn_sdp(False): cuDNN attention off (issue 38's bf16 repro); the "
        "settings' names get ', cuDNN SDPA off'",
    )
    parser.add_argument(
        "--only",
        default=";".join(list(SETTINGS)[:4]),
        help=f"the settings to run, separated by ; (of {list(SETTINGS)})",
    )
    options = parser.parse_args()
    chosen = {name: SETTINGS[name] for name in options.only.split(";")}
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    print(f"{device}: Llama hidden {options.hidden}, {options.layers} layers, {options.tokens}-token completions")
    suffix = ""
    if options.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
        suffix = ", cuDNN SDPA off"
    saved = json.loads(options.out.read_text()) if options.merge and options.out and options.out.exists() else {}
    results = saved.get("results", {})
    with tempfile.TemporaryDirectory() as folder:
        options.model_dir = None
        if options.case == "varied":
            options.model_dir = varied_model(Path(folder))
            options.tokens = 128
            print(f"bench_vs_trl's varied case instead: {options.model_dir.name}, 4 prompts x 8 x 128 tokens")
        for i, (name, (knobs, threads)) in enumerate(chosen.items()):
            result = results[name + suffix] = one_run(knobs, threads, options.steps, Path(folder) / str(i), options)
            shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
            print(name + suffix, json.dumps(shown), flush=True)
            if options.out is not None:  # after each setting: a run cut short keeps what it measured
                written = {"device": device, "size": vars(options), "results": results}
                partial = options.out.with_suffix(".partial")  # replaced whole: a kill never leaves half a file
                partial.write_text(json.dumps(written, default=str))
                os.replace(partial, options.out)
    base = results.get("synchronous" + suffix, next(iter(results.values())))["per_step"]
    print("\n| setting | s / step | s / 1,000 completions | rollout phase s | rest of step s | vs synchronous |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['per_step']:.2f} | {r['per_1000_completions']:.1f} | {r['rollout_phase']:.2f} "
            f"| {r['rest_of_step']:.2f} | {base / r['per_step']:.2f}x |"
        )


if __name__ == "__main__":
    main()
