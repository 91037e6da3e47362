"""rloo vs. TRL 1.13's RLOOTrainer, side by side on identical inputs; writes BENCHMARKS.md.

    .venv/bin/python benchmarks/bench_vs_trl.py            # full run (about 30-40 min on 2 cores)
    .venv/bin/python benchmarks/bench_vs_trl.py --quick    # tiny model only, fewer repeats

TRL is installed by this script into ``benchmarks/.venv-trl`` (its own virtual
environment; not a dependency of rloo). Both implementations load the same locally built
Llama model folder and character tokenizer, train on the same prompts with the same
reward function and TRL's default math (k1 KL in the reward with beta 0.05, sequence-level
ratio, num_iterations 1), fp32, no gradient checkpointing, temperature 1.0, the same
learning rate and batch. Each (implementation, case, repeat) runs in a fresh process;
runs alternate between the implementations. Figures are medians over steps 2..N and
repeats, with min-max.
"""

from __future__ import annotations

import argparse
import json
import statistics
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
from common import MODEL_SIZES, BenchCase  # noqa: E402
from sampler_speed import build_model, generation_speed  # noqa: E402

TRL_VENV = HERE / ".venv-trl"
TRL_PACKAGES = ["torch==2.13.0", "trl==1.13.0", "requests", "psutil"]
CASES = [(2, 4, 32), (8, 8, 64), (4, 16, 128)]


def ensure_trl_venv() -> Path:
    """Create TRL's virtual environment once (pip pulls the CPU torch pin first)."""
    python = TRL_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", TRL_PACKAGES[0]], check=True)
        import transformers

        pins = [f"transformers=={transformers.__version__}"]
        subprocess.run([str(python), "-m", "pip", "install", "-q", *TRL_PACKAGES[1:], *pins], check=True)
    return python


def build_models(folder: Path) -> dict[str, Path]:
    return {name: build_model(folder, name) for name in MODEL_SIZES}


def check_tokenizer_round_trip(python: Path, model_dir: Path) -> None:
    """Both environments must load our tokenizer class and round-trip text exactly."""
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
    env = {"PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false", "PATH": "/usr/bin:/bin"}
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


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (and min-max) over steps 2..N of every repeat."""
    steps = [s for run in runs for s in run["steps"][1:]]
    out: dict[str, Any] = {}
    for key in ("seconds", "generate", "score", "logprobs", "train"):
        values = [s[key] for s in steps]
        out[key] = (statistics.median(values), min(values), max(values))
    tokens = [s["completion_tokens"] / s["seconds"] for s in steps]
    out["tokens_per_second"] = (statistics.median(tokens), min(tokens), max(tokens))
    out["completion_tokens"] = statistics.median(s["completion_tokens"] for s in steps)
    out["peak_rss_mib"] = statistics.median(run["peak_rss_mib"] for run in runs)
    out["parameters"] = runs[0]["parameters"]
    return out


def model_flops(summary: dict[str, Any], case: BenchCase, prompt_tokens: int = 6) -> float:
    """2N per generated or scored token, 6N per trained token (one reference pass scored)."""
    n = summary["parameters"]
    completions = case.num_prompts * case.num_generations
    tokens = summary["completion_tokens"] + completions * prompt_tokens
    return 2 * n * summary["completion_tokens"] + 2 * n * tokens + 6 * n * tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model only, 1 repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results.json"))
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args()
    models = ["tiny"] if args.quick else args.models.split(",")
    repeats = 1 if args.quick else args.repeats
    trl_python = ensure_trl_venv()
    ours = Path(sys.executable)
    results: dict[str, Any] = {"cases": [], "scaling": [], "peak_flops": measure_peak_matmul_flops()}
    with tempfile.TemporaryDirectory() as tmp:
        folders = build_models(Path(tmp))
        for name in models:
            check_tokenizer_round_trip(ours, folders[name])
            check_tokenizer_round_trip(trl_python, folders[name])
        for name in models:
            for p, k, t in CASES:
                case = BenchCase(name, p, k, t, steps=args.steps)
                runs: dict[str, list[dict[str, Any]]] = {"rloo": [], "trl": []}
                for repeat in range(repeats):
                    order = [("rloo", ours, "run_rloo.py"), ("trl", trl_python, "run_trl.py")]
                    for impl, python, script in order if repeat % 2 == 0 else order[::-1]:
                        runs[impl].append(run_child(python, script, folders[name], case, {}))
                        print(f"{case.name} {impl} repeat {repeat}: done", flush=True)
                results["cases"].append(
                    {"case": asdict(case), "rloo": summarize(runs["rloo"]), "trl": summarize(runs["trl"])}
                )
        results["generation"] = [generation_speed(folders[name], name) for name in models]
        if not args.skip_scaling:
            results["scaling"] = scaling(ours, folders["tiny"], args.steps)
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
