"""transformers 5's step conventions (a fraction of the run) and its learning-rate schedules with
their keyword arguments, as TRL's scripts pass them (``--warmup_steps 0.1``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import HfArgumentParser

from rloo import RLOOConfig
from rloo.config.schedule import optimizer_steps
from rloo.training.setup.optimization import build_optimizer
from tests.helpers.models import trainer


@pytest.mark.parametrize(("value", "max_steps", "steps"), [(10, 50, 10), (0.1, 50, 5), (0.1, 7, 1), (0.25, 10, 3)])
def test_a_fraction_of_the_run_is_rounded_up_to_optimizer_steps(value: float, max_steps: int, steps: int) -> None:
    assert optimizer_steps(value, max_steps) == steps


def lr_after(args: RLOOConfig, steps: int, max_steps: int) -> float:
    model = torch.nn.Linear(2, 2)
    optimizer, schedule = build_optimizer(model, args, max_steps)
    for _ in range(steps):
        optimizer.step()
        schedule.step()
    return float(optimizer.param_groups[0]["lr"])


def test_warmup_steps_as_a_fraction_warms_up_over_that_share(tmp_path: Path) -> None:
    # before: warmup_steps=0.1 (TRL's scripts pass it) was refused as not an int
    args = RLOOConfig(
        output_dir=str(tmp_path), learning_rate=1.0, warmup_steps=0.1, lr_scheduler_type="constant_with_warmup"
    )
    assert lr_after(args, 0, 100) == 0.0
    assert lr_after(args, 5, 100) == pytest.approx(0.5)  # 10 warm-up steps of 100
    assert lr_after(args, 10, 100) == pytest.approx(1.0)


def test_cosine_with_min_lr_takes_its_keywords(tmp_path: Path) -> None:
    args = RLOOConfig(
        output_dir=str(tmp_path),
        learning_rate=1.0,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": 0.1},
    )
    assert lr_after(args, 10, 10) == pytest.approx(0.1)
    assert args.to_dict()["lr_scheduler_kwargs"] == {"min_lr_rate": 0.1}  # config.yaml records them


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        ({"lr_scheduler_type": "cosine_with_min_lr"}, "lr_scheduler_kwargs", "min_lr"),
        (
            {"lr_scheduler_kwargs": {"num_cylces": 2}, "lr_scheduler_type": "cosine"},
            "lr_scheduler_kwargs",
            "num_cylces",
        ),
        ({"lr_scheduler_type": "reduce_lr_on_plateau"}, "lr_scheduler_type", "evaluation metric"),
        ({"warmup_steps": 2.5}, "warmup_steps", "whole number"),
        ({"logging_steps": 0}, "logging_steps", "must be > 0"),
        ({"eval_steps": -0.5}, "eval_steps", "or None to skip evaluation"),
    ],
)
def test_a_schedule_transformers_would_refuse_is_refused_when_the_config_is_built(
    tmp_path: Path, values: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(ValueError, match=rf"^RLOOConfig\.{field}=.* is invalid: .*{message}"):
        RLOOConfig(output_dir=str(tmp_path), **values)


def test_flags_in_transformers_5_form_parse(tmp_path: Path) -> None:
    flags = ["--output_dir", str(tmp_path), "--warmup_steps", "0.1", "--logging_steps", "10", "--save_steps", "0.5"]
    flags += ["--lr_scheduler_type", "cosine_with_min_lr", "--lr_scheduler_kwargs", '{"min_lr": 1e-7}']
    (args,) = HfArgumentParser(RLOOConfig).parse_args_into_dataclasses(flags)
    assert args.warmup_steps == 0.1 and args.save_steps == 0.5 and args.lr_scheduler_kwargs == {"min_lr": 1e-7}
    assert args.logging_steps == 10 and isinstance(args.logging_steps, int)  # config.yaml records 10, not 10.0


def test_logging_and_saving_every_fraction_of_a_real_run(tmp_path: Path) -> None:
    run = trainer(tmp_path, max_steps=4, logging_steps=0.5, save_steps=0.5, per_device_train_batch_size=4)
    run.train()
    logged = [row["step"] for row in run.state.log_history if "loss" in row]
    assert logged == [2, 4]
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
