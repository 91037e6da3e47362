"""Tables (Markdown, as in BENCHMARKS.md) and plots of the learning study's results (benchmarks/learning.py)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

ESTIMATORS = ("rloo", "grpo", "reinforce", "reinforce_pp")


def completions_to(curve: list[tuple[int, float]], threshold: float) -> int | None:
    """Generated completions until held-out accuracy first reaches ``threshold`` (None: never)."""
    return next((samples for samples, accuracy in curve if accuracy >= threshold), None)


def spread(values: list[float]) -> str:
    """``mean (min-max)`` as percentages."""
    return f"{statistics.mean(values):.1%} ({min(values):.1%}-{max(values):.1%})"


def reach(runs: list[dict[str, Any]], threshold: float) -> str:
    reached = [s for r in runs if (s := completions_to(r["curve"], threshold)) is not None]
    return f"{statistics.median(reached):,.0f} ({len(reached)}/{len(runs)})" if reached else f"never (0/{len(runs)})"


def reductions(runs: list[dict[str, Any]], name: str = "used") -> list[float]:
    """Each run's ``1 - Var[name] / Var[none]`` (runs with no variance to reduce left out)."""
    return [1 - r["grad_var"][name] / r["grad_var"]["none"] for r in runs if r["grad_var"].get("none", 0) > 0]


def median_reduction(runs: list[dict[str, Any]], name: str = "used") -> str:
    """The median over runs of the variance reduction (a few noisy estimates would sway a mean)."""
    values = reductions(runs, name)
    return f"{statistics.median(values):+.0%}" if values else "n/a"


def estimator_table(runs: list[dict[str, Any]], threshold: float) -> str:
    rows = [
        f"| estimator | K | final accuracy, mean (min-max) | completions to {threshold:.0%}, median (runs) "
        "| Var[G] used (median) | variance reduction vs none (median) | run s (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["estimator"], r["k"]) for r in runs}, key=lambda x: (ESTIMATORS.index(x[0]), x[1]))
    for estimator, k in keys:
        group = [r for r in runs if r["estimator"] == estimator and r["k"] == k]
        variance = statistics.median(r["grad_var"]["used"] for r in group)
        rows.append(
            f"| {estimator} | {k} | {spread([r['final'] for r in group])} | {reach(group, threshold)} "
            f"| {variance:.3g} | {median_reduction(group)} | {statistics.mean(r['seconds'] for r in group):.0f} |"
        )
    return "\n".join(rows)


def same_sample_table(runs: list[dict[str, Any]]) -> str:
    """Variance reduction of each baseline on the same samples (every run of a K pooled; medians)."""
    rows = [
        "| K | runs (2 measured batches each) | group mean | leave-one-out (rloo) | grpo (mean/std: other scale) |",
        "|---|---|---|---|---|",
    ]
    for k in sorted({r["k"] for r in runs}):
        group = [r for r in runs if r["k"] == k]
        rows.append(
            f"| {k} | {len(group)} | {median_reduction(group, 'group_mean')} | {median_reduction(group, 'rloo')} "
            f"| {median_reduction(group, 'grpo')} |"
        )
    return "\n".join(rows)


def ablation_table(
    ablations: list[dict[str, Any]],
    baseline: list[dict[str, Any]],
    threshold: float,
    baseline_label: str = "baseline (beta 0, seq_mean_token_sum, 1 iteration)",
) -> str:
    """Each ablation against the baseline runs of the same seeds: mean of the per-seed differences."""
    rows = [
        f"| run (rloo, K = 4) | final accuracy, mean (min-max) | vs baseline, same seed (mean, min-max) "
        f"| completions to {threshold:.0%}, median (runs) | run s (mean) |",
        "|---|---|---|---|---|",
    ]
    by_seed = {r["seed"]: r["final"] for r in baseline}
    labels = [(baseline_label, baseline)]
    labels += [
        (label, [r for r in ablations if r["label"] == label]) for label in dict.fromkeys(r["label"] for r in ablations)
    ]
    for label, group in labels:
        deltas = [100 * (r["final"] - by_seed[r["seed"]]) for r in group if r["seed"] in by_seed]
        delta = f"{statistics.mean(deltas):+.1f} ({min(deltas):+.1f} to {max(deltas):+.1f}) points" if deltas else ""
        rows.append(
            f"| {label} | {spread([r['final'] for r in group])} | {delta} | {reach(group, threshold)} "
            f"| {statistics.mean(r['seconds'] for r in group):.0f} |"
        )
    return "\n".join(rows)


def dynamic_table(runs: list[dict[str, Any]], threshold: float) -> str:
    """Dynamic sampling against the runs without it, seed by seed: at equal optimizer steps (final) and at
    equal generated completions (``at_budget``: the last step within what the run without generated)."""
    rows = [
        "| run (rloo, K = 4) | final accuracy, equal steps: mean (min-max) | vs without, same seed (points) "
        "| accuracy at without's completions: mean (min-max) | vs without, same seed (points) "
        f"| completions to {threshold:.0%}, median (runs) | completions generated (mean) | rounds per batch (mean) "
        "| generated groups without a signal (mean) | groups filled per batch (mean) | run s (mean) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    without = {r["seed"]: r for r in runs if not r["knobs"].get("dynamic_sampling")}
    for label in dict.fromkeys(r["label"] for r in runs):
        group = [r for r in runs if r["label"] == label and r["seed"] in without]
        final = [100 * (r["final"] - without[r["seed"]]["final"]) for r in group]
        equal = [r["at_budget"][1] for r in group]
        at_budget = [100 * (a - without[r["seed"]]["final"]) for a, r in zip(equal, group, strict=True)]
        rows.append(
            f"| {label} | {spread([r['final'] for r in group])} | {_points(final)} | {spread(equal)} "
            f"| {_points(at_budget)} | {reach(group, threshold)} "
            f"| {statistics.mean(r['generated'] for r in group):,.0f} "
            f"| {statistics.mean(r['gen_batches'] for r in group):.2f} "
            f"| {statistics.mean(r['generated_zero_std'] for r in group):.0%} "
            f"| {statistics.mean(r['filled_groups'] for r in group):.2f} "
            f"| {statistics.mean(r['seconds'] for r in group):.0f} |"
        )
    return "\n".join(rows)


def _points(deltas: list[float]) -> str:
    return f"{statistics.mean(deltas):+.1f} ({min(deltas):+.1f} to {max(deltas):+.1f})"


def timing(document: dict[str, Any]) -> str:
    runs = document["runs"]
    parts = {
        part: sum(r["seconds"] for r in runs if r["part"] == part) for part in dict.fromkeys(r["part"] for r in runs)
    }
    warm = {(r["task"], r["seed"]): r["warm_start_seconds"] for r in runs}
    lines = [
        f"{part}: {len([r for r in runs if r['part'] == part])} runs, {s:.0f} s of training (summed over the workers)"
        for part, s in parts.items()
    ]
    lines.append(f"warm starts: {len(warm)}, {sum(warm.values()):.0f} s (summed)")
    lines.append(f"wall clock, all of it: {document['total_seconds']:.0f} s")
    return "\n".join(f"- {line}" for line in lines)


def render(document: dict[str, Any], out: Path, suffix: str = "") -> str:
    """The study's Markdown (tables and timing); writes its plots to ``out``."""
    runs, budgets = document["runs"], document["budgets"]
    sections = [f"Command: `{document['command']}`", timing(document)]
    for part, task in (("estimators", "arithmetic"), ("reversal", "reversal")):
        grid = [r for r in runs if r["part"] == part]
        if grid:
            threshold = budgets[task]["threshold"]
            sections += [f"### Estimators on {task}", estimator_table(grid, threshold)]
            sections += [f"Same samples, {task}: variance reduction vs no baseline", same_sample_table(grid)]
            plot_curves(grid, out / f"curves-{task}{suffix}.png", task)
    ablations = [r for r in runs if r["part"] == "ablations"]
    baseline = [r for r in runs if r["part"] == "estimators" and r["estimator"] == "rloo" and r["k"] == 4]
    if ablations and baseline:
        sections += [
            "### Ablations on arithmetic",
            ablation_table(ablations, baseline, budgets["arithmetic"]["threshold"]),
        ]
        plot_ablations(ablations, baseline, out / f"ablations{suffix}.png")
    for part, task in (("staleness", "arithmetic"), ("staleness-reversal", "reversal")):
        stale = [r for r in runs if r["part"] == part]
        if not stale:
            continue
        synchronous = [r for r in stale if r["knobs"].get("max_staleness") == 0]
        label = synchronous[0]["label"] if synchronous else "s = 0"
        others = [r for r in stale if r["knobs"].get("max_staleness")]
        sections += [
            f"### Staleness on {task}",
            ablation_table(others, synchronous, budgets[task]["threshold"], label),
        ]
        name = part + suffix.replace(f"-{part}", "")  # its own run's suffix names the part already
        plot_ablations(others, synchronous, out / f"{name}.png", "staleness", label, task)
    for task in ("arithmetic", "reversal"):
        dynamic = [r for r in runs if r["part"] == "dynamic" and r["task"] == task]
        if dynamic:
            batches, completions = budgets[task]["batches"], budgets[task]["completions"]
            sections += [
                f"### Dynamic sampling on {task} (rloo, K = 4, {batches} batches of {completions} completions)",
                dynamic_table(dynamic, budgets[task]["threshold"]),
            ]
    if any(r["part"] == "dynamic" for r in runs):
        name = "dynamic" + suffix.replace("-dynamic", "")
        plot_dynamic([r for r in runs if r["part"] == "dynamic"], out / f"{name}.png")
    grids = [r for r in runs if r["part"] not in ("ablations", "staleness", "staleness-reversal", "dynamic")]
    if grids:
        plot_variance(grids, out / f"variance{suffix}.png")
    return "\n\n".join(sections)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _accuracy_axes(ax: Any, title: str, fontsize: int | None = 8) -> None:
    """Held-out accuracy against generated completions, titled, with a legend."""
    ax.set_title(title)
    ax.set_xlabel("generated completions")
    ax.set_ylabel("held-out greedy accuracy")
    ax.legend(fontsize=fontsize)


def _task_panels(plt: Any, runs: list[dict[str, Any]]) -> tuple[Any, list[tuple[Any, str]]]:
    """A figure with one panel per task of ``runs``, side by side: ``(figure, [(axes, task), ...])``."""
    tasks = list(dict.fromkeys(r["task"] for r in runs))
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    return fig, list(zip(axes[0], tasks, strict=True))


def _save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _mean_curve(runs: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    samples = [s for s, _ in runs[0]["curve"]]
    return samples, [statistics.mean(r["curve"][i][1] for r in runs) for i in range(len(samples))]


def plot_curves(runs: list[dict[str, Any]], path: Path, task: str) -> None:
    plt = _pyplot()
    ks = sorted({r["k"] for r in runs})
    fig, axes = plt.subplots(1, len(ks), figsize=(5 * len(ks), 4), squeeze=False, sharey=True)
    for ax, k in zip(axes[0], ks, strict=True):
        for estimator in ESTIMATORS:
            group = [r for r in runs if r["estimator"] == estimator and r["k"] == k]
            if group:
                ax.plot(*_mean_curve(group), label=estimator, marker=".")
        _accuracy_axes(ax, f"{task}, K = {k} (mean of {len({r['seed'] for r in runs})} seeds)", fontsize=None)
    _save(plt, fig, path)


def plot_ablations(
    ablations: list[dict[str, Any]],
    baseline: list[dict[str, Any]],
    path: Path,
    what: str = "ablations",
    baseline_label: str = "baseline",
    task: str = "arithmetic",
) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.plot(*_mean_curve(baseline), label=baseline_label, color="black", linewidth=2)
    for label in dict.fromkeys(r["label"] for r in ablations):
        ax.plot(*_mean_curve([r for r in ablations if r["label"] == label]), label=label, marker=".")
    _accuracy_axes(ax, f"{task}, rloo K = 4: {what} (mean over seeds)")
    _save(plt, fig, path)


def plot_dynamic(runs: list[dict[str, Any]], path: Path) -> None:
    """Held-out accuracy against generated completions, every run (one line per seed), by task."""
    plt = _pyplot()
    fig, panels = _task_panels(plt, runs)
    for ax, task in panels:
        for color, label in zip(("black", "tab:orange"), dict.fromkeys(r["label"] for r in runs), strict=False):
            for i, run in enumerate(r for r in runs if r["task"] == task and r["label"] == label):
                samples, accuracy = zip(*run["curve"], strict=True)
                ax.plot(samples, accuracy, color=color, alpha=0.7, marker=".", label=label if i == 0 else None)
        _accuracy_axes(ax, f"{task}, rloo K = 4: dynamic sampling (one line per seed)")
    _save(plt, fig, path)


def plot_variance(runs: list[dict[str, Any]], path: Path) -> None:
    """Variance reduction vs no baseline of each estimator's own gradient, by task and K."""
    plt = _pyplot()
    fig, panels = _task_panels(plt, runs)
    for ax, task in panels:
        ks = sorted({r["k"] for r in runs if r["task"] == task})
        width = 0.8 / len(ESTIMATORS)
        for i, estimator in enumerate(ESTIMATORS):
            values = []
            for k in ks:
                group = [r for r in runs if r["task"] == task and r["estimator"] == estimator and r["k"] == k]
                ok = reductions(group)
                values.append(statistics.median(ok) if ok else math.nan)
            ax.bar([j + i * width for j in range(len(ks))], values, width, label=estimator)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ks))], [f"K = {k}" for k in ks])
        ax.set_ylabel("1 - Var[G used] / Var[G none]")
        ax.set_title(f"{task}: variance reduction vs no baseline (median of runs)", fontsize=10)
        ax.legend(fontsize=8)
    _save(plt, fig, path)
