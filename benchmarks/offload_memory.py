"""Peak memory of rloo's training step with activation offloading and FSDP2 parameter offload (issue 29).

    python3 benchmarks/offload_memory.py --out offload.json            # on a GPU (about 2 min on one H100)
    .venv/bin/python benchmarks/offload_memory.py --quick --out q.json  # a tiny model on the CPU (a smoke run)

Four cases, each in a process of its own (``max_memory_allocated`` is per process, and an earlier case's
leftovers would read as a later one's peak): the plain step; ``activation_offloading: true``; FSDP2 with
``fsdp_offload_params: true`` over one process (the shards, gradients and AdamW state in CPU memory; set
through the variables ``accelerate launch`` exports); both. Each trains one generation batch (sampling,
log-prob passes) and its optimizer steps (the second with AdamW's state), and reports the peak of each
phase: ``torch.cuda.max_memory_allocated`` on a GPU, the live tensor bytes on the CPU
(``benchmarks/memory_measure.py``), and each step's loss and gradient norm, which every case should share
with the plain one (offloading moves memory; it changes no number).

The default model is random-init with Qwen2.5-0.5B's shape (24 layers, hidden 896, 151,936-token vocabulary,
tied embeddings: 494M parameters; ``--layers`` / ``--hidden`` / ``--intermediate`` change it) under bf16
autocast over float32 weights (rloo's default on a GPU; ``--weights bfloat16`` stores them in bf16); a
reference copy (beta 0.05). On the CPU both offloads move nothing (the "device" is CPU memory):
activation offloading is off there (the trainer warns), and FSDP2's offloaded shards stay where they are.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

MiB = 2**20
PHASES = ("sampling", "log-probs", "training")
FSDP_OFFLOAD = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "true"}
CASES: dict[str, dict[str, Any]] = {  # name -> RLOOConfig overrides and launch variables
    "plain": {"config": {}, "env": {}},
    "activation offloading": {"config": {"activation_offloading": True}, "env": {}},
    "FSDP2 parameter offload (1 process)": {"config": {}, "env": FSDP_OFFLOAD},
    "both": {"config": {"activation_offloading": True}, "env": FSDP_OFFLOAD},
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 2-layer model on the CPU, short sequences")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--intermediate", type=int, default=None)
    parser.add_argument("--weights", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--prompt-length", type=int, default=None, help="tokens (default 384; --quick 32)")
    parser.add_argument("--completion-length", type=int, default=None, help="tokens (default 64; --quick 8)")
    parser.add_argument("--micro-batch", type=int, default=16, help="rows per optimizer step")
    parser.add_argument("--case", default=None, help=f"run one case in this process: one of {list(CASES)}")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    return parser.parse_args(argv)


def model_config(options: argparse.Namespace) -> Any:
    from gpu_checks import qwen_shape

    asked = {
        "num_hidden_layers": options.layers,
        "hidden_size": options.hidden,
        "intermediate_size": options.intermediate,
    }
    return qwen_shape(options.quick, **{k: v for k, v in asked.items() if v is not None})


def workload(options: argparse.Namespace) -> tuple[dict[str, Any], int]:
    """The RLOOConfig of every case (one generation batch: 2 optimizer steps of ``--micro-batch`` rows, K = 8)
    and the prompt length in tokens."""
    import torch

    completion = options.completion_length or (8 if options.quick else 64)
    config = {
        "num_generations": 8,
        "per_device_train_batch_size": options.micro_batch,
        "steps_per_generation": 2,
        "max_completion_length": completion,
        "bf16": not options.quick,
        "beta": 0.05,
        "_weights_dtype": getattr(torch, options.weights),
    }
    return config, options.prompt_length or (32 if options.quick else 384)


@contextlib.contextmanager
def variables(env: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_case(name: str, options: argparse.Namespace) -> dict[str, Any]:
    """One case in this process: its phases' peaks (bytes), and each optimizer step's loss and gradient norm."""
    import torch
    from memory_measure import measure_step

    device = "cuda" if torch.cuda.is_available() and not options.quick else "cpu"
    config, prompt_length = workload(options)
    case = CASES[name]
    with variables(case["env"]):
        measured = measure_step(
            model_config(options), {**config, **case["config"]}, prompt_length, device=device, steps=1
        )
    steps = [row for row in measured.log_history if "loss" in row and "grad_norm" in row]
    return {
        "phases": measured.phases,
        "peak": measured.peak,
        "losses": [row["loss"] for row in steps],
        "grad_norms": [row["grad_norm"] for row in steps],
        "seconds": measured.step_seconds,
    }


def case_command(name: str, options: argparse.Namespace, out: Path) -> list[str]:
    """The command line that runs case ``name`` alone with these options, writing its result to ``out``."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(options).items() if v not in (None, False)]
    flags = [f for f in flags if not f.startswith(("--case=", "--out=", "--quick=", "--timeout="))]
    return [sys.executable, __file__, *flags, *(["--quick"] if options.quick else []), f"--case={name}", f"--out={out}"]


def child(name: str, options: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Run case ``name`` in a process of its own; its result, or what went wrong."""
    command = case_command(name, options, out)
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=options.timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {options.timeout:.0f} s"}
    if done.returncode != 0 or not out.is_file():
        return {"error": (done.stdout + done.stderr)[-3000:]}
    return {**json.loads(out.read_text()), "wall_seconds": time.perf_counter() - start}


def table(results: dict[str, Any]) -> str:
    rows = [
        "| case | sampling MiB | log-probs MiB | training MiB | peak MiB | peak vs plain | losses, grad norms "
        "vs plain |",
        "|---|---|---|---|---|---|---|",
    ]
    plain = results["cases"].get("plain", {})
    for name, got in results["cases"].items():
        if "error" in got:
            rows.append(f"| {name} | failed: {got['error'].strip().splitlines()[-1][:120]} | | | | | |")
            continue
        phases = " | ".join(f"{got['phases'].get(p, 0) / MiB:,.0f}" for p in PHASES)
        ratio = f"{got['peak'] / plain['peak']:.2f}" if plain.get("peak") else "-"
        same = "-"
        if plain.get("losses") and name != "plain":
            ours, theirs = got["losses"] + got["grad_norms"], plain["losses"] + plain["grad_norms"]
            gaps = [abs(a - b) for a, b in zip(ours, theirs, strict=False)]  # a failed step logs fewer
            same = f"max diff {max(gaps):.1e}" if gaps else "-"
        rows.append(f"| {name} | {phases} | {got['peak'] / MiB:,.0f} | {ratio} | {same} |")
    return "\n".join(rows)


def main() -> None:
    options = parse()
    if options.case is not None:
        result = run_case(options.case, options)
        if options.out:
            Path(options.out).write_text(json.dumps(result))
        print(json.dumps(result))
        return
    import torch
    import transformers

    gpu = torch.cuda.is_available() and not options.quick
    config, prompt_length = workload(options)
    shape = model_config(options)
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "model": {k: getattr(shape, k) for k in ("num_hidden_layers", "hidden_size", "intermediate_size")},
        "weights": options.weights,
        "workload": {**{k: v for k, v in config.items() if not k.startswith("_")}, "prompt_length": prompt_length},
        "cases": {},
    }
    print(f"device: {results['device']}, torch {torch.__version__}, transformers {transformers.__version__}")
    scratch = Path(options.out or "offload_memory.json").with_suffix(".case.json")
    for name in CASES:
        try:
            results["cases"][name] = child(name, options, scratch)
        except Exception:
            results["cases"][name] = {"error": traceback.format_exc()}
        scratch.unlink(missing_ok=True)
        print(name, json.dumps(results["cases"][name])[:400], flush=True)
        if options.out:  # after each case: a run cut short keeps what it measured
            Path(options.out).write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
