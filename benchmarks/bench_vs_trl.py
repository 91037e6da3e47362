"""rloo vs. TRL's RLOOTrainer (the newest, 1.16, and 1.13) side by side on identical inputs.

    .venv/bin/python benchmarks/bench_vs_trl.py              # every case (about 45 min on 2 idle cores)
    .venv/bin/python benchmarks/bench_vs_trl.py --cases realistic --repeats 2
    .venv/bin/python benchmarks/bench_vs_trl.py --quick      # the tiny model, 1 repeat: a smoke run
    .venv/bin/python benchmarks/render.py                    # the tables of BENCHMARKS.md
    .venv/bin/python benchmarks/bench_vs_trl.py --live-memory --repeats 1 ...   # peak RSS of live tensors

Each TRL version is installed by this script into its own virtual environment
(``benchmarks/.venv-trl-<version>``; not a dependency of rloo), with our torch and transformers pins and
our peft, bitsandbytes and triton (transformers imports them wherever installed: the same imports on both sides).
All implementations load the same locally built Llama folder and character tokenizer, train on the
same prompts with the same reward and TRL's default math (k1 KL in the reward with beta 0.05,
sequence-level ratio, num_iterations 1), fp32, no gradient checkpointing, temperature 1.0, the same
learning rate and batch, each with its own defaults otherwise. Every (implementation, case, repeat)
runs in a fresh process; the order rotates each repeat. Figures are medians over steps 2..N and
repeats, with min-max.

Cases:
- **varied**: completions end at varied lengths (median about a third of the limit, 12% reach it):
  the same weights with a constant end-of-sequence probability per step (:mod:`varied_lengths`);
- **long prompt**: few-shot prompts 5x longer than the completions, K = 8;
- **fixed**: the random model that never ends (every completion runs to the limit), short prompts:
  the cases of the first benchmark, kept for continuity.

Reported per phase (generate, score, reference/old log-probs, train), completion tokens/s, peak RSS
(and RSS when training starts: imports and weights), FLOPs counted by hooks
(:class:`common.FlopCounter`) against the minimum the math needs (:mod:`summary`), and MFU against an
fp32 matmul peak measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from common import MODEL_SIZES, BenchCase, prompts  # noqa: E402
from sampler_speed import build_model, generation_speed  # noqa: E402
from summary import summarize  # noqa: E402
from varied_lengths import arrange, hazard_for, length_distribution  # noqa: E402

TRL_VERSIONS = ("1.16.0", "1.13.0")
# glibc's threshold above which a block is its own mapping, returned to the system when freed (``--live-memory``:
# a fixed one also stops glibc from raising it to 32 MiB as large blocks are freed, which keeps freed
# activations resident in the heap: peak RSS then follows the live tensors, every implementation slower)
LIVE_MEMORY_THRESHOLD = 65_536
CHILD_ENV: dict[str, str] = {}
VARIED_REACH = 0.12  # share of completions at max_completion_length in the varied case
CASES = {
    "realistic": [
        BenchCase("small-varied", 4, 8, 128, kind="varied"),
        BenchCase("small", 2, 8, 64, prompt_chars=320, kind="long prompt"),
    ],
    "fixed": [BenchCase(m, p, k, t) for m in ("tiny", "small") for p, k, t in [(2, 4, 32), (8, 8, 64), (4, 16, 128)]],
}


def label(case: BenchCase) -> str:
    """A case's name on the command line: model, P x K, T (``small-8x8-T64``)."""
    return f"{case.model}-{case.num_prompts}x{case.num_generations}-T{case.max_completion_length}"


# installed beside rloo, imported by transformers whenever present (``transformers.trainer_utils`` imports
# peft, peft imports bitsandbytes: about 190 MiB of RSS; ``from transformers import Trainer`` imports triton,
# rloo's test extra for its fused head's kernels, as CUDA torch brings it: 85 MiB): TRL's environment gets the
# same versions, so that both sides start from the same imports
SHARED_PACKAGES = ("peft", "bitsandbytes", "triton")


def shared_pins() -> list[str]:
    """``name==version`` of each :data:`SHARED_PACKAGES` installed in this (rloo's) environment."""
    from importlib.metadata import PackageNotFoundError, version

    pins = []
    for name in SHARED_PACKAGES:
        try:
            pins.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            continue
    return pins


def ensure_trl_venv(version: str) -> Path:
    """Create TRL ``version``'s virtual environment once (pip pulls the CPU torch pin first), with the
    :func:`shared_pins` of rloo's (added to an environment made before they were)."""
    venv = HERE / f".venv-trl-{version}"
    python = venv / "bin" / "python"
    if not python.exists():
        import transformers

        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0"], check=True)
        pins = [f"trl=={version}", f"transformers=={transformers.__version__}", "requests", "psutil"]
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
    shared = shared_pins()
    check = (
        "import sys, importlib.metadata as m;"
        "sys.exit(any(m.version(p.split('==')[0]) != p.split('==')[1] for p in sys.argv[1:]))"
    )
    if shared and subprocess.run([str(python), "-c", check, *shared], capture_output=True).returncode:
        subprocess.run([str(python), "-m", "pip", "install", "-q", *shared], check=True)
    return python


def build_models(folder: Path) -> dict[str, Path]:
    """The benchmark's model folders: each size, and ``<size>-varied`` (:mod:`varied_lengths`)."""
    paths = {}
    hazard = hazard_for(CASES["realistic"][0].max_completion_length, VARIED_REACH)
    for name in MODEL_SIZES:
        paths[name] = build_model(folder, name)
        paths[f"{name}-varied"] = arrange(paths[name], folder / f"{name}-varied", hazard)
    return paths


def check_tokenizer_round_trip(python: Path, model_dir: Path) -> None:
    """Every environment must load our tokenizer class and round-trip text exactly."""
    code = (
        "import sys; from transformers import AutoTokenizer;"
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); s = '12+34=46 ok';"
        "assert t.decode(t(s, add_special_tokens=False)['input_ids']) == s, 'tokenizer does not round-trip'"
    )
    subprocess.run([str(python), "-c", code, str(model_dir)], check=True)


def run_child(python: Path, script: str, model_dir: Path, case: BenchCase, options: dict[str, Any]) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = Path(handle.name)
    command = [str(python), str(HERE / script), str(model_dir), json.dumps(asdict(case)), str(out)]
    if options:
        command.append(json.dumps(options))
    env = {"PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false", "PATH": "/usr/bin:/bin", **CHILD_ENV}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=3600)
    return json.loads(out.read_text())


def measure_peak_matmul_flops(seconds: float = 3.0) -> float:
    """Best fp32 matmul FLOP/s on this machine (1024^3 GEMMs), as the efficiency reference."""
    import torch

    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        for _ in range(5):
            torch.mm(a, b)
        best = max(best, 5 * 2 * n**3 / (time.perf_counter() - start))
    return best


def run_case(case: BenchCase, impls: dict[str, tuple[Path, str]], model_dir: Path, repeats: int) -> dict[str, Any]:
    """Every implementation on ``case``, ``repeats`` times each, the order rotating each repeat."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in impls}
    names = list(impls)
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            python, script = impls[name]
            runs[name].append(run_child(python, script, model_dir, case, {}))
            print(f"{case.name} {name} repeat {repeat}: done", flush=True)
    row: dict[str, Any] = {"case": asdict(case), "runs": {name: summarize(r) for name, r in runs.items()}}
    if case.kind == "varied":
        texts = [p["prompt"] for p in prompts(case.num_prompts, case.prompt_chars)]
        row["lengths"] = length_distribution(model_dir, texts, 16, case.max_completion_length)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model's fixed cases, 1 repeat, 3 steps")
    parser.add_argument("--cases", default="realistic,fixed", help="comma-separated: realistic, fixed")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run; the first is not timed")
    parser.add_argument("--trl", default=",".join(TRL_VERSIONS), help="TRL versions to compare against")
    parser.add_argument("--output", default=str(HERE / "results.json"))
    parser.add_argument("--scaling", action="store_true", help="also rloo's step time as K and T grow (tiny)")
    parser.add_argument("--only", default="", help="comma-separated case labels to keep (e.g. small-8x8-T64)")
    parser.add_argument(
        "--live-memory",
        action="store_true",
        help=f"children with MALLOC_MMAP_THRESHOLD_={LIVE_MEMORY_THRESHOLD}: peak RSS of live tensors (times slower)",
    )
    args = parser.parse_args()
    if args.live_memory:
        CHILD_ENV["MALLOC_MMAP_THRESHOLD_"] = str(LIVE_MEMORY_THRESHOLD)
    cases = [case for group in args.cases.split(",") for case in CASES[group]]
    if args.only:
        wanted = set(args.only.split(","))
        cases = [case for case in cases if label(case) in wanted]
        if not cases:
            parser.error(
                f"--only {args.only}: no such case; the labels are {[label(c) for g in CASES.values() for c in g]}"
            )
    if args.quick:
        cases, args.repeats = [c for c in CASES["fixed"] if c.model == "tiny"][:2], 1
    cases = [BenchCase(**{**asdict(c), "steps": args.steps}) for c in cases]
    impls = {"rloo": (Path(sys.executable), "run_rloo.py")}
    for version in filter(None, args.trl.split(",")):
        impls[f"trl-{version}"] = (ensure_trl_venv(version), "run_trl.py")
    results: dict[str, Any] = {"implementations": list(impls), "peak_flops": measure_peak_matmul_flops()}
    results["child_env"] = dict(CHILD_ENV)
    with tempfile.TemporaryDirectory() as tmp:
        folders = build_models(Path(tmp))
        for name in {c.model for c in cases}:
            for python, _ in impls.values():
                check_tokenizer_round_trip(python, folders[name])
        results["cases"] = [run_case(case, impls, folders[case.model], args.repeats) for case in cases]
        models = sorted({c.model for c in cases if c.model in MODEL_SIZES})
        results["generation"] = [generation_speed(folders[name], name) for name in models]
        if args.scaling:
            results["scaling"] = scaling(Path(sys.executable), folders["tiny"], args.steps)
    results["peak_flops_after"] = measure_peak_matmul_flops()
    Path(args.output).write_text(json.dumps(results, indent=1))
    print(f"results written to {args.output}; render with benchmarks/render.py")


def scaling(python: Path, model_dir: Path, steps: int) -> list[dict[str, Any]]:
    """rloo step time as K and the completion length grow (tiny model)."""
    rows = []
    for p, k, t in [(4, 2, 64), (4, 4, 64), (4, 8, 64), (4, 16, 64), (4, 4, 32), (4, 4, 128), (4, 4, 256)]:
        case = BenchCase("tiny", p, k, t, steps=steps)
        rows.append({"case": asdict(case), "rloo": summarize([run_child(python, "run_rloo.py", model_dir, case, {})])})
        print(f"scaling {case.name}: done", flush=True)
    return rows


if __name__ == "__main__":
    main()
