"""The ``rloo`` command line."""

from __future__ import annotations

import typer

app = typer.Typer(help="rloo: online RL fine-tuning of causal LMs with REINFORCE Leave-One-Out.", no_args_is_help=True)


@app.callback()
def _root() -> None:
    """rloo: online RL fine-tuning of causal LMs with REINFORCE Leave-One-Out."""


@app.command()
def bandit(
    num_groups: int = typer.Option(20000, help="Groups of K samples per estimate."),
    seed: int = typer.Option(0, help="Random seed."),
) -> None:
    """Measure the leave-one-out baseline's variance reduction on a softmax bandit."""
    import torch
    from rich.console import Console
    from rich.table import Table

    from rloo.bandit import exact_gradient, variance_reduction

    theta = torch.tensor([0.5, -0.3, 0.1, 0.8, -1.0], dtype=torch.float64)
    arm_rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.8], dtype=torch.float64)
    table = Table(title="Softmax bandit: variance of the policy-gradient estimate, RLOO vs no baseline")
    table.add_column("K", justify="right")
    table.add_column("variance reduction", justify="right")
    for k in (2, 4, 8, 16):
        table.add_row(str(k), f"{variance_reduction(theta, arm_rewards, k, num_groups, seed):.1%}")
    Console().print(f"exact gradient: {exact_gradient(theta, arm_rewards).numpy().round(4)}")
    Console().print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
