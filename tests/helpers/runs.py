"""A synthetic run folder, as the trainer writes it, for the report tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

NUM_STEPS = 20
EVAL_EVERY = 5
# reward, per-function (2), KL, entropy, lengths, clipped ratio, clip ratios, loss, LR, grad norm, learning
# signal, eval reward
NUM_PLOTS = 12
NASTY = '<script>alert("x")</script> & <b>bold</b>'


def healthy_metrics(num_steps: int = NUM_STEPS) -> list[dict[str, Any]]:
    """A run that learns: reward rises, KL stays small, nothing clipped or empty."""
    rows: list[dict[str, Any]] = []
    for step in range(1, num_steps + 1):
        t = step / num_steps
        rows.append(
            {
                "step": float(step),
                "epoch": t,
                "reward": 0.1 + 0.7 * t,
                "reward_std": 0.3 - 0.1 * t,
                "rewards/accuracy/mean": 0.1 + 0.6 * t,
                "rewards/accuracy/std": 0.3,
                "rewards/format/mean": 0.5 + 0.4 * t,
                "rewards/format/std": 0.2,
                "frac_reward_zero_std": 0.1,
                "kl": 0.02 * t,
                "entropy": 1.5 - 0.5 * t,
                "completions/mean_length": 40.0 - 10 * t,
                "completions/min_length": 12.0,
                "completions/max_length": 64.0,
                "completions/clipped_ratio": 0.05,
                "clip_ratio/low_mean": 0.01,
                "clip_ratio/high_mean": 0.02,
                "clip_ratio/region_mean": 0.03,
                "learning_rate": 1e-6 * (1 - t),
                "grad_norm": 0.5 + t,
                "loss": 0.01 * (1 - t),
            }
        )
        if step % EVAL_EVERY == 0:
            rows.append({"step": float(step), "epoch": t, "eval_reward": 0.7 * t, "eval_reward_std": 0.1})
    return rows


def completions(steps: list[int], per_step: int = 16) -> list[dict[str, Any]]:
    """``per_step`` rows per step; reward ``step + i / 100``, so the best and worst are known."""
    rows = []
    for step in steps:
        for i in range(per_step):
            rows.append(
                {
                    "step": step,
                    "prompt": [{"role": "user", "content": f"question {step}-{i}"}],
                    "completion": f"answer {step}-{i}",
                    "reward": step + i / 100,
                    "advantage": i / 10 - 0.75,
                }
            )
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def make_run(
    run_dir: Path,
    metrics: list[dict[str, Any]] | None = None,
    completion_rows: list[dict[str, Any]] | None = None,
    warnings: list[str] | None = None,
) -> Path:
    """Write config.yaml, metrics.jsonl, completions.jsonl and warnings.log into ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {"model": "tiny", "learning_rate": 1e-6, "beta": 0.05, "reward_weights": [1.0, 0.5], "note": "a < b & c"}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    write_jsonl(run_dir / "metrics.jsonl", healthy_metrics() if metrics is None else metrics)
    default_completions = [
        *completions([0, 5, 10, 15]),
        {"step": 15, "prompt": "p", "completion": NASTY, "reward": 15.5, "advantage": 1.0},
        {"step": 15, "prompt": "p", "completion": "x" * 1000, "reward": 15.6, "advantage": 1.0},
    ]
    write_jsonl(run_dir / "completions.jsonl", default_completions if completion_rows is None else completion_rows)
    (run_dir / "warnings.log").write_text("\n".join(warnings or ["reward function <fmt> raised on 2 completions"]))
    return run_dir
