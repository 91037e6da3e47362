"""The health monitors on normal runs: how often each fires, and whether ``loss_spike`` catches an
injected gradient-norm spike (docs/reliability.md, "Health monitors", quotes its numbers).

    .venv/bin/python benchmarks/health_calibration.py                 # 51 runs, ~10 min on 2 idle cores
    .venv/bin/python benchmarks/health_calibration.py --out runs/calib --quick   # 4 runs

Normal runs of the tiny Llama (``rloo.tiny.save_tiny_model``) on "a+b=" prompts: LoRA (r=8 on
q_proj/v_proj, learning rate 1e-4) and full fine-tuning (1e-5), two rewards (the count of 7s minus
a length penalty: dense; the share of 7s: sparse, so some steps have no task-reward signal at all),
seeds 0-2, 30 steps of 2 prompts x K=4 (beta 0.05), and variants: 8 prompts a step (60 steps),
beta 0, a 10x learning rate, K=8 (100 steps). Every step is logged (``logging_steps=1``) and its
metrics replayed through :class:`rloo.training.monitoring.health.HealthMonitor` with the default
thresholds: the firings are those the run warned about. Then each run is replayed again with its
``grad_norm`` multiplied by 5, 10 or 100 at one step with a signal (steps 12, 18, ...), counting
how often ``loss_spike`` fires there.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

VARIANTS: dict[str, dict[str, Any]] = {
    "": {},
    "-b32": {"per_device_train_batch_size": 32, "max_steps": 60},
    "-beta0": {"beta": 0.0},
    "-lr10x": {"lr_scale": 10.0},
}
LONG = {"num_generations": 8, "per_device_train_batch_size": 16, "max_steps": 100}  # K=8, 100 steps


def count_sevens(completions: list[str], **kwargs: Any) -> list[float]:
    return [text.count("7") - 0.1 * len(text) for text in completions]


def share_of_sevens(completions: list[str], **kwargs: Any) -> list[float]:
    return [text.count("7") / max(len(text), 1) for text in completions]


def cases(quick: bool) -> list[tuple[str, str, Any, int, dict[str, Any]]]:
    """``(name, lora or full, reward, seed, config changes)`` of every calibration run."""
    out = [
        (f"{kind}-{reward.__name__}-s{seed}{suffix}", kind, reward, seed, changes)
        for seed in (0, 1, 2)
        for kind in ("lora", "full")
        for reward in (count_sevens, share_of_sevens)
        for suffix, changes in VARIANTS.items()
    ]
    out += [
        (f"{kind}-{reward.__name__}-s0-k8-100", kind, reward, 0, LONG)
        for kind, reward in (("lora", share_of_sevens), ("full", share_of_sevens), ("lora", count_sevens))
    ]
    return out[:4] if quick else out


def train(out: Path, model: Path, name: str, kind: str, reward: Any, seed: int, changes: dict[str, Any]) -> None:
    from peft import LoraConfig

    from rloo import RLOOConfig, RLOOTrainer

    changes = dict(changes)
    learning_rate = (1e-4 if kind == "lora" else 1e-5) * changes.pop("lr_scale", 1.0)
    values = {"num_generations": 4, "max_steps": 30, "learning_rate": learning_rate, **changes}
    args = RLOOConfig(
        output_dir=str(out / name),
        overwrite_output_dir=True,  # an unfinished run of an earlier call
        max_completion_length=16,
        logging_steps=1,
        save_steps=10_000,
        seed=seed,
        **values,
    )
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    prompts = [{"prompt": f"{a}+{b}="} for a in range(10) for b in range(10)]
    peft_config = lora if kind == "lora" else None
    RLOOTrainer(str(model), reward, args, train_dataset=prompts, peft_config=peft_config).train()


def step_rows(run: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "train_runtime" not in row]


def firings(rows: list[dict[str, float]], spike_at: int | None = None, factor: float = 1.0) -> list[tuple[int, str]]:
    """``(step, monitor)`` of each alert over ``rows``, ``grad_norm`` times ``factor`` at ``spike_at``."""
    from rloo.config.health import default_health_thresholds
    from rloo.training.monitoring.health import HealthMonitor

    monitor, memory, found = HealthMonitor(default_health_thresholds()), {}, []  # type: ignore[var-annotated]
    for step, row in enumerate(rows, 1):
        metrics = {**row, "grad_norm": row["grad_norm"] * (factor if step == spike_at else 1.0)}
        found += [(step, alert.name) for alert in monitor.observe_step(memory, step, metrics)]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/health-calibration"))
    parser.add_argument("--quick", action="store_true", help="4 runs, to check the script")
    options = parser.parse_args()
    from rloo.tiny import save_tiny_model

    model = options.out / "tiny-model"
    if not model.exists():
        save_tiny_model(model)
    runs = []
    for name, kind, reward, seed, changes in cases(options.quick):
        if not (options.out / name / "final").is_dir():  # a finished run is kept: rerun to go on
            train(options.out, model, name, kind, reward, seed, changes)
        runs.append((name, step_rows(options.out / name)))
    alerts = {name: firings(rows) for name, rows in runs}
    steps = [row for _, rows in runs for row in rows]
    quiet = sum(row["frac_task_reward_zero_std"] >= 1 for row in steps)
    losses = [abs(row["loss"]) for row in steps]
    signs = sum(a["loss"] * b["loss"] < 0 for _, rows in runs for a, b in itertools.pairwise(rows))
    print(f"{len(runs)} runs, {len(steps)} steps, {quiet} of them with no task-reward signal")
    print(f"loss: median |loss| {statistics.median(losses):.2g}, max {max(losses):.2g}; {signs} sign changes")
    fired = Counter(monitor for found in alerts.values() for _, monitor in found)
    spiking = [name for name, found in alerts.items() if any(monitor == "loss_spike" for _, monitor in found)]
    print(f"monitors fired: {dict(fired) or 'none'}; loss_spike in {len(spiking)} runs {spiking}")
    for factor in (5.0, 10.0, 100.0):
        tries = [(rows, step) for _, rows in runs for step in range(12, len(rows) + 1, 6)]
        tries = [(rows, step) for rows, step in tries if rows[step - 1]["frac_task_reward_zero_std"] < 1]
        caught = sum((step, "loss_spike") in firings(rows, step, factor) for rows, step in tries)
        print(f"grad_norm x{factor:g} at one step: loss_spike fired there {caught}/{len(tries)}")


if __name__ == "__main__":
    main()
