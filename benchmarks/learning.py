"""Does it learn better? Advantage estimators and loss knobs at equal compute, on two tasks.

    .venv/bin/python benchmarks/learning.py            # the study: 31 min on the shared 2-core machine (BENCHMARKS.md)
    .venv/bin/python benchmarks/learning.py --quick    # every part, smaller: 55 s there
    .venv/bin/python benchmarks/learning.py --render   # tables and plots again from results.json

Parts (``--parts``):

* ``estimators``: ``rloo``, ``grpo``, ``reinforce`` (no baseline) and ``reinforce_pp`` for K in
  {2, 4, 8} x 3 seeds on the ``arithmetic`` task (the demo's, benchmarks/tasks.py);
* ``reversal``: the same grid on the ``reversal`` task (reverse 3-5 letters), smaller budget;
* ``ablations``: rloo at K = 4 on ``arithmetic``, 3 seeds: KL in the reward vs in the loss
  (beta 0.05), each loss aggregation mode, and ``num_iterations`` 2 (two optimizer passes per
  generation batch, as many generated completions). The estimators part's rloo K = 4 runs are
  their baseline (beta 0, ``seq_mean_token_sum``, 1 iteration).
* ``staleness``: rloo at K = 4 on ``arithmetic``, 3 seeds, each batch sampled by the weights of
  ``max_staleness`` = 1 or 2 steps before, with the importance-weight correction (token-level,
  truncated at 3) and without, against s = 0 (its own runs: the part runs alone). Run it with
  ``--parts staleness``: its results go to ``results-staleness.json``.
* ``staleness-reversal``: the same on ``reversal`` (``--parts staleness-reversal``,
  ``results-staleness-reversal.json``).
* ``dynamic``: rloo at K = 4, 3 seeds, on ``arithmetic`` and ``reversal``: dynamic sampling
  (``dynamic_sampling``, at most ``max_num_gen_batches`` = 10 rounds per batch) against its own runs
  without, as many optimizer steps each, held-out accuracy every 10 batches against the completions
  generated so far (dynamic sampling generates more per batch). Run it with ``--parts dynamic``: its
  results go to ``results-dynamic.json``.

Compute is equal across the runs of a task: every generation batch holds the same number of
completions (so K = 8 sees half the prompts K = 4 sees), with the same optimizer, learning rate
and number of generation batches. Every run of a seed starts from the same warm start (supervised
on the task's demonstrations, stopped early). Held-out greedy accuracy is measured every
``eval_every`` generation batches on 300 held-out problems; every run measures the variance of its
policy-gradient estimate twice (the trainer's ``log_grad_variance``, docs/metrics.md: Live diagnostics).

Results: ``benchmarks/learning/results.json`` (``results-quick.json``), tables on stdout (the ones
in BENCHMARKS.md), plots in ``benchmarks/learning/*.png``. Deterministic for a machine: budgets are
counted in steps and every completion is seeded; a loaded machine is only slower.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from concurrent import futures
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
OUT = HERE / "learning"
ESTIMATORS = ("rloo", "grpo", "reinforce", "reinforce_pp")
PARTS = ("estimators", "reversal", "ablations", "staleness", "staleness-reversal", "dynamic")
ALONE = ("staleness", "staleness-reversal", "dynamic")  # parts with a results file of their own when run alone


@dataclass(frozen=True)
class Budget:
    """One task's budget: ``batches`` generation batches of ``completions`` completions."""

    batches: int
    completions: int
    eval_every: int  # generation batches between held-out evaluations
    threshold: float  # the accuracy "steps to reach" counts to


FULL = {"arithmetic": Budget(200, 256, 25, 0.55), "reversal": Budget(100, 128, 10, 0.60)}
QUICK = {"arithmetic": Budget(40, 128, 10, 0.55), "reversal": Budget(30, 64, 10, 0.60)}


def ablations() -> dict[str, dict[str, Any]]:
    """The ablation runs' knobs (on top of rloo, K = 4), by label."""
    from rloo.algo.losses import AGGREGATION_MODES

    runs: dict[str, dict[str, Any]] = {
        "KL in reward (beta 0.05)": {"beta": 0.05, "kl_placement": "reward"},
        # k3: k1 in the loss has zero expected gradient and is refused (the 2026-11-22 run used it)
        "KL in loss (beta 0.05)": {"beta": 0.05, "kl_placement": "loss", "kl_estimator": "k3"},
    }
    for mode in AGGREGATION_MODES:
        if mode != "seq_mean_token_sum":  # the baseline's
            runs[f"aggregation {mode}"] = {"loss_aggregation": mode}
    runs["num_iterations 2"] = {"num_iterations": 2}
    return runs


BASELINE = "baseline (beta 0, seq_mean_token_sum, 1 iteration)"
SYNCHRONOUS = "s = 0 (synchronous)"


def staleness_runs() -> dict[str, dict[str, Any]]:
    """The staleness part's runs (on top of rloo, K = 4), by label; the first is its baseline."""
    runs: dict[str, dict[str, Any]] = {SYNCHRONOUS: {"max_staleness": 0}}
    for s in (1, 2):
        correction = {"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_max": 3.0}
        runs[f"s = {s}, corrected"] = {"max_staleness": s, **correction}
        runs[f"s = {s}, not corrected"] = {"max_staleness": s, "vllm_importance_sampling_correction": False}
    return runs


STALENESS_PARTS = {"staleness": "arithmetic", "staleness-reversal": "reversal"}  # the part's task
DYNAMIC_RUNS: dict[str, dict[str, Any]] = {"without": {}, "dynamic sampling": {"dynamic_sampling": True}}
DYNAMIC_EVAL_EVERY = 10  # generation batches between evaluations: finer than the estimators part's on arithmetic


def plan(parts: tuple[str, ...], quick: bool) -> list[dict[str, Any]]:
    """Every run of the study: its part, task, seed, label and trainer knobs."""
    seeds, ks, estimators = ((0,), (4,), ("rloo", "reinforce")) if quick else ((0, 1, 2), (2, 4, 8), ESTIMATORS)
    runs = []
    for part, task in (("estimators", "arithmetic"), ("reversal", "reversal")):
        if part in parts:
            runs += [
                {"part": part, "task": task, "seed": seed, "label": estimator, "knobs": {"num_generations": k}}
                | {"estimator": estimator}
                for seed in seeds
                for k in ks
                for estimator in estimators
            ]
    for part, task in STALENESS_PARTS.items():
        if part not in parts:
            continue
        stale = staleness_runs()
        if quick:  # the baseline and one pipelined run
            stale = {label: stale[label] for label in (SYNCHRONOUS, "s = 1, corrected")}
        runs += [
            {"part": part, "task": task, "seed": seed, "label": label, "estimator": "rloo"}
            | {"knobs": {"num_generations": 4, **knobs}}
            for seed in seeds
            for label, knobs in stale.items()
        ]
    if "dynamic" in parts:
        runs += [
            {"part": "dynamic", "task": task, "seed": seed, "label": label, "estimator": "rloo"}
            | {"knobs": {"num_generations": 4, **knobs}, "eval_every": DYNAMIC_EVAL_EVERY}
            for task in (("reversal",) if quick else ("arithmetic", "reversal"))
            for seed in seeds
            for label, knobs in DYNAMIC_RUNS.items()
        ]
    if "ablations" in parts:
        chosen = ablations()
        if quick:  # one of each kind
            chosen = {label: chosen[label] for label in ("KL in loss (beta 0.05)", "num_iterations 2")}
        runs += [
            {"part": "ablations", "task": "arithmetic", "seed": seed, "label": label, "estimator": "rloo"}
            | {"knobs": {"num_generations": 4, **knobs}}
            for seed in seeds
            for label, knobs in chosen.items()
        ]
    return runs


class AccuracyCurve:
    """A trainer callback: held-out greedy accuracy every ``every`` optimizer steps, against the completions
    generated so far; and ``at_budget``: the accuracy at the last step within ``budget`` generated completions
    (what a run without dynamic sampling generates), from a copy of that step's weights."""

    def __init__(self, task: Any, tokenizer: Any, rows: list[Any], every: int, budget: int, start: Any) -> None:
        self.task, self.tokenizer, self.rows, self.every, self.budget = task, tokenizer, rows, every, budget
        self.points: list[tuple[int, float]] = []
        # the weights of the last step within the budget: the start's until a step ends within it
        self.within: tuple[int, dict[str, Any]] = (0, {k: v.detach().clone() for k, v in start.state_dict().items()})
        self.at_budget: tuple[int, float] | None = None

    def on_step_end(self, trainer: Any) -> None:
        state, model = trainer.state, trainer.unwrapped_model
        generated = state.num_groups_seen * trainer.args.num_generations  # every round of dynamic sampling
        if generated <= self.budget:
            self.within = (generated, {k: v.detach().clone() for k, v in model.state_dict().items()})
        elif self.at_budget is None:  # the budget was just passed
            earlier = copy.deepcopy(model)
            earlier.load_state_dict(self.within[1])
            self.at_budget = (self.within[0], self.task.accuracy(earlier, self.tokenizer, self.rows))
        if state.global_step % self.every == 0:
            self.points.append((generated, self.task.accuracy(model, self.tokenizer, self.rows)))


def run_one(start: Any, tokenizer: Any, task: Any, budget: Budget, seed: int, knobs: dict[str, Any]) -> dict[str, Any]:
    """One RL run from a copy of the warm start: its accuracy curve (x: generated completions),
    final accuracy, seconds and gradient variance."""
    from rloo.config import RLOOConfig
    from rloo.training.trainer import RLOOTrainer

    iterations = knobs.get("num_iterations", 1)
    steps = budget.batches * iterations  # optimizer steps: num_iterations per generation batch
    every, generated = budget.eval_every * iterations, budget.batches * budget.completions  # one round per batch
    curve = AccuracyCurve(task, tokenizer, task.held_out[:300], every, generated, start)
    with tempfile.TemporaryDirectory() as tmp:
        args = RLOOConfig(
            output_dir=tmp,
            per_device_train_batch_size=budget.completions,
            max_completion_length=task.completion_length,
            learning_rate=5e-4,
            max_steps=steps,
            logging_steps=steps,
            save_steps=steps + 1,
            health_thresholds={"reward_collapse": 0},
            log_grad_variance=steps // 2,
            seed=seed,
            **{"beta": 0.0, **knobs},
        )
        trainer = RLOOTrainer(
            copy.deepcopy(start),
            task.reward,
            args=args,
            train_dataset=task.train,
            processing_class=tokenizer,
            callbacks=[curve],
        )
        began = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - began
    return {
        "curve": curve.points,
        "final": curve.points[-1][1],
        "seconds": seconds,
        "generated": trainer.state.num_groups_seen * trainer.args.num_generations,
        "at_budget": curve.at_budget or curve.points[-1],  # never past the budget: the final evaluation
        **gradient_variance(trainer.state.log_history),
        **sampling_means(trainer.state.log_history),
    }


def sampling_means(log_history: list[dict[str, float]]) -> dict[str, Any]:
    """The run's means over its batches (it logs once, at its end) of the share of generated groups without a
    signal and, with dynamic sampling, of its rounds per batch and of the groups trained without a signal."""
    from rloo.report import metric_names as names

    logged = next(row for row in reversed(log_history) if "reward" in row)
    zero_std = logged.get(names.GENERATED_ZERO_STD, logged[names.FRAC_TASK_REWARD_ZERO_STD])
    return {
        "generated_zero_std": zero_std,
        "gen_batches": logged.get(names.GEN_BATCHES, 1.0),
        "filled_groups": logged.get(names.FILLED_GROUPS, 0.0),
    }


def gradient_variance(log_history: list[dict[str, float]]) -> dict[str, Any]:
    """``grad_var``: each ``grad_var/*`` metric averaged over the measured batches (the run logs once,
    at its end, so its one training log holds those means); ``variance_reduction``:
    ``1 - Var[used] / Var[none]`` of those means (None when not measured)."""
    from rloo.algo.variance import variance_reduction

    logged = next(row for row in reversed(log_history) if "reward" in row)
    grad_var = {key.removeprefix("grad_var/"): value for key, value in logged.items() if key.startswith("grad_var/")}
    grad_var["seconds"] = logged.get("timing/grad_variance")
    reduction = variance_reduction(grad_var["used"], grad_var["none"]) if "used" in grad_var else None
    return {"grad_var": grad_var, "variance_reduction": reduction}


def _warm_job(task_name: str, seed: int, max_steps: int) -> tuple[dict[str, Any], float, float]:
    """A (task, seed)'s warm start: its weights, held-out accuracy and seconds."""
    from tasks import TASKS, warm_start

    began = time.perf_counter()
    model, _, accuracy = warm_start(TASKS[task_name](seed), seed, max_steps)
    return model.state_dict(), accuracy, time.perf_counter() - began


def _run_job(run: dict[str, Any], budget: Budget, weights: dict[str, Any], accuracy: float) -> dict[str, Any]:
    """One planned run from its warm start's weights: the run's record."""
    from tasks import TASKS

    from rloo.cli.demo import build_demo_model

    task = TASKS[run["task"]](run["seed"])
    model, tokenizer = build_demo_model(run["seed"], chars=task.chars)
    model.load_state_dict(weights)
    knobs = {"advantage_estimator": run["estimator"]} | run["knobs"]
    # a part's finer evaluations (dynamic: every 10 batches), never coarser than the budget's
    budget = replace(budget, eval_every=min(run.get("eval_every", budget.eval_every), budget.eval_every))
    outcome = run_one(model, tokenizer, task, budget, run["seed"], knobs)
    outcome["curve"].insert(0, (0, accuracy))
    return run | {"k": run["knobs"]["num_generations"], "warm_start": accuracy} | outcome


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def run_study(
    runs: list[dict[str, Any]], budgets: dict[str, Budget], save: Any, warm_start_steps: int = 3000, workers: int = 0
) -> list[dict[str, Any]]:
    """Every planned run, from warm starts (at most ``warm_start_steps``) shared by the runs of a (task, seed);
    ``save(results)`` after each run ends. ``workers`` > 0: that many processes of one torch thread each
    (the tiny model gains little from a second thread; a process per core keeps both busy), else in this
    process."""
    keys = list(dict.fromkeys((run["task"], run["seed"]) for run in runs))
    pool: futures.Executor = (
        futures.ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_one_thread)
        if workers
        else futures.ThreadPoolExecutor(1)
    )
    with pool:
        warm = pool.map(_warm_job, *zip(*((task, seed, warm_start_steps) for task, seed in keys), strict=True))
        starts = dict(zip(keys, warm, strict=True))
        for (task, seed), (_, accuracy, seconds) in starts.items():
            print(f"{task} seed {seed}: warm start at {accuracy:.1%} held-out ({seconds:.0f} s)", flush=True)
        pending = {
            pool.submit(_run_job, run, budgets[run["task"]], *starts[run["task"], run["seed"]][:2]): i
            for i, run in enumerate(runs)
        }
        done: dict[int, dict[str, Any]] = {}
        for future in futures.as_completed(pending):
            record = done[pending[future]] = future.result()
            record["warm_start_seconds"] = starts[(record["task"], record["seed"])][2]
            print(
                f"  {record['part']:10s} {record['task']:10s} seed {record['seed']} {record['label']:34s} "
                f"K={record['k']}: final {record['final']:.1%} ({record['seconds']:.0f} s)",
                flush=True,
            )
            save([done[i] for i in sorted(done)])
    return [done[i] for i in sorted(done)]


def main() -> None:
    from learning_report import render

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="every part, smaller (under 5 minutes)")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--render", action="store_true", help="only tables and plots, from the saved results")
    parser.add_argument("--workers", type=int, default=2, help="processes, one torch thread each (0: this process)")
    options = parser.parse_args()
    alone = options.parts[0] if len(options.parts) == 1 and options.parts[0] in ALONE else None
    suffix = ("-quick" if options.quick else "") + (f"-{alone}" if alone else "")
    path = OUT / f"results{suffix}.json"
    budgets = QUICK if options.quick else FULL
    if not options.render:
        OUT.mkdir(exist_ok=True)
        began = time.perf_counter()
        header = {"command": " ".join(["benchmarks/learning.py", *sys.argv[1:]]), "budgets": budgets}

        def save(results: list[dict[str, Any]]) -> None:
            seconds = time.perf_counter() - began
            budgets_json = {name: vars(budget) for name, budget in header["budgets"].items()}
            document = {**header, "budgets": budgets_json, "total_seconds": seconds, "runs": results}
            path.write_text(json.dumps(document, indent=1))

        run_study(plan(tuple(options.parts), options.quick), budgets, save, workers=options.workers)
        print(f"total: {time.perf_counter() - began:.0f} s", flush=True)
    print(render(json.loads(path.read_text()), OUT, suffix))


if __name__ == "__main__":
    main()
