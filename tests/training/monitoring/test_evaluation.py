"""``RLOOTrainer.evaluate`` with a ``compute_metrics`` hook on tiny runs: what the hook receives, checked
against what the reward functions got and by hand; its metrics in the logs under the eval prefix;
its errors. (Evaluation's reward metrics: tests/training/test_metrics.py, tests/training/setup/test_models.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rloo import RLOOTrainer
from rloo.training.monitoring.compute_metrics import ComputeMetricsError
from tests.helpers.models import answer_metrics, config, dataset, frac7, make_model, make_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


class Recorder:
    """Reward functions that record what they are called with, and a hook that records what it gets."""

    def __init__(self) -> None:
        self.reward_calls: list[dict[str, Any]] = []
        self.hook_calls: list[Any] = []

    def length(self, prompts: list[str], completions: list[str], answer: list[str], **kwargs: Any) -> list[float]:
        self.reward_calls.append({"prompts": prompts, "completions": completions, "answer": answer})
        return [float(len(c)) for c in completions]

    def every_other(self, completions: list[str], **kwargs: Any) -> list[float | None]:
        return [1.0 if i % 2 == 0 else None for i in range(len(completions))]  # applies to half

    def hook(self, eval_pred: Any) -> dict[str, float]:
        self.hook_calls.append(eval_pred)
        return {"mean_length": float(np.mean([len(c) for c in eval_pred.completions]))}


def make_trainer(tmp_path: Path, recorder: Recorder, eval_dataset: Any = None, **overrides: Any) -> RLOOTrainer:
    tokenizer = make_tokenizer()
    # K = 2 per eval prompt, 2 prompts per eval batch (per_device_eval_batch_size 4 completions)
    eval_batches = {"num_generations_eval": 2, "per_device_eval_batch_size": 4}
    args = config(tmp_path, reward_weights=[1.0, 0.5], **eval_batches, **overrides)
    return RLOOTrainer(
        make_model(tokenizer),
        [recorder.length, recorder.every_other],
        args,
        train_dataset=dataset(),
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        compute_metrics=recorder.hook,
    )


def test_the_hook_gets_every_completion_once_as_the_reward_functions_got_them(tmp_path: Path) -> None:
    recorder = Recorder()
    trainer = make_trainer(tmp_path, recorder)
    metrics = trainer.evaluate(dataset(5))  # 5 prompts: batches of 2, 2 and 1 prompts

    assert len(recorder.reward_calls) == 3 and len(recorder.hook_calls) == 1  # once, on every batch's completions
    got = recorder.hook_calls[0]
    rewarded = {key: [v for call in recorder.reward_calls for v in call[key]] for key in recorder.reward_calls[0]}
    assert got.completions == got.predictions == rewarded["completions"]  # in the eval set's order
    assert got.prompts == rewarded["prompts"] == [f"0+{i}=" for i in range(5) for _ in "KK"]  # each prompt K = 2 times
    assert got.columns == {"answer": rewarded["answer"]}
    assert rewarded["answer"] == [str(i) for i in range(5) for _ in "KK"]
    assert got.num_generations == 2 and got.reward_names == ["length", "every_other"]
    # the reward scores, by hand from the completions: len(c); 1 at the even rows of each batch (all of them even)
    lengths = np.array([len(c) for c in got.completions], dtype=np.float32)
    every_other = np.array([1.0, np.nan] * 5, dtype=np.float32)
    np.testing.assert_array_equal(got.label_ids, np.stack([lengths, every_other], axis=1))
    np.testing.assert_allclose(got.rewards, lengths + 0.5 * np.nan_to_num(every_other))  # weights 1 and 0.5
    # its metric, logged with the eval prefix, equals the one evaluation computes itself
    assert metrics["eval_mean_length"] == pytest.approx(metrics["eval_rewards/length/mean"], rel=1e-6)
    assert metrics["eval_mean_length"] == pytest.approx(float(lengths.mean()))
    assert got.metric_key_prefix == "eval" and "mean_length" not in metrics

    again = trainer.evaluate(dataset(5), metric_key_prefix="test")
    assert again["test_mean_length"] == metrics["eval_mean_length"]
    assert recorder.hook_calls[-1].metric_key_prefix == "test"


def test_its_metrics_are_logged_with_each_evaluation_and_can_pick_the_best_model(tmp_path: Path) -> None:
    recorder = Recorder()
    trainer = make_trainer(
        tmp_path,
        recorder,
        eval_dataset=dataset(4),
        max_steps=3,
        eval_steps=1,
        load_best_model_at_end=True,
        metric_for_best_model="mean_length",
    )
    trainer.train()
    logged = [row for row in trainer.state.log_history if "eval_reward" in row]
    assert [row["step"] for row in logged] == [1.0, 2.0, 3.0] and len(recorder.hook_calls) == 3
    assert all(row["eval_mean_length"] == pytest.approx(row["eval_rewards/length/mean"], rel=1e-6) for row in logged)
    written = [json.loads(line) for line in (trainer.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["eval_mean_length"] for row in written if "eval_mean_length" in row] == [
        row["eval_mean_length"] for row in logged
    ]
    assert trainer.state.best_metric == max(row["eval_mean_length"] for row in logged)  # greater is better


def test_each_named_eval_set_gets_its_own_call_and_prefix(tmp_path: Path) -> None:
    recorder = Recorder()
    trainer = make_trainer(tmp_path, recorder, eval_dataset={"easy": dataset(2), "hard": dataset(6)[3:]})
    metrics = trainer.evaluate()
    assert [call.metric_key_prefix for call in recorder.hook_calls] == ["eval_easy", "eval_hard"]
    assert [len(call.completions) for call in recorder.hook_calls] == [4, 6]
    for name in ("easy", "hard"):
        mean_length = metrics[f"eval_{name}_mean_length"]
        assert mean_length == pytest.approx(metrics[f"eval_{name}_rewards/length/mean"], rel=1e-6)


def test_the_trainers_attribute_can_be_set_later_and_a_failing_hook_stops_the_evaluation(tmp_path: Path) -> None:
    recorder = Recorder()
    trainer = make_trainer(tmp_path, recorder)
    trainer.compute_metrics = answer_metrics  # as on transformers' Trainer
    metrics = trainer.evaluate(dataset(4))
    assert metrics["eval_completions_seen"] == 8.0 and recorder.hook_calls == []
    assert metrics["eval_reward_mean"] == pytest.approx(metrics["eval_reward"], rel=1e-6)

    def broken(eval_pred: Any) -> dict[str, float]:
        return {"exact": sum(c == s for c, s in zip(eval_pred.completions, eval_pred.columns["solution"], strict=True))}

    trainer.compute_metrics = broken
    with pytest.raises(ComputeMetricsError, match=r"compute_metrics `broken` failed on the 8 completions of 'eval' "):
        trainer.evaluate(dataset(4))
    trainer.compute_metrics = lambda eval_pred: {"reward": 1.0}
    with pytest.raises(ComputeMetricsError, match="logged as 'eval_reward', evaluation's own name; rename it"):
        trainer.evaluate(dataset(4))


def test_a_hook_that_is_not_a_function_is_refused_when_the_trainer_is_built(tmp_path: Path) -> None:
    tokenizer = make_tokenizer()
    with pytest.raises(ValueError, match="compute_metrics is a float"):
        RLOOTrainer(make_model(tokenizer), frac7, config(tmp_path), dataset(), compute_metrics=0.5)
