"""The report's plots: which metrics each figure draws, drawn with matplotlib (Agg) into PNGs.

matplotlib loads inside :func:`render_plots`, so importing this module stays light.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import Any

from rloo.report import metric_names as names
from rloo.report.diagnostics import Rows, finite_series, is_finite


@dataclass(frozen=True)
class Plot:
    """One figure: ``keys`` drawn as lines over steps, ``bands`` maps a mean key to its std key."""

    title: str
    keys: tuple[str, ...]
    missing: str  # the note shown when none of ``keys`` was logged
    bands: dict[str, str] = field(default_factory=dict)
    log_scale: bool = False
    from_zero: bool = False  # counts and fractions: the y axis starts at 0
    optional: bool = False  # an opt-in diagnostic: left out without a note when not logged


def _plots(logged: set[str]) -> list[Plot]:
    per_function = tuple(sorted(k for k in logged if k.startswith("rewards/") and k.endswith("/mean")))
    return [
        Plot("Reward (mean ± std)", (names.REWARD,), "no reward logged", {names.REWARD: names.REWARD_STD}),
        Plot(
            "Reward per function (mean ± std)",
            per_function,
            "no rewards/<name>/mean logged",
            {key: key.removesuffix("/mean") + "/std" for key in per_function},
        ),
        Plot("KL to the reference", (names.KL,), "no kl logged (it is computed only when beta > 0)"),
        Plot("Entropy", (names.ENTROPY,), "no entropy logged"),
        Plot(
            "Completion length (tokens)",
            (names.MEAN_LENGTH, names.MIN_LENGTH, names.MAX_LENGTH),
            "no completion lengths logged",
            from_zero=True,
        ),
        Plot(
            "Clipped ratio (hit max_completion_length)",
            (names.CLIPPED_RATIO,),
            "no clipped ratio logged",
            from_zero=True,
        ),
        Plot(
            "Clip ratios",
            ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"),
            "no clip ratios logged",
            from_zero=True,
        ),
        Plot("Loss", (names.LOSS,), "no loss logged"),
        Plot("Learning rate", ("learning_rate",), "no learning_rate logged"),
        Plot("Gradient norm (before clipping)", (names.GRAD_NORM,), "no grad_norm logged", log_scale=True),
        Plot(
            "Learning signal: tokens with a non-zero advantage, groups with equal rewards",
            (names.FRAC_TOKENS_NONZERO_ADVANTAGE, names.FRAC_REWARD_ZERO_STD),
            "no frac_tokens_nonzero_advantage logged",
            from_zero=True,
            optional=True,  # runs before it was logged
        ),
        Plot(
            "Gradient variance per estimator (log_grad_variance)",
            tuple(f"grad_var/{name}" for name in ("used", "none", "group_mean", "rloo", "grpo")),
            "log_grad_variance is off",
            log_scale=True,
            optional=True,
        ),
        Plot(
            "Variance reduction vs no baseline: 1 - Var[used] / Var[none]",
            ("grad_var/reduction_vs_none",),
            "log_grad_variance is off",
            optional=True,
        ),
        Plot(
            "Eval reward (mean ± std)",
            ("eval_reward",),
            "no eval_reward logged (needs eval_dataset and eval_steps)",
            {"eval_reward": "eval_reward_std"},
        ),
        Plot(
            "Eval pass@k (unbiased, combined reward >= 1)",
            tuple(f"eval_pass@{k}" for k in (1, 2, 4, 8, 16)),
            "no eval_pass@k logged (needs num_generations_eval >= 2)",
            optional=True,
        ),
    ]


# ---------------------------------------------------------------------------- public entry point


def render_plots(rows: Rows) -> tuple[list[tuple[str, str]], list[str]]:
    """``(title, base64 PNG)`` for each plot with data, and a note for each without."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    logged = {key for row in rows for key, value in row.items() if is_finite(value)}
    images, omitted = [], []
    for plot in _plots(logged):
        keys = [key for key in plot.keys if key in logged]
        if not keys:
            if plot.optional:
                continue
            omitted.append(f"{plot.title}: {plot.missing}")
            continue
        figure = Figure(figsize=(6.0, 3.2), dpi=100, layout="constrained")
        FigureCanvasAgg(figure)
        _draw(figure.add_subplot(), rows, plot, keys)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        images.append((plot.title, base64.b64encode(buffer.getvalue()).decode("ascii")))
    return images, omitted


def _draw(axes: Any, rows: Rows, plot: Plot, keys: list[str]) -> None:
    from matplotlib.ticker import MaxNLocator

    for key in keys:
        steps, values = finite_series(rows, key)
        marker = "o" if len(steps) <= 30 else None
        (line,) = axes.plot(steps, values, marker=marker, markersize=3, linewidth=1.5, label=_short_label(key))
        std_key = plot.bands.get(key)
        if std_key is not None:
            band = [
                (r["step"], r[key], r[std_key]) for r in rows if is_finite(r.get(key)) and is_finite(r.get(std_key))
            ]
            if band:
                xs, means, stds = zip(*band, strict=True)
                lows = [m - s for m, s in zip(means, stds, strict=True)]
                highs = [m + s for m, s in zip(means, stds, strict=True)]
                axes.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.2, linewidth=0)
    axes.set_title(plot.title, fontsize=11)
    axes.set_xlabel("step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    if plot.log_scale and all(v > 0 for key in keys for v in finite_series(rows, key)[1]):
        axes.set_yscale("log")
    if plot.from_zero:
        axes.set_ylim(bottom=0)
    if len(keys) > 1:
        axes.legend(fontsize=8, framealpha=0.7)


def _short_label(key: str) -> str:
    """The legend name: ``rewards/accuracy/mean`` -> ``accuracy``, ``completions/min_length`` -> ``min``."""
    name = key.split("/", 1)[-1]
    for suffix in ("/mean", "_mean", "_length"):
        name = name.removesuffix(suffix)
    return name
