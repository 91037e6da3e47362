"""Render ``benchmarks/results.json`` (from bench_vs_trl.py) as the tables of BENCHMARKS.md.

.venv/bin/python benchmarks/render.py [results.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import BenchCase  # noqa: E402
from summary import mfu  # noqa: E402


def fmt(triple: list[float], digits: int = 2) -> str:
    median, low, high = triple
    return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def label(row: dict[str, Any]) -> str:
    case = BenchCase(**row["case"])
    return f"{case.kind}: {case.name}"


def step_rows(results: dict[str, Any]) -> list[str]:
    """Step seconds of every implementation and rloo's ratio to each TRL."""
    impls = results["implementations"]
    trls = [name for name in impls if name != "rloo"]
    lines = [
        "| case | "
        + " | ".join(f"step s {name}" for name in impls)
        + " | "
        + " | ".join(f"**rloo / {name}**" for name in trls)
        + " |",
        "|---" * (1 + len(impls) + len(trls)) + "|",
    ]
    for row in results["cases"]:
        runs = row["runs"]
        ours = runs["rloo"]["seconds"][0]
        cells = [fmt(runs[name]["seconds"]) for name in impls]
        ratios = [f"**{ours / runs[name]['seconds'][0]:.2f}**" for name in trls]
        lines.append(f"| {label(row)} | " + " | ".join(cells + ratios) + " |")
    return lines


def phase_rows(results: dict[str, Any]) -> list[str]:
    """Per case and implementation: phases, throughput, memory, FLOPs and MFU."""
    peak = results["peak_flops"]
    lines = [
        "| case | impl | generate s | score s | log-probs s | train s | completion tok/s | peak RSS MiB "
        "| RSS at start MiB | RSS ratio to rloo | GFLOP / step | **FLOPs / minimum** | MFU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["cases"]:
        ours = row["runs"]["rloo"]
        for name, run in row["runs"].items():
            lines.append(
                f"| {label(row)} | {name} | {run['generate'][0]:.2f} | {run['score'][0]:.3f} "
                f"| {run['logprobs'][0]:.2f} | {run['train'][0]:.2f} | {run['tokens_per_second'][0]:.0f} "
                f"| {run['peak_rss_mib']:.0f} | {run['rss_at_start_mib']:.0f} "
                f"| {ours['peak_rss_mib'] / run['peak_rss_mib']:.2f} | {run['flops'] / 1e9:.0f} "
                f"| **{run['flop_ratio']:.2f}** | {mfu(run, peak):.1%} |"
            )
    return lines


def length_rows(results: dict[str, Any]) -> list[str]:
    """Each case's completion lengths: prompt tokens, each implementation's mean length and share
    at the limit, and (varied lengths) the distribution sampled once by rloo's sampler."""
    lines = [
        "| case | prompt tokens | mean completion length ("
        + ", ".join(results["implementations"])
        + ") | at the limit | sampled distribution (64 completions) |",
        "|---|---|---|---|---|",
    ]
    for row in results["cases"]:
        runs = row["runs"].values()
        means = " / ".join(f"{run['mean_length']:.1f}" for run in runs)
        limit = " / ".join(f"{run['clipped_ratio']:.0%}" for run in runs)
        dist = row.get("lengths")
        sampled = (
            f"median {dist['median']:.0f}, p10 {dist['p10']:.0f}, p90 {dist['p90']:.0f}, "
            f"mean {dist['mean']:.1f}, {dist['at_limit']:.0%} at {dist['max_completion_length']}"
            if dist
            else "every completion runs to the limit"
        )
        prompt = next(iter(row["runs"].values()))["prompt_length"]
        lines.append(f"| {label(row)} | {prompt} | {means} | {limit} | {sampled} |")
    return lines


def generation_rows(results: dict[str, Any]) -> list[str]:
    lines = [
        "| model | rows x new tokens | rloo tok/s | transformers generate tok/s | **ratio** |",
        "|---|---|---|---|---|",
    ]
    for row in results.get("generation", []):
        lines.append(
            f"| {row['model']} | {row['rows']} x {row['tokens']} | {row['rloo']:.0f} | {row['transformers']:.0f} "
            f"| **{row['rloo'] / row['transformers']:.2f}** |"
        )
    return lines


def scaling_rows(results: dict[str, Any]) -> list[str]:
    lines = ["| case | step s | completion tokens / step | ms per completion token |", "|---|---|---|---|"]
    for row in results.get("scaling", []):
        ours = row["rloo"]
        per_token = 1000 * ours["seconds"][0] / max(ours["completion_tokens"], 1)
        name = BenchCase(**row["case"]).name
        lines.append(f"| {name} | {fmt(ours['seconds'])} | {ours['completion_tokens']:.0f} | {per_token:.3f} |")
    return lines


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results.json"
    results = json.loads(path.read_text())
    after = results.get("peak_flops_after")
    print(
        f"Peak fp32 matmul measured in the same run: {results['peak_flops'] / 1e9:.0f} GFLOP/s at the start"
        + (f", {after / 1e9:.0f} at the end" if after else "")
        + ".\n"
    )
    print("### Seconds per optimizer step; median (min-max)\n")
    print("\n".join(step_rows(results)))
    print("\n### Phases, throughput, memory and FLOPs (medians)\n")
    print("\n".join(phase_rows(results)))
    print("\n### Prompt and completion lengths of each case\n")
    print("\n".join(length_rows(results)))
    print("\n### Sampling: rloo's sampler vs transformers `generate`\n")
    print("\n".join(generation_rows(results)))
    if results.get("scaling"):
        print("\n### Scaling of rloo's step time (tiny model)\n")
        print("\n".join(scaling_rows(results)))


if __name__ == "__main__":
    main()
