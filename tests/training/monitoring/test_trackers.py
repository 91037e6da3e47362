"""Trackers through accelerate (report_to): TRL's metric names, the run's config, a missing package
named, and a real TensorBoard event file (CPU, tiny model)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from accelerate.tracking import GeneralTracker, register_tracker_class

from rloo import RLOOConfig, RLOOTrainer
from rloo.config.fields.reporting import TRACKERS
from rloo.training.monitoring.trackers import flat_config, tracked_values, tracker_key, tracker_names
from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


class RecordingTracker(GeneralTracker):
    """Records what accelerate hands a tracker (registered under the name ``recording``)."""

    name = "recording"
    requires_logging_directory = False
    main_process_only = True
    runs: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.record: dict[str, Any] = {"project": run_name, "kwargs": kwargs, "logs": [], "finished": False}
        RecordingTracker.runs.append(self.record)

    @property
    def tracker(self) -> Any:
        return self.record

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.record["config"] = values

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.record["logs"].append((step, dict(values)))

    def finish(self) -> None:
        self.record["finished"] = True


register_tracker_class(RecordingTracker)


def test_trl_names() -> None:
    assert tracker_key("reward") == "train/reward"
    assert tracker_key("rewards/frac7/mean") == "train/rewards/frac7/mean"
    assert tracker_key("eval_reward") == "eval/reward"
    assert tracker_key("eval_rewards/acc/mean") == "eval/rewards/acc/mean"
    assert tracker_key("eval_math_reward") == "eval/math_reward"  # a named eval set
    assert tracker_key("test_loss") == "test/loss"
    assert tracker_key("evaluation") == "train/evaluation"  # only the eval_ prefix is eval
    assert tracked_values({"step": 3.0, "reward": 0.5, "eval_reward": 1, "flag": True}) == {
        "train/reward": 0.5,
        "eval/reward": 1.0,
    }


def test_flat_config_keeps_scalars_and_writes_the_rest_as_text() -> None:
    flat = flat_config(
        {"learning_rate": 1e-5, "peft": {"r": 8, "target_modules": ["q", "v"]}, "eval_steps": None, "x": float("nan")}
    )
    assert flat == {
        "learning_rate": 1e-5,
        "peft.r": 8,
        "peft.target_modules": "['q', 'v']",
        "eval_steps": "None",
        "x": "nan",
    }


def test_report_to_none_starts_no_tracker_and_all_only_installed_ones() -> None:
    assert tracker_names(["none"]) == []
    installed = tracker_names(["all"])
    assert "recording" not in installed  # all = accelerate's installed trackers, not custom ones
    if importlib.util.find_spec("tensorboard") is not None:
        assert "tensorboard" in installed


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_a_tracker_whose_package_is_missing_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"report_to includes 'wandb' but the wandb package is not installed: pip"):
        args = config(tmp_path, report_to="wandb")
        RLOOTrainer(make_model(make_tokenizer()), frac7, args=args, train_dataset=dataset())


def test_the_one_tracker_list_is_accelerates() -> None:
    # report_to's choices, its help text and the missing-package message all read TRACKERS: a tracker
    # accelerate adds (or drops) shows here as one entry to add (or remove)
    from accelerate.utils import LoggerType

    assert set(TRACKERS) == {kind.value for kind in LoggerType} - {"all"}
    help_text = next(f for f in dataclasses.fields(RLOOConfig) if f.name == "report_to").metadata["help"]
    assert ", ".join(TRACKERS) in help_text


def test_an_unknown_tracker_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"report_to.*'tensorbord'.*register_tracker_class"):
        RLOOConfig(report_to=["tensorbord"])


def test_a_registered_tracker_gets_the_config_and_trl_named_metrics(tmp_path: Path) -> None:
    RecordingTracker.runs.clear()
    tokenizer = make_tokenizer()
    args = config(tmp_path, report_to=["recording"], max_steps=2, eval_steps=2, run_name="tracked")
    data = {"train_dataset": dataset(), "eval_dataset": dataset(2)}
    run = RLOOTrainer(make_model(tokenizer), frac7, args=args, processing_class=tokenizer, **data)
    run.train()
    (record,) = RecordingTracker.runs
    assert record["project"] == "rloo" and record["finished"]
    assert record["config"]["learning_rate"] == args.learning_rate
    assert record["config"]["report_to"] == "['recording']"
    steps = [step for step, _ in record["logs"]]
    assert steps[:2] == [1, 2]
    first = record["logs"][0][1]
    assert {"train/reward", "train/loss", "train/kl", "train/completions/mean_length"} <= set(first)
    evaluation = next(values for _, values in record["logs"] if "eval/reward" in values)
    assert "eval/rewards/frac7/mean" in evaluation
    # the tracker got what metrics.jsonl holds, under TRL's names
    jsonl = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert first["train/reward"] == pytest.approx(jsonl[0]["reward"])
    assert len(record["logs"]) == len(jsonl)


def test_a_second_train_call_starts_the_trackers_afresh(tmp_path: Path) -> None:
    RecordingTracker.runs.clear()
    tokenizer = make_tokenizer()
    args = config(tmp_path, report_to=["recording"], max_steps=1, save_steps=1)
    run = RLOOTrainer(make_model(tokenizer), frac7, args=args, train_dataset=dataset(), processing_class=tokenizer)
    run.train()
    run.train(resume_from_checkpoint=True)  # already at max_steps: only the summary is logged
    assert len(RecordingTracker.runs) == 2 and all(r["finished"] for r in RecordingTracker.runs)
    assert len(run.accelerator.trackers) == 0


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")
def test_tensorboard_event_file_holds_trl_named_scalars_and_the_config(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tokenizer = make_tokenizer()
    args = config(tmp_path, report_to="tensorboard", max_steps=2)
    RLOOTrainer(make_model(tokenizer), frac7, args=args, train_dataset=dataset(), processing_class=tokenizer).train()
    logdir = tmp_path / "run" / "tensorboard" / "rloo"
    events = EventAccumulator(str(logdir)).Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/reward", "train/loss", "train/train_loss"} <= tags
    assert [event.step for event in events.Scalars("train/reward")] == [1, 2]
    hparams = list(logdir.glob("*/hparams.yml"))
    assert hparams and "learning_rate" in hparams[0].read_text()


def test_a_fresh_run_over_an_earlier_one_keeps_its_tensorboard_folder(tmp_path: Path) -> None:
    earlier = tmp_path / "run" / "tensorboard"
    earlier.mkdir(parents=True)
    (earlier / "events.out").write_text("earlier run")
    tokenizer = make_tokenizer()
    args = config(tmp_path, max_steps=1, overwrite_output_dir=True)
    RLOOTrainer(make_model(tokenizer), frac7, args=args, train_dataset=dataset(), processing_class=tokenizer).train()
    kept = list((tmp_path / "run").glob("tensorboard.before-*/events.out"))
    assert len(kept) == 1 and kept[0].read_text() == "earlier run"
