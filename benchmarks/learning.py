"""Does it learn better? Advantage estimators at equal compute on the demo task.

    .venv/bin/python benchmarks/learning.py            # the study: 4 estimators x K in {2, 4, 8} x 3 seeds
    .venv/bin/python benchmarks/learning.py --quick    # 2 estimators x K = 4 x 1 seed, fewer steps

The task is the demo's (rloo/cli/demo.py): a tiny Llama warm-started on carry-less
demonstrations to 40% held-out accuracy, then trained with the exact-answer reward. Every run
of a seed starts from the same warm start. Compute is equal across runs: each optimizer step
generates the same number of completions (``--completions`` per step, so K = 8 sees half the
prompts K = 4 sees), with the same optimizer, learning rate and steps. Held-out greedy accuracy
is measured every ``--eval-every`` steps on ``--eval-problems`` problems. Results go to
``benchmarks/learning/results.json`` and a table on stdout; ``--plot`` draws the curves
(accuracy vs generated completions) to ``benchmarks/learning/curves.png``.

Every run also measures the variance of its policy-gradient estimate every
``--grad-variance-every`` steps (the trainer's ``log_grad_variance``): each run records the
``grad_var/*`` metrics averaged over the measured batches, and its variance reduction against no
baseline with :func:`rloo.algo.variance.variance_reduction`, the formula ``rloo bandit`` and the
trainer use (README: Live diagnostics).

Deterministic for a machine: budgets are counted in steps and every completion is seeded.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "learning"
ESTIMATORS = ("rloo", "grpo", "reinforce", "reinforce_pp")


class AccuracyCurve:
    """A trainer callback: held-out greedy accuracy every ``every`` steps."""

    def __init__(self, tokenizer: Any, problems: list[Any], every: int) -> None:
        self.tokenizer, self.problems, self.every = tokenizer, problems, every
        self.points: list[tuple[int, float]] = []

    def on_step_end(self, trainer: Any) -> None:
        from rloo.cli.demo import evaluate

        step = trainer.state.global_step
        if step % self.every == 0:
            accuracy = evaluate(trainer.unwrapped_model, self.tokenizer, self.problems, num_generations=0).greedy
            self.points.append((step, accuracy))


def warm_start(seed: int) -> tuple[Any, Any, list[Any], list[Any], float]:
    """The demo's warm start for ``seed``: (model, tokenizer, train problems, held-out problems, accuracy)."""
    import torch

    from rloo.cli.demo import build_demo_model, evaluate, make_problems, supervised_train

    torch.manual_seed(seed)
    train, held_out = make_problems(seed)
    model, tokenizer = build_demo_model(seed)
    supervised_train(model, tokenizer, train, steps=3000, seed=seed, stop_at_accuracy=(train[:200], 0.40))
    return model, tokenizer, train, held_out, evaluate(model, tokenizer, held_out[:200], num_generations=0).greedy


def run_one(
    start: Any, tokenizer: Any, train: list[Any], held_out: list[Any], options: Any, **knobs: Any
) -> dict[str, Any]:
    """One RL run from a copy of the warm start; returns its accuracy curve and final accuracy."""
    from rloo.config import RLOOConfig
    from rloo.rewards.builtins import accuracy_reward
    from rloo.training.trainer import RLOOTrainer

    k = knobs["num_generations"]
    curve = AccuracyCurve(tokenizer, held_out[: options.eval_problems], options.eval_every)
    with tempfile.TemporaryDirectory() as tmp:
        args = RLOOConfig(
            output_dir=tmp,
            per_device_train_batch_size=options.completions,
            max_completion_length=6,
            learning_rate=5e-4,
            max_steps=options.steps,
            beta=0.0,
            logging_steps=options.steps,
            save_steps=options.steps + 1,
            health_thresholds={"reward_collapse": 0},
            log_grad_variance=options.grad_variance_every,
            seed=knobs.pop("seed"),
            **knobs,
        )
        dataset = [{"prompt": p.prompt, "answer": p.answer} for p in train]
        trainer = RLOOTrainer(
            copy.deepcopy(start),
            accuracy_reward,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[curve],
        )
        began = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - began
    completions_per_step = options.completions
    return {
        "k": k,
        "curve": [(step * completions_per_step, accuracy) for step, accuracy in curve.points],
        "final": curve.points[-1][1],
        "seconds": seconds,
        **gradient_variance(trainer.state.log_history),
    }


def gradient_variance(log_history: list[dict[str, float]]) -> dict[str, Any]:
    """``grad_var``: each ``grad_var/*`` metric averaged over the measured batches (the run logs once,
    at its end, so its one training log holds those means); ``variance_reduction``:
    ``1 - Var[used] / Var[none]`` of those means (None when not measured)."""
    from rloo.algo.variance import variance_reduction

    logged = next(row for row in reversed(log_history) if "reward" in row)
    grad_var = {key.removeprefix("grad_var/"): value for key, value in logged.items() if key.startswith("grad_var/")}
    reduction = variance_reduction(grad_var["used"], grad_var["none"]) if "used" in grad_var else None
    return {"grad_var": grad_var, "variance_reduction": reduction}


def steps_to(curve: list[tuple[int, float]], threshold: float) -> int | None:
    """Generated completions until held-out accuracy first reaches ``threshold`` (None: never)."""
    return next((samples for samples, accuracy in curve if accuracy >= threshold), None)


def table(results: list[dict[str, Any]], threshold: float) -> str:
    rows = [
        "| estimator | K | final accuracy (mean, min-max over seeds) | completions to reach "
        f"{threshold:.0%} (median) | variance reduction vs no baseline (mean) |",
        "|---|---|---|---|---|",
    ]
    keys = sorted({(r["estimator"], r["k"]) for r in results}, key=lambda x: (ESTIMATORS.index(x[0]), x[1]))
    for estimator, k in keys:
        runs = [r for r in results if r["estimator"] == estimator and r["k"] == k]
        finals = [r["final"] for r in runs]
        reached = [s for r in runs if (s := steps_to(r["curve"], threshold)) is not None]
        median = f"{statistics.median(reached):,.0f} ({len(reached)}/{len(runs)} runs)" if reached else "never"
        # None: not measured; NaN: no variance to reduce (every reward equal)
        reductions = [r["variance_reduction"] for r in runs if r.get("variance_reduction") is not None]
        finite = [value for value in reductions if not math.isnan(value)]
        reduction = f"{statistics.mean(finite):.1%}" if finite else ("no variance" if reductions else "not measured")
        rows.append(
            f"| {estimator} | {k} | {statistics.mean(finals):.1%} ({min(finals):.1%}-{max(finals):.1%}) | {median} "
            f"| {reduction} |"
        )
    return "\n".join(rows)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = sorted({r["k"] for r in results})
    fig, axes = plt.subplots(1, len(ks), figsize=(5 * len(ks), 4), squeeze=False)
    for ax, k in zip(axes[0], ks, strict=True):
        for estimator in ESTIMATORS:
            runs = [r for r in results if r["estimator"] == estimator and r["k"] == k]
            if not runs:
                continue
            samples = [s for s, _ in runs[0]["curve"]]
            mean = [statistics.mean(r["curve"][i][1] for r in runs) for i in range(len(samples))]
            ax.plot(samples, mean, label=estimator)
        ax.set_title(f"K = {k}")
        ax.set_xlabel("generated completions")
        ax.set_ylabel("held-out greedy accuracy")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--completions", type=int, default=256, help="completions generated per optimizer step")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-problems", type=int, default=300)
    parser.add_argument("--threshold", type=float, default=0.55)
    parser.add_argument("--plot", action="store_true")
    parser.add_argument(
        "--grad-variance-every", type=int, default=50, help="log_grad_variance of every run, in steps (0: off)"
    )
    options = parser.parse_args()
    estimators, ks, seeds = ESTIMATORS, (2, 4, 8), (0, 1, 2)
    if options.quick:
        estimators, ks, seeds = ("rloo", "reinforce"), (4,), (0,)
        options.steps, options.eval_every, options.eval_problems = 100, 25, 200
    sys.path.insert(0, str(HERE.parent))
    results = []
    for seed in seeds:
        start, tokenizer, train, held_out, accuracy = warm_start(seed)
        print(f"seed {seed}: warm start at {accuracy:.1%} held-out greedy accuracy", flush=True)
        for k in ks:
            for estimator in estimators:
                run = run_one(
                    start,
                    tokenizer,
                    train,
                    held_out,
                    options,
                    num_generations=k,
                    advantage_estimator=estimator,
                    seed=seed,
                )
                results.append({"estimator": estimator, "seed": seed, "warm_start": accuracy, **run})
                print(f"  {estimator:13s} K={k}: final {run['final']:.1%} ({run['seconds']:.0f} s)", flush=True)
    OUT.mkdir(exist_ok=True)
    name = "results-quick.json" if options.quick else "results.json"
    (OUT / name).write_text(json.dumps({"options": vars(options), "runs": results}, indent=1))
    print()
    print(table(results, options.threshold))
    if options.plot:
        plot(results, OUT / ("curves-quick.png" if options.quick else "curves.png"))


if __name__ == "__main__":
    main()
