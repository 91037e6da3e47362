"""Metrics TRL documents for RLOO, logged under TRL's names: terminated lengths, clip-ratio
extremes, step_time and a mixture-of-experts model's aux_loss; which rows the KL, entropy and clip
fractions are over when skip_zero_advantage leaves rows out (offline, CPU, tiny models)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.trainer_utils import TrainOutput

from rloo import RLOOConfig, RLOOTrainer
from rloo.algo.stats import masked_mean
from rloo.forward.logprobs import completion_logprobs
from rloo.training.metrics import completion_metrics
from rloo.training.parallel.distributed import reduce_step_metrics
from rloo.training.passes import TrainBatch, no_grad_logprobs
from rloo.training.update import is_mixture_of_experts
from tests.helpers.models import (
    config,
    dataset,
    frac7,
    last_train_log,
    make_model,
    make_tokenizer,
    next_train_batch,
    trainer,
)

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
        {"clip_ratio/low_mean": 0.1, "clip_ratio/low_min": 0.1, "clip_ratio/high_max": 0.0, "_actions": 10.0},
        {"clip_ratio/low_mean": 0.3, "clip_ratio/low_min": 0.3, "clip_ratio/high_max": 0.2, "_actions": 30.0},
        {"clip_ratio/low_min": math.nan, "clip_ratio/high_max": math.nan, "_actions": 0.0},
    ]
    out = reduce_step_metrics(per_rank)
    assert out["clip_ratio/low_min"] == 0.1 and out["clip_ratio/high_max"] == 0.2
    assert out["clip_ratio/low_mean"] == pytest.approx((0.1 * 10 + 0.3 * 30) / 40)


def test_clip_fractions_are_weighted_over_processes_by_their_actions() -> None:
    per_rank = [
        {"clip_ratio/low_mean": 0.5, "entropy": 2.0, "_tokens": 10.0, "_actions": 4.0},
        {"clip_ratio/low_mean": 0.0, "_actions": 12.0},  # every row skipped: no entropy, none clipped
    ]
    out = reduce_step_metrics(per_rank)
    assert out["clip_ratio/low_mean"] == pytest.approx(0.5 * 4 / 16) and out["entropy"] == 2.0


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


def _moe_trainer(tmp_path: Path, model_coef: float = 0.001, **overrides: Any) -> RLOOTrainer:
    """A trainer of a tiny Qwen3-MoE whose config declares ``router_aux_loss_coef=model_coef``."""
    tokenizer = make_tokenizer()
    moe = Qwen3MoeConfig(
        router_aux_loss_coef=model_coef,
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


def test_the_router_loss_weight_is_the_model_configs_own_unless_set(tmp_path: Path) -> None:
    # TRL 1.16: router_aux_loss_coef=None takes the architecture's coefficient (it was a fixed 0.001)
    default = _moe_trainer(tmp_path / "a", model_coef=0.02)
    assert RLOOConfig(output_dir="x").router_aux_loss_coef is None
    assert default.updater.aux_loss_coef == default.router_aux_loss_coef == 0.02 and default.aux_loss_enabled
    assert _moe_trainer(tmp_path / "b", model_coef=0.02, router_aux_loss_coef=0.5).router_aux_loss_coef == 0.5
    off = _moe_trainer(tmp_path / "c", model_coef=0.02, router_aux_loss_coef=0.0)
    assert off.router_aux_loss_coef == 0.0 and not off.aux_loss_enabled


def test_a_router_loss_weight_set_for_a_model_without_routers_is_warned_about(tmp_path: Path) -> None:
    assert not trainer(tmp_path / "a").aux_loss_enabled  # unset: nothing to add, nothing said
    # TRL raises; rloo warns: a config.yaml written before the default became None records 0.001
    with pytest.warns(UserWarning, match=r"router_aux_loss_coef=0\.001 has no effect on LlamaForCausalLM.*unset"):
        old_run = trainer(tmp_path / "b", router_aux_loss_coef=0.001)
    assert not old_run.aux_loss_enabled and old_run.router_aux_loss_coef == 0.0


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
        completions = [row["completion"] for row in rows if row["step"] == step]
        expected = (sum(map(len, completions)) / len(completions) + 0.0) / 2
        assert step_log["custom/mean_chars"] == pytest.approx(expected)
    from rloo.report.page import build_report

    page = build_report(tmp_path / "run").read_text()
    assert "<th>length_class</th>" in page  # the report's samples show the column


def test_completions_jsonl_steps_are_metrics_jsonl_steps_and_carry_each_functions_reward(tmp_path: Path) -> None:
    """Before: completions were logged under the step count before their update (0, logging_steps, ...), one
    logging window off metrics.jsonl's steps, with the combined reward only."""

    def every_other(completions: list[str], **kwargs: Any) -> list[float | None]:
        return [None if i % 2 else 1.0 for i in range(len(completions))]

    def read(path: Path) -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines()]

    t = trainer(tmp_path / "a", reward_funcs=[frac7, every_other], max_steps=2, log_completions=True)
    t.train()
    rows = read(tmp_path / "a" / "run" / "completions.jsonl")
    logged = {row["step"]: row for row in read(tmp_path / "a" / "run" / "metrics.jsonl") if "reward" in row}
    assert sorted({row["step"] for row in rows}) == sorted(logged) == [1, 2]
    for step, metrics in logged.items():  # logging_steps=1: each row's numbers are of its step's completions
        at_step = [row for row in rows if row["step"] == step]
        assert all(set(row["rewards"]) == {"frac7", "every_other"} for row in at_step)
        for name in ("frac7", "every_other"):
            scores = [row["rewards"][name] for row in at_step if row["rewards"][name] is not None]
            assert metrics[f"rewards/{name}/mean"] == pytest.approx(sum(scores) / len(scores))
        assert [row["rewards"]["every_other"] for row in at_step[:2]] == [1.0, None]
        assert metrics["reward"] == pytest.approx(sum(row["reward"] for row in at_step) / len(at_step))
    # logged every 2 steps of 3: the completions of steps 2 and 3 (the last step logs too), under those steps
    trainer(tmp_path / "b", max_steps=3, logging_steps=2, log_completions=True).train()
    rows = read(tmp_path / "b" / "run" / "completions.jsonl")
    steps = [row["step"] for row in read(tmp_path / "b" / "run" / "metrics.jsonl") if "reward" in row]
    assert sorted({row["step"] for row in rows}) == steps == [2, 3]


def test_log_extra_with_the_wrong_length_is_an_error_naming_it(tmp_path: Path) -> None:
    def bad(completions: list[str], log_extra: Any, **kwargs: Any) -> list[float]:
        log_extra("tag", ["x"])
        return [0.0] * len(completions)

    tokenizer = make_tokenizer()
    args = config(tmp_path, max_steps=1, log_completions=True)
    run = RLOOTrainer(make_model(tokenizer), bad, args=args, train_dataset=dataset(), processing_class=tokenizer)
    with pytest.raises(ValueError, match=r"log_extra\('tag', ...\) got 1 values for 8 completions"):
        run.train()


# skip_zero_advantage leaves rows with A = 0 out of the training passes: which rows each metric is over


@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_clip_fractions_count_every_rows_actions_and_entropy_the_trained_rows(tmp_path: Path, ratio_level: str) -> None:
    t = trainer(tmp_path, beta=0.0, ratio_level=ratio_level)
    assert t.updater.exact_skip
    batch = next_train_batch(t)
    rollout, mask = batch.rollout, batch.loss_mask
    model, temperature = t.unwrapped_model, t.args.temperature
    current = no_grad_logprobs(model, rollout, temperature, max_rows=batch.num_rows)
    # stored old log-probs 1 above the current ones on every token: rho <= e^-1, low-clipped where A < 0
    advantages = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.5, -0.5, -0.5, -0.5])
    batch = dataclasses.replace(batch, advantages=advantages, old_logprobs=(current + 1.0) * rollout.completion_mask)
    with torch.no_grad():
        entropy = completion_logprobs(
            model,
            rollout.prompt_ids,
            rollout.prompt_mask,
            rollout.completion_ids,
            rollout.completion_mask,
            temperature,
            with_entropy=True,
        ).entropy
    assert entropy is not None
    metrics = t.updater.step(batch, [torch.arange(8)], global_step=0).metrics
    assert metrics["train/skipped_rows_frac"] == 0.5
    # over every row's actions (tokens, or completions), rows 0-3 never clipped: 3 rows of 8 have A < 0
    clipped, actions = (mask[5:].sum(), mask.sum()) if ratio_level == "token" else (3.0, 8.0)
    assert metrics["clip_ratio/low_mean"] == pytest.approx(float(clipped / actions), rel=1e-6)
    assert metrics["clip_ratio/region_mean"] == metrics["clip_ratio/low_min"] == metrics["clip_ratio/low_mean"]
    assert metrics["clip_ratio/high_mean"] == 0.0
    # the entropy is the trained rows' (rows 0-3 had no forward), not every row's
    trained = mask * (advantages != 0).unsqueeze(1)
    assert metrics["entropy"] == pytest.approx(float(masked_mean(entropy, trained)), abs=2e-6)
    assert abs(metrics["entropy"] - float(masked_mean(entropy, mask))) > 2e-5  # small: the tiny model is near uniform


def test_kl_is_over_every_row_when_rows_skip_the_training_passes(tmp_path: Path) -> None:
    t = trainer(tmp_path, beta=0.05, kl_placement="reward", kl_estimator="k1", max_steps=1)
    t.updater.one_pass = lambda rollout: False  # type: ignore[method-assign]  # rows skip: a separate old pass
    with torch.no_grad():  # the policy apart from its reference: a KL that differs between rows
        generator = torch.Generator().manual_seed(0)
        for p in t.unwrapped_model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    kl: dict[str, float] = {}
    make = t._train_batch

    def skipping(scored: Any, logprobs: Any) -> TrainBatch:
        batch = make(scored, logprobs)
        assert batch.old_logprobs is not None and batch.reference_logprobs is not None
        per_token = (batch.old_logprobs - batch.reference_logprobs) * batch.loss_mask  # k1
        kl["every row"] = float(per_token.sum() / batch.loss_mask.sum())
        kl["trained rows"] = float(per_token[4:].sum() / batch.loss_mask[4:].sum())
        # A = 0 on rows 0-3: they skip the training passes
        return dataclasses.replace(batch, advantages=batch.advantages.clone().index_fill_(0, torch.arange(4), 0.0))

    t._train_batch = skipping  # type: ignore[method-assign]
    t.train()
    logged = last_train_log(t)
    assert logged["train/skipped_rows_frac"] == 0.5
    assert logged["kl"] == pytest.approx(kl["every row"], rel=1e-6)
    assert abs(kl["every row"] - kl["trained rows"]) > 1e-3 * abs(kl["every row"])
    # with the KL in the loss no row skips (its KL gradient is not zero): the training passes' kl is every row's
    assert not trainer(tmp_path / "in-loss", beta=0.05, kl_placement="loss", kl_estimator="k3").updater.exact_skip


def test_eval_metrics_give_the_unbiased_pass_at_k_for_every_k() -> None:
    """Two prompts x K = 2: combined rewards (1, 0) and (0, NaN); a 0/1 function and a graded one."""
    from rloo.training.metrics import eval_metrics

    nan = float("nan")
    values = torch.tensor([[1.0, 1.0, 0.5], [0.0, 0.0, 0.2], [0.0, 1.0, 0.7], [nan, nan, nan]])
    metrics = eval_metrics(values, ["right", "graded"], "eval", k=2)
    # prompt 0: one success of 2 -> pass@1 1/2, pass@2 1; prompt 1: none (NaN is not a success)
    assert metrics["eval_pass@1"] == 0.25 and metrics["eval_pass@2"] == 0.5
    # "right": prompt 0 (1, 0), prompt 1 (1, NaN): pass@1 = (1/2 + 1/2) / 2, pass@2 = 1
    assert metrics["eval_rewards/right/pass@1"] == 0.5 and metrics["eval_rewards/right/pass@2"] == 1.0
    assert not any("graded/pass@" in key for key in metrics)  # not 0/1-valued
    assert not any("pass@" in key for key in eval_metrics(values, ["right", "graded"], "eval"))  # k = 1


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    from rloo.algo.stats import pass_at_k

    successes = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]]).bool()
    # prompt 0: 1 - C(3, k) / C(4, k) = 1/4, 1/2, 3/4, 1; prompt 1: 0; prompt 2: 1
    assert [pass_at_k(successes, k) for k in (1, 2, 3, 4)] == pytest.approx(
        [(0.25 + 1) / 3, (0.5 + 1) / 3, (0.75 + 1) / 3, 2 / 3]
    )
    with pytest.raises(ValueError, match="1 <= k <= n = 4"):
        pass_at_k(successes, 5)


def test_evaluate_logs_pass_at_k_for_k_up_to_its_samples(tmp_path: Path) -> None:
    from tests.helpers.models import dataset, trainer

    run = trainer(tmp_path, num_generations_eval=3)
    metrics = run.evaluate(dataset(44)[40:])
    assert [key for key in metrics if key.startswith("eval_pass@")] == ["eval_pass@1", "eval_pass@2", "eval_pass@3"]
    assert metrics["eval_pass@1"] <= metrics["eval_pass@2"] <= metrics["eval_pass@3"]


def test_each_reward_functions_metrics_are_its_own_scores_under_reward_weights(tmp_path: Path) -> None:
    def ones(completions: list[Any], **kwargs: Any) -> list[float]:
        return [1.0] * len(completions)

    def zero_or_two(completions: list[Any], **kwargs: Any) -> list[float | None]:
        return [None if i % 4 == 3 else float(2 * (i % 2)) for i in range(len(completions))]  # 0, 2, 0, None, ...

    t = trainer(tmp_path, reward_funcs=[ones, zero_or_two], reward_weights=[0.7, 0.3], max_steps=1)
    t.train()
    # as TRL: unweighted, over the completions each applies to (std with ddof 1); `reward` is the weighted sum
    per_batch = torch.tensor([0.0, 2.0, 0.0] * 2)  # the 8 completions of the step, 2 of them not applicable
    for logged in (last_train_log(t), t.evaluate(eval_dataset=dataset(2))):
        prefix = "eval_" if "eval_reward" in logged else ""
        assert logged[f"{prefix}rewards/ones/mean"] == 1.0 and logged[f"{prefix}rewards/ones/std"] == 0.0
        assert logged[f"{prefix}rewards/zero_or_two/mean"] == pytest.approx(float(per_batch.mean()))
        assert logged[f"{prefix}rewards/zero_or_two/std"] == pytest.approx(float(per_batch.std()))
        assert logged[f"{prefix}reward"] == pytest.approx(0.7 + 0.3 * 4 / 8)  # a None adds nothing (TRL's nansum)
