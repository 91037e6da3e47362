"""Render ``benchmarks/results.json`` (from bench_vs_trl.py) as the tables of BENCHMARKS.md.

.venv/bin/python benchmarks/render.py > benchmarks/tables.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_vs_trl import model_flops  # noqa: E402
from common import BenchCase  # noqa: E402


def fmt(triple: list[float], digits: int = 3) -> str:
    median, low, high = triple
    return f"{median:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def case_rows(results: dict[str, Any]) -> list[str]:
    peak = results["peak_flops"]
    lines = [
        "| case | step s rloo | step s TRL | **step ratio** | generate s rloo / TRL | log-probs s rloo / TRL "
        "| train s rloo / TRL | gen tok/s rloo / TRL | peak RSS MiB rloo / TRL | **RSS ratio** | MFU rloo / TRL |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["cases"]:
        case = BenchCase(**row["case"])
        ours, trl = row["rloo"], row["trl"]
        flops = model_flops(ours, case)
        lines.append(
            f"| {case.name} | {fmt(ours['seconds'])} | {fmt(trl['seconds'])} "
            f"| **{ours['seconds'][0] / trl['seconds'][0]:.2f}** "
            f"| {ours['generate'][0]:.3f} / {trl['generate'][0]:.3f} "
            f"| {ours['logprobs'][0]:.3f} / {trl['logprobs'][0]:.3f} "
            f"| {ours['train'][0]:.3f} / {trl['train'][0]:.3f} "
            f"| {ours['tokens_per_second'][0]:.0f} / {trl['tokens_per_second'][0]:.0f} "
            f"| {ours['peak_rss_mib']:.0f} / {trl['peak_rss_mib']:.0f} "
            f"| **{ours['peak_rss_mib'] / trl['peak_rss_mib']:.2f}** "
            f"| {flops / ours['seconds'][0] / peak:.1%} / {flops / trl['seconds'][0] / peak:.1%} |"
        )
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
    lines = [
        "| case | step s | completion tokens / step | ms per completion token |",
        "|---|---|---|---|",
    ]
    for row in results.get("scaling", []):
        case = BenchCase(**row["case"])
        ours = row["rloo"]
        per_token = 1000 * ours["seconds"][0] / max(ours["completion_tokens"], 1)
        lines.append(f"| {case.name} | {fmt(ours['seconds'])} | {ours['completion_tokens']:.0f} | {per_token:.3f} |")
    return lines


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "results.json"
    results = json.loads(path.read_text())
    print(f"Peak fp32 matmul measured in the same run: {results['peak_flops'] / 1e9:.0f} GFLOP/s.\n")
    print("### rloo vs TRL 1.13 RLOOTrainer (seconds per optimizer step; median (min-max))\n")
    print("\n".join(case_rows(results)))
    print("\n### Sampling: rloo's sampler vs transformers `generate`\n")
    print("\n".join(generation_rows(results)))
    print("\n### Scaling of rloo's step time (tiny model)\n")
    print("\n".join(scaling_rows(results)))


if __name__ == "__main__":
    main()
