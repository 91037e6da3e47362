"""Callbacks: transformers' ``TrainerCallback`` as in TRL, and rloo's plain callbacks.

A ``transformers.TrainerCallback`` is called as transformers' Trainer calls it:
``(args, state, control, model=..., processing_class=..., optimizer=..., lr_scheduler=...,
**event_kwargs)`` at ``on_init_end``, ``on_train_begin``, ``on_step_begin``, ``on_step_end``,
``on_log`` (``logs=``), ``on_evaluate`` (``metrics=``), ``on_save`` and ``on_train_end``; ``state``
is a ``transformers.TrainerState`` mirroring the run's (global step, epoch, ``log_history``, ...),
and the ``control`` flags it sets are honoured: ``should_training_stop`` ends training after the
step, ``should_log`` / ``should_evaluate`` / ``should_save`` log, evaluate or checkpoint then
(a checkpoint at the end of the generation batch, where it resumes exactly).

We reuse transformers' ``CallbackHandler`` (``add_callback`` / ``pop_callback`` /
``remove_callback`` by class or instance, the event dispatch); its ``DefaultFlowCallback`` is
not added: rloo's loop decides when to log, evaluate and save from its own config, and the
flags only add to that.

A plain callback (any object that is not a ``TrainerCallback``) keeps rloo's earlier form:
``on_train_begin(trainer)``, ``on_step_end(trainer)``, ``on_log(trainer, logs)``,
``on_save(trainer, path)``, ``on_train_end(trainer)``, each optional.
"""

from __future__ import annotations

import os
from typing import Any

from transformers.trainer_callback import CallbackHandler, TrainerCallback, TrainerControl, TrainerState

# the flags transformers' CallbackHandler clears before calling each event
_CLEARS = {
    "on_train_begin": ("should_training_stop",),
    "on_step_begin": ("should_log", "should_evaluate", "should_save"),
    "on_log": ("should_log",),
    "on_evaluate": ("should_evaluate",),
    "on_save": ("should_save",),
}
# each plain-callback event and the keyword its extra argument comes from
_PLAIN_EVENTS = {"on_train_begin": None, "on_step_end": None, "on_log": "logs", "on_save": "path", "on_train_end": None}


class Callbacks(CallbackHandler):
    """The trainer's callbacks: dispatches each event to TrainerCallbacks and plain ones alike."""

    def __init__(self, callbacks: list[Any], trainer: Any) -> None:
        self.callbacks: list[Any] = []
        for callback in callbacks:
            self.add_callback(callback)  # type: ignore[no-untyped-call]
        self.trainer = trainer
        self.control = TrainerControl()
        self.train_dataloader = self.eval_dataloader = None

    # the objects transformers passes to every callback, read from the trainer at call time
    @property
    def model(self) -> Any:
        return self.trainer.unwrapped_model

    @property
    def processing_class(self) -> Any:
        return self.trainer.processing_class

    @property
    def optimizer(self) -> Any:
        return self.trainer.optimizer

    @property
    def lr_scheduler(self) -> Any:
        return self.trainer.scheduler

    def fire(self, event: str, **kwargs: Any) -> TrainerControl:
        """Call ``event`` on every callback; returns the control with the flags they set."""
        for flag in _CLEARS.get(event, ()):
            setattr(self.control, flag, False)
        self.control = self.call_event(event, self.trainer.args, self.hf_state(), self.control, **kwargs)
        return self.control

    def call_event(self, event: str, args: Any, state: Any, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        for callback in self.callbacks:
            if isinstance(callback, TrainerCallback):
                result = getattr(callback, event)(
                    args,
                    state,
                    control,
                    model=self.model,
                    processing_class=self.processing_class,
                    optimizer=self.optimizer,
                    lr_scheduler=self.lr_scheduler,
                    train_dataloader=None,
                    eval_dataloader=None,
                    **kwargs,
                )
                control = result if result is not None else control
            elif event in _PLAIN_EVENTS and (method := getattr(callback, event, None)) is not None:
                extra = _PLAIN_EVENTS[event]
                method(self.trainer, *([kwargs[extra]] if extra else []))
        return control

    def hf_state(self) -> TrainerState:
        """transformers' view of the run's state (``log_history`` is the run's own list)."""
        trainer, args = self.trainer, self.trainer.args
        state = trainer.state
        return TrainerState(
            epoch=state.epoch,
            global_step=state.global_step,
            max_steps=state.max_steps,
            logging_steps=args.steps("logging_steps", state.max_steps),
            eval_steps=args.steps("eval_steps", state.max_steps),
            save_steps=args.steps("save_steps", state.max_steps),
            train_batch_size=args.per_device_train_batch_size,
            num_train_epochs=int(args.num_train_epochs),
            num_input_tokens_seen=state.num_input_tokens_seen,
            log_history=state.log_history,
            is_local_process_zero=int(os.environ.get("LOCAL_RANK", "0")) == 0,
            is_world_process_zero=trainer.ranks.is_main,
            best_metric=state.best_metric,
            best_global_step=state.best_global_step,
            best_model_checkpoint=state.best_model_checkpoint,
        )

    def requested(self, flag: str) -> bool:
        """Whether a callback on any process set ``control.<flag>`` (so every process acts alike);
        the flag is consumed."""
        wanted: bool = self.trainer.ranks.any(bool(getattr(self.control, flag)))
        setattr(self.control, flag, False)
        return wanted


class CallbackMethods:
    """transformers' ``Trainer`` callback methods, over the trainer's ``callback_handler``."""

    callback_handler: Any  # Callbacks (transformers' CallbackHandler methods are untyped)

    def add_callback(self, callback: Any) -> None:
        """A ``TrainerCallback`` (class or instance) or a plain callback, as transformers' Trainer takes it."""
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: Any) -> Any:
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: Any) -> None:
        self.callback_handler.remove_callback(callback)
