"""Per-run summaries of the rloo-vs-TRL benchmark: medians with min-max, FLOPs, MFU.

The minimum FLOPs a step's math needs (what no padding, no repeated prompt and no finished rows would
cost): with P distinct prompts of Tp tokens, N completions holding C tokens in all, a backbone of
``N_b`` matmul parameters and a head of ``N_h``:

    min = 2 * (N_b * (P*Tp + C - N) + N_h * C) * (1 + 1 + 3)

(sampling, the reference pass, and the training forward + backward; each encodes every prompt once
and every completion token but each row's last, and applies the head to each completion token).
"""

from __future__ import annotations

import statistics
from typing import Any

Triple = tuple[float, float, float]


def spread(values: list[float]) -> Triple:
    return statistics.median(values), min(values), max(values)


def minimum_flops(info: dict[str, Any], case: dict[str, Any], completion_tokens: int) -> float:
    """The module docstring's minimum for one step of ``case``."""
    rows = case["num_prompts"] * case["num_generations"]
    prompt = case["num_prompts"] * info["prompt_length"]
    body = info["body_parameters"] * (prompt + completion_tokens - rows)
    return 2.0 * (body + info["head_parameters"] * completion_tokens) * 5


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (and min-max) over steps 2..N of every repeat of one implementation on one case."""
    steps = [(run, s) for run in runs for s in run["steps"][1:]]
    out: dict[str, Any] = {
        key: spread([s[key] for _, s in steps]) for key in ("seconds", "generate", "score", "logprobs", "train")
    }
    out["tokens_per_second"] = spread([s["completion_tokens"] / s["seconds"] for _, s in steps])
    for key in ("completion_tokens", "mean_length", "clipped_ratio", "flops"):
        out[key] = statistics.median(s[key] for _, s in steps)
    out["min_flops"] = statistics.median(minimum_flops(r["info"], r["case"], s["completion_tokens"]) for r, s in steps)
    out["flop_ratio"] = out["flops"] / out["min_flops"]
    out["peak_rss_mib"] = statistics.median(run["peak_rss_mib"] for run in runs)
    out["rss_at_start_mib"] = statistics.median(run["info"]["rss_at_start_mib"] for run in runs)
    out["parameters"] = runs[0]["parameters"]
    out["prompt_length"] = runs[0]["info"]["prompt_length"]
    return out


def mfu(summary: dict[str, Any], peak_flops: float) -> float:
    """Model FLOPs utilisation: the step's minimum FLOPs per second over the measured matmul peak."""
    return float(summary["min_flops"] / summary["seconds"][0] / peak_flops)
