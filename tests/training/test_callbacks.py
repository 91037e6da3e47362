"""transformers' TrainerCallback works as in TRL; rloo's plain callbacks keep working (CPU, tiny model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import TrainerCallback, TrainerControl, TrainerState

from rloo import RLOOTrainer
from rloo.training.callbacks import Callbacks
from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer, trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def with_eval_set(tmp_path: Path, callbacks: Any = None, **overrides: Any) -> RLOOTrainer:
    tokenizer = make_tokenizer()
    return RLOOTrainer(
        make_model(tokenizer),
        frac7,
        args=config(tmp_path, **overrides),
        train_dataset=dataset(),
        eval_dataset=dataset(2),
        processing_class=tokenizer,
        callbacks=callbacks,
    )


class Recorder(TrainerCallback):
    """Records every event with what transformers passes."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.kwargs: dict[str, set[str]] = {}

    def _record(self, event: str, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        assert isinstance(state, TrainerState) and isinstance(control, TrainerControl)
        self.events.append((event, state.global_step))
        self.kwargs[event] = set(kwargs)

    def on_init_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._record("init_end", args, state, control, **kwargs)

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._record("train_begin", args, state, control, **kwargs)

    def on_step_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._record("step_begin", args, state, control, **kwargs)

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._record("step_end", args, state, control, **kwargs)

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._record("log", args, state, control, **kwargs)

    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._record("evaluate", args, state, control, **kwargs)

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._record("save", args, state, control, **kwargs)

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._record("train_end", args, state, control, **kwargs)


def test_a_trainer_callback_sees_every_event_with_transformers_arguments(tmp_path: Path) -> None:
    recorder = Recorder()
    run = with_eval_set(tmp_path, max_steps=2, logging_steps=2, save_steps=2, eval_steps=2)
    run.add_callback(recorder)
    run.train()
    assert recorder.events == [
        ("train_begin", 0),
        ("step_begin", 0),
        ("step_end", 1),
        ("step_begin", 1),
        ("step_end", 2),
        ("log", 2),
        ("log", 2),  # the eval metrics
        ("evaluate", 2),
        ("save", 2),
        ("log", 2),  # the run's summary
        ("train_end", 2),
    ]
    assert {"model", "processing_class", "optimizer", "lr_scheduler"} <= recorder.kwargs["step_end"]
    assert "logs" in recorder.kwargs["log"] and "metrics" in recorder.kwargs["evaluate"]


def test_init_end_fires_when_the_trainer_is_built(tmp_path: Path) -> None:
    recorder = Recorder()
    trainer(tmp_path, callbacks_=[recorder])
    assert recorder.events == [("init_end", 0)]


class StopAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        control.should_training_stop = state.global_step >= self.step
        return control


class AskFor(TrainerCallback):
    """Sets one control flag after step ``step``."""

    def __init__(self, flag: str, step: int) -> None:
        self.flag, self.step = flag, step

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if state.global_step == self.step:
            setattr(control, self.flag, True)


def test_should_training_stop_ends_training_after_that_step(tmp_path: Path) -> None:
    run = trainer(tmp_path, max_steps=6, callbacks_=[StopAt(3)])
    output = run.train()
    assert output.global_step == 3 and (tmp_path / "run" / "final" / "model.safetensors").exists()


def test_should_log_evaluate_and_save_are_honoured(tmp_path: Path) -> None:
    callbacks = [AskFor("should_log", 1), AskFor("should_evaluate", 2), AskFor("should_save", 1)]
    run = with_eval_set(tmp_path, max_steps=3, logging_steps=10, save_steps=100, callbacks=callbacks)
    run.train()
    train_logs = [row["step"] for row in run.state.log_history if "reward" in row]
    assert train_logs == [1.0, 3.0]  # step 1 asked for; step 3 is the last
    assert [row["step"] for row in run.state.log_history if "eval_reward" in row] == [2.0]
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-1"]


class Plain:
    def __init__(self) -> None:
        self.events: list[str] = []

    def on_step_end(self, trainer: Any) -> None:
        self.events.append(f"step{trainer.state.global_step}")

    def on_save(self, trainer: Any, path: Path) -> None:
        self.events.append(f"save:{path.name}")


def test_plain_callbacks_and_add_pop_remove(tmp_path: Path) -> None:
    plain, recorder = Plain(), Recorder()
    run = trainer(tmp_path, max_steps=2, save_steps=2, callbacks_=[plain, Recorder])  # a class is instantiated
    assert [type(c).__name__ for c in run.callback_handler.callbacks] == ["Plain", "Recorder"]
    popped = run.pop_callback(Recorder)
    assert isinstance(popped, Recorder)
    run.add_callback(recorder)
    run.remove_callback(recorder)
    assert run.callback_handler.callbacks == [plain]
    run.train()
    assert plain.events == ["step1", "step2", "save:checkpoint-2"]


def test_the_state_a_callback_sees_mirrors_the_run(tmp_path: Path) -> None:
    run = trainer(tmp_path, max_steps=1)
    run.train()
    handler: Callbacks = run.callback_handler
    state = handler.hf_state()
    assert state.global_step == 1 and state.max_steps == 1 and state.is_world_process_zero
    assert state.log_history is run.state.log_history and state.logging_steps == run.args.logging_steps
