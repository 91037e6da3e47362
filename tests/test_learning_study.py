"""The learning study (benchmarks/learning.py): its tasks by hand, its plan, and a tiny study end to end."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import learning  # noqa: E402
from learning_report import completions_to, render  # noqa: E402
from tasks import arithmetic_task, reversal_rows, reversal_task  # noqa: E402

from rloo.cli.supervised import encode_demonstrations, supervised_batch  # noqa: E402
from rloo.tiny import build_char_tokenizer  # noqa: E402


def test_reversal_rows_are_every_word_reversed() -> None:
    rows = reversal_rows("ab", (1, 2))
    assert rows == [
        {"prompt": "a>", "answer": "a"},
        {"prompt": "b>", "answer": "b"},
        {"prompt": "aa>", "answer": "aa"},
        {"prompt": "ab>", "answer": "ba"},
        {"prompt": "ba>", "answer": "ab"},
        {"prompt": "bb>", "answer": "bb"},
    ]


def test_reversal_task_splits_teaches_and_rewards_exactly() -> None:
    task = reversal_task(0)
    assert len(task.train) + len(task.held_out) == 6**3 + 6**4 + 6**5
    assert len(task.train) == int(0.8 * (6**3 + 6**4 + 6**5))
    assert not {r["prompt"] for r in task.train} & {r["prompt"] for r in task.held_out}
    assert task.train != reversal_task(1).train  # the seed shuffles the split
    assert task.completion_length == 7  # 5 letters, EOS and one to spare
    for (prompt, target), row in zip(task.demonstrations, task.train, strict=True):
        assert prompt == row["prompt"] and target == row["answer"] == prompt[:-1][::-1]  # correct teacher
    rewards = task.reward(["fedcb", "fedcb ", "FEDCB", "fedc", "bcdef"], answer=["fedcb"] * 5)
    assert rewards == [1.0, 0.0, 0.0, 0.0, 0.0]  # the exact string, character for character


def test_arithmetic_task_is_the_demos_with_its_carry_less_teacher() -> None:
    task = arithmetic_task(0)
    # 90 x 90 additions and the 4095 subtractions a - b with a >= b, split 80/20
    assert len(task.train) == int(0.8 * 12195) and len(task.train) + len(task.held_out) == 12195
    demonstrations = dict(task.demonstrations)
    answers = {row["prompt"]: row["answer"] for row in task.train}
    wrong = [p for p, target in demonstrations.items() if int(target) != answers[p]]
    assert 0.4 < len(wrong) / len(answers) < 0.5  # the teacher never carries nor borrows
    if "47+38=" in demonstrations:
        assert demonstrations["47+38="] == "75" and answers["47+38="] == 85
    assert task.reward(["85", "75", "x"], answer=[85, 85, 85]) == [1.0, 0.0, 0.0]


def test_supervised_batch_labels_only_the_target_and_eos() -> None:
    tokenizer = build_char_tokenizer("abc>")
    encoded = encode_demonstrations([("ab>", "ba")], tokenizer)
    ids, labels = supervised_batch(encoded, tokenizer.pad_token_id, 2, random.Random(0))
    prompt, target = tokenizer("ab>")["input_ids"], tokenizer("ba")["input_ids"]
    assert ids[0].tolist() == prompt + target + [tokenizer.eos_token_id]
    assert labels[0].tolist() == [-100] * len(prompt) + target + [tokenizer.eos_token_id]


def test_the_plan_compares_estimators_and_ablations_at_equal_compute() -> None:
    from rloo.algo.losses import AGGREGATION_MODES

    runs = learning.plan(learning.PARTS, quick=False)
    grid = [r for r in runs if r["part"] == "estimators"]
    assert len(grid) == 4 * 3 * 3 and {r["task"] for r in grid} == {"arithmetic"}
    assert len([r for r in runs if r["part"] == "reversal"]) == 36
    ablations = [r for r in runs if r["part"] == "ablations"]
    assert {r["seed"] for r in ablations} == {0, 1, 2}
    assert all(r["estimator"] == "rloo" and r["knobs"]["num_generations"] == 4 for r in ablations)
    knobs = [r["knobs"] for r in ablations if r["seed"] == 0]
    assert {k.get("kl_placement") for k in knobs} >= {"reward", "loss"}
    assert {k.get("loss_aggregation") for k in knobs} | {"seq_mean_token_sum"} >= set(AGGREGATION_MODES)
    assert {"num_iterations": 2, "num_generations": 4} in knobs
    stale = [r["knobs"] for r in runs if r["part"] == "staleness" and r["seed"] == 0]
    assert [k["max_staleness"] for k in stale] == [0, 1, 1, 2, 2]
    assert [k.get("vllm_importance_sampling_correction", True) for k in stale] == [True, True, False, True, False]
    reversal = [r for r in runs if r["part"] == "staleness-reversal"]
    assert {r["task"] for r in reversal} == {"reversal"} and [r["knobs"] for r in reversal if r["seed"] == 0] == stale
    dynamic = [r for r in runs if r["part"] == "dynamic"]
    assert len(dynamic) == 2 * 3 * 2 and {r["task"] for r in dynamic} == {"arithmetic", "reversal"}
    assert all(r["estimator"] == "rloo" and r["knobs"]["num_generations"] == 4 for r in dynamic)
    assert [r["knobs"].get("dynamic_sampling", False) for r in dynamic if r["seed"] == 0] == [False, True] * 2


def test_completions_to_counts_until_the_threshold() -> None:
    assert completions_to([(0, 0.4), (100, 0.5), (200, 0.6), (300, 0.5)], 0.55) == 200
    assert completions_to([(0, 0.4), (100, 0.5)], 0.55) is None


def test_a_tiny_study_runs_end_to_end(tmp_path: Path) -> None:
    """Every part, tiny: the warm starts, runs, results, tables and plots."""
    budgets = {name: learning.Budget(4, 16, 2, 0.5) for name in ("arithmetic", "reversal")}
    saved: list[list[dict[str, Any]]] = []
    runs = learning.run_study(learning.plan(learning.PARTS, quick=True), budgets, saved.append, warm_start_steps=25)
    assert len(runs) == len(saved) == 12
    by_label = {r["label"]: r for r in runs if r["part"] != "reversal"}
    for run in runs:
        assert run["curve"][0] == (0, run["warm_start"]) and run["curve"][-1][1] == run["final"]
        assert run["grad_var"]["groups"] == 4 and run["grad_var"]["none"] >= 0
    # num_iterations 2 takes twice the optimizer steps on as many generated completions
    assert [s for s, _ in by_label["num_iterations 2"]["curve"]] == [s for s, _ in by_label["rloo"]["curve"]]
    assert by_label["num_iterations 2"]["curve"][-1][0] == 4 * 16
    document = {"command": "test", "budgets": {k: vars(v) for k, v in budgets.items()}, "total_seconds": 1.0}
    text = render(json.loads(json.dumps({**document, "runs": runs})), tmp_path)
    for heading in ("Estimators on arithmetic", "Estimators on reversal", "Ablations on arithmetic", "Staleness on"):
        assert heading in text
    assert "| KL in loss (beta 0.05) |" in text and "| num_iterations 2 |" in text and "| s = 1, corrected |" in text
    assert "### Dynamic sampling on reversal" in text and "| dynamic sampling |" in text
    plain, dynamic = (
        next(r for r in runs if r["part"] == "dynamic" and r["label"] == x) for x in learning.DYNAMIC_RUNS
    )
    assert plain["generated"] == 4 * 16 and plain["gen_batches"] == 1.0  # one round per batch
    assert dynamic["generated"] == 16 * 4 * dynamic["gen_batches"] >= plain["generated"]  # every round counted
    assert dynamic["curve"][-1][0] == dynamic["generated"]  # the curve's x: completions generated so far
    assert dynamic["at_budget"][0] <= plain["generated"] and plain["at_budget"] == plain["curve"][-1]
    for plot in (
        "curves-arithmetic.png",
        "curves-reversal.png",
        "ablations.png",
        "staleness.png",
        "variance.png",
        "staleness-reversal.png",
    ):
        assert (tmp_path / plot).stat().st_size > 1000
    assert (tmp_path / "dynamic.png").stat().st_size > 1000


@pytest.mark.parametrize("seed", [0])
def test_reversal_warm_start_stops_early_at_its_level(seed: int) -> None:
    from tasks import warm_start

    task = reversal_task(seed, warm_start_accuracy=0.05)
    model, tokenizer, accuracy = warm_start(task, seed, max_steps=400)
    assert task.accuracy(model, tokenizer, task.train[:200]) >= 0.05
    assert 0 < accuracy < 0.9  # stopped early: room left for RL
