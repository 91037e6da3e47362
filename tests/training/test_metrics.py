"""Metrics TRL documents for RLOO, logged under TRL's names: terminated lengths, clip-ratio
extremes, step_time and a mixture-of-experts model's aux_loss (offline, CPU, tiny models)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.trainer_utils import TrainOutput

from rloo import RLOOTrainer
from rloo.training.metrics import completion_metrics
from rloo.training.parallel.distributed import reduce_step_metrics
from rloo.training.update import is_mixture_of_experts
from tests.helpers.models import config, dataset, frac7, last_train_log, make_model, make_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_terminated_length_extremes_as_trl_logs_them() -> None:
    lengths, truncated = torch.tensor([3, 8, 5, 8]), torch.tensor([False, True, False, True])
    metrics = completion_metrics(lengths, truncated)
    assert metrics["completions/min_terminated_length"] == 3.0
    assert metrics["completions/max_terminated_length"] == 5.0
    assert metrics["completions/mean_terminated_length"] == 4.0
    none_ended = completion_metrics(torch.tensor([8, 8]), torch.tensor([True, True]))
    assert none_ended["completions/min_terminated_length"] == none_ended["completions/max_terminated_length"] == 0.0


def test_clip_ratio_extremes_are_taken_over_processes() -> None:
    per_rank = [
        {"clip_ratio/low_mean": 0.1, "clip_ratio/low_min": 0.1, "clip_ratio/high_max": 0.0, "_tokens": 10.0},
        {"clip_ratio/low_mean": 0.3, "clip_ratio/low_min": 0.3, "clip_ratio/high_max": 0.2, "_tokens": 30.0},
        {"clip_ratio/low_min": math.nan, "clip_ratio/high_max": math.nan, "_tokens": 0.0},
    ]
    out = reduce_step_metrics(per_rank)
    assert out["clip_ratio/low_min"] == 0.1 and out["clip_ratio/high_max"] == 0.2
    assert out["clip_ratio/low_mean"] == pytest.approx((0.1 * 10 + 0.3 * 30) / 40)


def test_a_training_run_logs_trls_metric_names(tmp_path: Path) -> None:
    tokenizer = make_tokenizer()
    trainer = RLOOTrainer(
        make_model(tokenizer), frac7, args=config(tmp_path), train_dataset=dataset(), processing_class=tokenizer
    )
    trainer.train()
    logged = last_train_log(trainer)
    for name in (
        "step_time",
        "completions/min_terminated_length",
        "completions/max_terminated_length",
        "clip_ratio/low_min",
        "clip_ratio/high_max",
    ):
        assert name in logged, name
    assert logged["step_time"] == logged["timing/update"]
    assert "aux_loss" not in logged  # not a mixture-of-experts model


def _moe_trainer(tmp_path: Path, **overrides: Any) -> RLOOTrainer:
    tokenizer = make_tokenizer()
    moe = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=32,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Qwen3MoeForCausalLM(moe)
    args = config(tmp_path, max_steps=1, **overrides)
    return RLOOTrainer(model, frac7, args=args, train_dataset=dataset(), processing_class=tokenizer)


def test_a_mixture_of_experts_model_adds_its_load_balancing_loss(tmp_path: Path) -> None:
    without = _moe_trainer(tmp_path / "a", router_aux_loss_coef=0.0)
    with_aux = _moe_trainer(tmp_path / "b", router_aux_loss_coef=0.5)
    assert is_mixture_of_experts(with_aux.unwrapped_model) and with_aux.updater.aux_loss_coef == 0.5
    assert not with_aux.updater.exact_skip  # every row carries the aux loss: none may skip its backward
    without.train()
    with_aux.train()
    plain, moe = last_train_log(without), last_train_log(with_aux)
    assert "aux_loss" not in plain and moe["aux_loss"] > 0
    # the same samples (same seed and weights): the losses differ by exactly coef x aux_loss
    assert moe["loss"] - plain["loss"] == pytest.approx(0.5 * moe["aux_loss"], rel=1e-4)


def test_train_returns_transformers_train_output_and_logs_the_summary_last(tmp_path: Path) -> None:
    tokenizer = make_tokenizer()
    args = config(tmp_path, max_steps=3, logging_steps=1)
    trainer = RLOOTrainer(make_model(tokenizer), frac7, args=args, train_dataset=dataset(), processing_class=tokenizer)
    output = trainer.train()
    assert isinstance(output, TrainOutput) and output.global_step == 3
    summary = trainer.state.log_history[-1]
    assert summary == {"step": 3.0, "epoch": summary["epoch"], **output.metrics}
    assert {"train_loss", "train_runtime", "train_samples_per_second", "train_steps_per_second"} <= set(summary)
    step_losses = [row["loss"] for row in trainer.state.log_history if "reward" in row]  # one log a step
    assert output.training_loss == summary["train_loss"] == pytest.approx(sum(step_losses) / 3)
    assert summary["train_samples_per_second"] == pytest.approx(summary["train_steps_per_second"] * 8)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train_loss"] == output.training_loss  # in metrics.jsonl too


def test_reward_functions_log_extra_columns_and_metrics_as_in_trl(tmp_path: Path) -> None:
    def logging_reward(completions: list[str], log_extra: Any, log_metric: Any, **kwargs: Any) -> list[float]:
        log_extra("length_class", ["long" if len(c) > 3 else "short" for c in completions])
        log_metric("custom/mean_chars", sum(map(len, completions)) / len(completions))
        log_metric("custom/mean_chars", 0.0)  # two values in one batch: their mean is logged
        return [float(len(c)) for c in completions]

    tokenizer = make_tokenizer()
    args = config(tmp_path, max_steps=2, log_completions=True)
    run = RLOOTrainer(
        make_model(tokenizer), logging_reward, args=args, train_dataset=dataset(), processing_class=tokenizer
    )
    run.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert {row["length_class"] for row in rows} <= {"long", "short"} and len(rows) == 16
    assert all((row["length_class"] == "long") == (len(row["completion"]) > 3) for row in rows)
    logs = [row for row in run.state.log_history if "reward" in row]
    for step_log, step in zip(logs, (1, 2), strict=True):
        completions = [row["completion"] for row in rows if row["step"] == step - 1]
        expected = (sum(map(len, completions)) / len(completions) + 0.0) / 2
        assert step_log["custom/mean_chars"] == pytest.approx(expected)
    from rloo.cli.report import build_report

    page = build_report(tmp_path / "run").read_text()
    assert "<th>length_class</th>" in page  # the report's samples show the column


def test_log_extra_with_the_wrong_length_is_an_error_naming_it(tmp_path: Path) -> None:
    def bad(completions: list[str], log_extra: Any, **kwargs: Any) -> list[float]:
        log_extra("tag", ["x"])
        return [0.0] * len(completions)

    tokenizer = make_tokenizer()
    args = config(tmp_path, max_steps=1, log_completions=True)
    run = RLOOTrainer(make_model(tokenizer), bad, args=args, train_dataset=dataset(), processing_class=tokenizer)
    with pytest.raises(ValueError, match=r"log_extra\('tag', ...\) got 1 values for 8 completions"):
        run.train()
