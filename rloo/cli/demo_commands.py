"""The demo commands of the ``rloo`` app: ``demo`` (RLOO fixes a tiny model's arithmetic), ``demo-tools`` (RLOO
teaches it when to call a tool) and ``bandit`` (the leave-one-out baseline's variance reduction, measured against
its closed form). They register on :data:`rloo.cli.commands.app` when :mod:`rloo.cli` is imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from rloo.cli.commands import _EitherSpelling, _fail, _one_line_errors, app, console, errors


def _demo_folder(output_dir: str | None, default: str) -> str:
    """A demo's run folder: ``default`` (or ``default-N`` if taken: a demo never overwrites a run), or the
    given one if it is new or empty (else exit 2, nothing changed)."""
    from rloo.training.checkpointing.run_folder import fresh_run_folder

    if output_dir is None:
        return str(fresh_run_folder(Path(default)))
    if Path(output_dir).exists() and any(Path(output_dir).iterdir()):
        raise _fail(f"{output_dir} already exists and is not empty; choose a new --output-dir (nothing was changed)")
    return output_dir


def _run_demo(options: Any, run: Any, table: Any, measure: str) -> None:
    """Run a demo, print its table and its gain, and write ``demo_results.json`` beside its run's files."""
    import time

    start = time.perf_counter()
    result = run(options, log=lambda text: errors.print(f"[bold]{text}[/bold]", highlight=False))
    total = time.perf_counter() - start  # the RLOO run wrote report.html
    console.print(table(result))
    summary: dict[str, Any] = {
        "accuracy": {name: acc.__dict__ for name, acc in result.rows.items()},
        "seconds": {**result.seconds, "total": total},
    }
    (result.output_dir / "demo_results.json").write_text(json.dumps(summary, indent=1))
    gain = result.rows["+ RLOO"].greedy - result.rows["warm start"].greedy
    console.print(
        f"RLOO: {gain * 100:+.1f} points of {measure} over the warm start, in {total:.0f} s in all. "
        f"Run folder: {result.output_dir} (report.html, metrics.jsonl, completions.jsonl, demo_results.json)"
    )


@app.command(cls=_EitherSpelling)
def demo(
    steps: int = typer.Option(500, help="RLOO steps (the control takes as many supervised steps)."),
    num_generations: int = typer.Option(4, help="Completions per prompt (K)."),
    prompts_per_step: int = typer.Option(64, help="Prompts per RLOO step."),
    learning_rate: float = typer.Option(5e-4, help="RLOO learning rate."),
    eval_problems: int = typer.Option(500, help="Held-out problems to evaluate on."),
    hidden_size: int = typer.Option(128, help="Model width."),
    num_layers: int = typer.Option(2, help="Model depth."),
    warm_start_steps: int = typer.Option(3000, help="Most supervised warm-start steps (it stops early at 40%)."),
    seed: int = typer.Option(0, help="Random seed."),
    output_dir: str = typer.Option(None, help="Run folder \\[default: runs/demo, or runs/demo-N if taken]."),
) -> None:
    """Offline demo: RLOO fixes a tiny model's imperfectly taught arithmetic (about 2 min on 2 CPU cores)."""
    from rloo.cli.demo import DemoOptions, demo_table, run_demo

    output_dir = _demo_folder(output_dir, "runs/demo")
    with _one_line_errors():
        options = DemoOptions(
            steps=steps,
            num_generations=num_generations,
            prompts_per_step=prompts_per_step,
            learning_rate=learning_rate,
            eval_problems=eval_problems,
            hidden_size=hidden_size,
            num_layers=num_layers,
            warm_start_steps=warm_start_steps,
            seed=seed,
            output_dir=output_dir,
        )
    _run_demo(options, run_demo, lambda result: demo_table(result, num_generations), "greedy accuracy")


@app.command("demo-tools", cls=_EitherSpelling)
def demo_tools(
    steps: int = typer.Option(40, help="RLOO steps (the control takes as many supervised steps)."),
    num_generations: int = typer.Option(4, help="Episodes per prompt (K)."),
    prompts_per_step: int = typer.Option(32, help="Prompts per RLOO step."),
    learning_rate: float = typer.Option(1e-3, help="RLOO learning rate."),
    tool_share: float = typer.Option(0.3, help="Share of the teacher's episodes that call the tool."),
    chat_template: str = typer.Option(
        "hermes", help="hermes, or thinking: a thinking model's template (Qwen3's rules), each turn reasoning first."
    ),
    warm_start_steps: int = typer.Option(
        1500, help="Most supervised warm-start steps (it stops at the teacher's level)."
    ),
    hidden_size: int = typer.Option(128, help="Model width."),
    num_layers: int = typer.Option(2, help="Model depth."),
    seed: int = typer.Option(0, help="Random seed."),
    output_dir: str = typer.Option(
        None, help="Run folder \\[default: runs/demo-tools, or runs/demo-tools-N if taken]."
    ),
) -> None:
    """Offline agentic demo: RLOO teaches a tiny model when to call a multiply tool (a few minutes on 2 CPU cores)."""
    from rloo.cli.tool_demo import ToolDemoOptions, run_tool_demo, tool_demo_table

    output_dir = _demo_folder(output_dir, "runs/demo-tools")
    with _one_line_errors():
        options = ToolDemoOptions(
            steps=steps,
            num_generations=num_generations,
            prompts_per_step=prompts_per_step,
            learning_rate=learning_rate,
            tool_share=tool_share,
            chat_template=chat_template,
            warm_start_steps=warm_start_steps,
            hidden_size=hidden_size,
            num_layers=num_layers,
            seed=seed,
            output_dir=output_dir,
        )
    _run_demo(options, run_tool_demo, tool_demo_table, "right answers")


@app.command(cls=_EitherSpelling)
def bandit(
    num_groups: int = typer.Option(20000, help="Groups of K samples per estimate."),
    seed: int = typer.Option(0, help="Random seed."),
) -> None:
    """Measure the leave-one-out baseline's variance reduction on a softmax bandit, against its closed form.

    Variance reduction = 1 - Var(g_rloo) / Var(g_none), on the same samples: as grad_var/reduction_vs_none.
    """
    import torch

    from rloo.algo.bandit import closed_form_variance, exact_gradient, variance_reduction

    theta = torch.tensor([0.5, -0.3, 0.1, 0.8, -1.0], dtype=torch.float64)
    arm_rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.8], dtype=torch.float64)
    table = Table(title="Softmax bandit: variance reduction, RLOO vs no baseline")
    table.add_column("K", justify="right")
    table.add_column("measured", justify="right")
    table.add_column("closed form", justify="right")
    for k in (2, 4, 8, 16):
        exact = 1 - closed_form_variance(theta, arm_rewards, k, "rloo") / closed_form_variance(
            theta, arm_rewards, k, "reinforce"
        )
        table.add_row(str(k), f"{variance_reduction(theta, arm_rewards, k, num_groups, seed):.1%}", f"{exact:.1%}")
    console.print(f"exact gradient: {exact_gradient(theta, arm_rewards).numpy().round(4)}")
    console.print(table)
    console.print("variance reduction = 1 - Var(g_rloo) / Var(g_none), as the trainer's grad_var/reduction_vs_none")
