"""Measured peak memory of one rloo training step, phase by phase (the memory plan's ground truth).

On a CUDA device: ``torch.cuda.max_memory_allocated``, reset at each phase's start. On the CPU, which
keeps no allocator statistics: the bytes of live tensor storages, counted by
(a dispatch mode of ours: torch's ``MemTracker`` refuses a module called more than once per
step, as the sampler's decode loop calls it); the same quantity,
tensors allocated, without the caching allocator's reserve. Used by ``benchmarks/memory_plan.py``.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

PHASES = {"rollout": "sampling", "logprobs": "log-probs", "update": "training"}


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of the tensor storages alive on the CPU: every storage an op returns is counted until
    it is freed (a weak reference's callback); ``peak`` is the most alive at once since :meth:`reset`."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = self.peak = 0
        for tensor in tensors:
            self._track(tensor)

    def _track(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != "cpu" or (isinstance(tensor, torch.nn.Parameter) and tensor.is_meta):
            return
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.live:
            return
        self.live[key] = storage.nbytes()
        self.current += self.live[key]
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def reset(self) -> None:
        self.peak = self.current

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._track(tensor)
        return out


class PeakMeter:
    """Peak bytes of tensors allocated on ``device`` since the last :meth:`reset`."""

    def __init__(self, device: torch.device, modules: list[Any], optimizer: Any) -> None:
        self.device = device
        self.tracker: LiveTensorBytes | None = None
        if device.type == "cpu":
            tensors = [t for m in modules for t in [*m.parameters(), *m.buffers()]]
            self.tracker = LiveTensorBytes(tensors)

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        with self.tracker if self.tracker is not None else contextlib.nullcontext():
            yield

    def reset(self) -> None:
        if self.tracker is None:
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.tracker.reset()

    def peak(self) -> int:
        if self.tracker is None:
            return torch.cuda.max_memory_allocated(self.device)
        return self.tracker.peak


@dataclass
class Measured:
    phases: dict[str, int] = field(default_factory=dict)  # phase -> peak bytes
    completion_tokens: float = 0.0
    step_seconds: list[float] = field(default_factory=list)  # each generation batch's, in order
    log_history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def peak(self) -> int:
        return max(self.phases.values())


def prompt_rows(count: int, length: int) -> list[dict[str, str]]:
    """``count`` prompts of exactly ``length`` characters (one token each), all different."""
    digits = "0123456789"
    return [{"prompt": "".join(digits[(i * 7 + j * (i + 3)) % 10] for j in range(length))} for i in range(count)]


def constant_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return [float(len(c) % 3) for c in completions]


def measure_step(
    model_config: Any,
    config: dict[str, Any],
    prompt_length: int,
    peft_config: Any = None,
    device: str = "cpu",
    steps: int = 2,
    instrument: Callable[[Any], None] | None = None,
) -> Measured:
    """One training step of a random-init model of ``model_config`` (a transformers config) with
    RLOOConfig ``config``, prompts of ``prompt_length`` tokens; the peak of each phase over ``steps``
    steps (the second and later: with the optimizer's state), each step's seconds. ``instrument(trainer)``
    runs before training (to wrap what a check reads)."""

    from transformers import AutoModelForCausalLM

    from rloo import RLOOConfig, RLOOTrainer  # here: importing this module for prompt_rows stays light
    from rloo.tiny import build_char_tokenizer

    config = dict(config)
    tokenizer = build_char_tokenizer(vocab_size=model_config.vocab_size)
    model_config.pad_token_id = tokenizer.pad_token_id
    model_config.eos_token_id = tokenizer.eos_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config, dtype=config.pop("_weights_dtype", torch.float32))
    if device != "cpu":
        model = model.to(device)
    rows = config["per_device_train_batch_size"] * config.get("steps_per_generation", 1) // config["num_generations"]
    per_generation = config.get("steps_per_generation", 1) // config.get("gradient_accumulation_steps", 1)
    with tempfile.TemporaryDirectory() as out:
        args = RLOOConfig(
            output_dir=out,
            # ``steps`` generation batches: from the second on, the optimizer's state exists
            max_steps=steps * per_generation,
            logging_steps=1,
            save_steps=1000,
            report_to=[],
            max_prompt_length=None,
            seed=0,
            **config,
        )
        trainer = RLOOTrainer(
            model=model,
            reward_funcs=constant_reward,
            args=args,
            train_dataset=prompt_rows(max(rows, 1) * 2, prompt_length),
            processing_class=tokenizer,
            peft_config=peft_config,
        )
        modules = [trainer.unwrapped_model] + ([trainer.ref_model] if trainer.ref_model is not None else [])
        meter = PeakMeter(torch.device(device if device == "cpu" else "cuda:0"), modules, trainer.optimizer)
        measured = Measured()
        timer = trainer.timer
        original = type(timer).__call__

        @contextlib.contextmanager
        def phase(self: Any, name: str) -> Iterator[None]:
            if name in PHASES:
                meter.reset()
            with original(self, name):
                yield
            if name in PHASES:
                measured.phases[PHASES[name]] = max(measured.phases.get(PHASES[name], 0), meter.peak())

        type(timer).__call__ = phase  # type: ignore[method-assign]
        one_batch = trainer._train_on_next_batch

        def timed_batch() -> None:
            if meter.device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            one_batch()
            if meter.device.type == "cuda":
                torch.cuda.synchronize()
            measured.step_seconds.append(time.perf_counter() - start)

        trainer._train_on_next_batch = timed_batch  # type: ignore[method-assign]
        if instrument is not None:
            instrument(trainer)
        try:
            with meter.tracking():
                trainer.train()
        finally:
            type(timer).__call__ = original  # type: ignore[method-assign]
        lengths = [e["completions/mean_length"] for e in trainer.state.log_history if "completions/mean_length" in e]
        measured.completion_tokens = float(lengths[-1]) if lengths else 0.0
        measured.log_history = list(trainer.state.log_history)
    return measured
