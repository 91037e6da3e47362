"""The ``compute_metrics`` hook's input (an ``EvalPrediction`` of the evaluation completions) and the
checks on what it returns, by hand (no model)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from transformers import EvalPrediction

from rloo.training.monitoring.compute_metrics import (
    ComputeMetricsError,
    EvalCompletions,
    EvalRecords,
    call_compute_metrics,
    checked_metrics,
    resolve_compute_metrics,
)
from tests.helpers.models import answer_metrics

NAN = float("nan")


def two_prompts() -> EvalCompletions:
    """2 prompts x K = 2 from two eval batches of one prompt each; rewards `right` (0/1, not applying
    to the last completion) and `length`, combined with weights 1 and 0.5."""
    records = [
        EvalRecords(["1+1=", "1+1="], ["2", "3"], {"answer": ["2", "2"]}),
        EvalRecords(["2+2=", "2+2="], ["4", ""], {"answer": ["4", "4"]}),
    ]
    # the rows evaluation logs: combined reward, each function's score, the batch's loss
    values = torch.tensor([[1.5, 1.0, 1.0, 0.0], [0.5, 0.0, 1.0, 0.0], [1.5, 1.0, 1.0, 0.0], [0.0, NAN, 0.0, 0.0]])
    return EvalCompletions.from_values(records, values, ["right", "length"], k=2, prefix="eval")


def test_it_is_an_eval_prediction_of_the_completions_and_their_reward_scores() -> None:
    completions = two_prompts()
    assert isinstance(completions, EvalPrediction)
    predictions, label_ids = completions  # transformers' unpacking: inputs and losses are None
    assert predictions == ["2", "3", "4", ""] == completions.completions
    np.testing.assert_array_equal(label_ids, np.array([[1, 1], [0, 1], [1, 1], [NAN, 0]], dtype=np.float32))
    assert label_ids.dtype == np.float32 and completions.scores is label_ids
    np.testing.assert_array_equal(completions.rewards, np.array([1.5, 0.5, 1.5, 0.0], dtype=np.float32))
    assert completions.prompts == ["1+1=", "1+1=", "2+2=", "2+2="]
    assert completions.columns == {"answer": ["2", "2", "4", "4"]}
    assert (completions.reward_names, completions.num_generations, completions.metric_key_prefix) == (
        ["right", "length"],
        2,
        "eval",
    )
    # the test suite's hook, by hand: "2" and "4" hold their answers; checksum 0*1 + 1*1 + 2*1 + 3*0
    assert answer_metrics(completions) == {
        "answer_rate": 0.5,
        "completions_seen": 4,
        "order_checksum": 3,
        "reward_mean": 0.875,
    }


def test_inputs_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="3 completions"):
        EvalCompletions(
            prompts=["a", "b"],
            completions=["x", "y", "z"],
            columns={},
            scores=np.zeros((3, 1), dtype=np.float32),
            rewards=np.zeros(3, dtype=np.float32),
            reward_names=["f"],
            num_generations=1,
        )


def test_keys_get_the_prefix_unless_they_have_it_and_numbers_become_floats() -> None:
    returned = {
        "accuracy": np.float64(0.25),
        "eval_f1": 1,
        "exact": torch.tensor(0.5),
        "count": np.array(3),
        "ok": True,
    }
    assert checked_metrics(returned, "hook", "eval") == {
        "eval_accuracy": 0.25,
        "eval_f1": 1.0,
        "eval_exact": 0.5,
        "eval_count": 3.0,
        "eval_ok": 1.0,
    }
    assert checked_metrics({"accuracy": 0.5}, "hook", "eval_easy") == {"eval_easy_accuracy": 0.5}  # a named set
    assert checked_metrics({"accuracy": 0.5}, "hook", None) == {"accuracy": 0.5}  # rloo eval: as returned
    assert all(type(value) is float for value in checked_metrics(returned, "hook", "eval").values())


@pytest.mark.parametrize(
    ("returned", "parts"),
    [
        ([0.5], ["compute_metrics `hook` returned a list", "return a dict of metric name -> number"]),
        (None, ["compute_metrics `hook` returned a NoneType"]),
        ({1: 0.5}, ["compute_metrics `hook` returned the key 1 (int)", "name metrics by str"]),
        ({"accuracy": "high"}, ["returned 'accuracy': 'high' (str)", "one real number"]),
        ({"accuracy": np.array([0.5, 1.0])}, ["returned 'accuracy': array([0.5, 1. ]) (ndarray)"]),
        ({"accuracy": None}, ["returned 'accuracy': None (NoneType)"]),
        ({"accuracy": NAN}, ["returned 'accuracy': nan", "must be finite", "leave a metric out"]),
        ({"accuracy": np.float32("inf")}, ["returned 'accuracy': inf", "must be finite"]),
        ({"reward": 0.5}, ["returned 'reward', logged as 'eval_reward', evaluation's own name; rename it"]),
        ({"eval_loss": 0.5}, ["returned 'eval_loss', logged as 'eval_loss', evaluation's own name"]),
        ({"accuracy": 0.5, "eval_accuracy": 0.5}, ["'eval_accuracy', logged as 'eval_accuracy', another key's"]),
    ],
    ids=[
        "a-list",
        "none",
        "an-int-key",
        "a-string",
        "an-array",
        "a-none-value",
        "nan",
        "inf",
        "evaluations-own",
        "evaluations-own-prefixed",
        "twice",
    ],
)
def test_what_is_no_dict_of_finite_numbers_is_refused_naming_the_hook_and_key(returned: Any, parts: list[str]) -> None:
    logged = {"eval_reward": 0.1, "eval_loss": 0.0}
    with pytest.raises(ComputeMetricsError) as error:
        call_compute_metrics(lambda _: returned, two_prompts(), "eval", logged)
    message = str(error.value).replace("`<lambda>`", "`hook`")
    for part in parts:
        assert part in message, message


def test_a_hook_that_raises_is_named_with_the_evaluation_and_the_cause() -> None:
    def task_accuracy(eval_pred: Any) -> dict[str, float]:
        solutions = eval_pred.columns["solution"]  # the set's column is `answer`
        return {"accuracy": float(np.mean([c == s for c, s in zip(eval_pred.completions, solutions, strict=True)]))}

    with pytest.raises(ComputeMetricsError) as error:
        call_compute_metrics(task_accuracy, two_prompts(), "eval")
    assert str(error.value).startswith(
        "compute_metrics `task_accuracy` failed on the 4 completions of 'eval' (2 prompts x 2): KeyError: 'solution'; "
        "fix the function"
    )
    assert isinstance(error.value.__cause__, KeyError)  # the traceback shows where inside it failed


def test_a_hook_is_a_function_or_its_import_string() -> None:
    assert resolve_compute_metrics(None) is None
    assert resolve_compute_metrics(answer_metrics) is answer_metrics
    assert resolve_compute_metrics("tests.helpers.models:answer_metrics") is answer_metrics
    with pytest.raises(ValueError, match=r"compute_metrics 'tests\.helpers\.models:answer_metric': module"):
        resolve_compute_metrics("tests.helpers.models:answer_metric")
    with pytest.raises(ValueError, match="compute_metrics 'accuracy' is not an import string: write 'package"):
        resolve_compute_metrics("accuracy")
    with pytest.raises(ValueError, match="compute_metrics is a dict"):
        resolve_compute_metrics({"accuracy": 1.0})
    assert math.isfinite(call_compute_metrics(answer_metrics, two_prompts(), "eval")["eval_answer_rate"])
