"""How ``benchmarks/gpu_vs_trl.py`` runs each implementation: one generation batch after another, every phase told to
a :class:`gpu_phases.Recorder`.

- **rloo**: its own phase timer (``rloo/training/timing.py``, the ``timing/<phase>`` phases: rollout, logprobs,
  advantages, update, log) is wrapped, and so is the sampler's entry point (``rloo.pipeline.sample_batch``:
  sampling); a generation batch is one ``_train_on_next_batch``.
- **TRL**: its methods are wrapped as ``run_trl.py`` does (``_generate_single_turn``: sampling,
  ``_calculate_rewards``: score, the no-grad ``_get_per_token_logps_and_entropies``: log-probs, inside
  ``_generate_and_score_completions``) and each optimizer step is an ``update`` phase from ``on_step_begin`` to
  ``on_step_end``; its first step of a batch holds the generation, whose time the report takes out of it.

Both stop right after their last measured batch (:class:`Finished`): the final save and report are not measured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import tempfile
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from gpu_phases import Recorder

TRAINING = {
    "num_generations": 8,
    "per_device_train_batch_size": 16,
    "steps_per_generation": 4,
    "beta": 0.04,
    "learning_rate": 1e-6,
    "seed": 0,
    "bf16": True,
    "gradient_checkpointing": False,
    "temperature": 1.0,
}
PROMPTS = 8  # per generation batch: per_device_train_batch_size * steps_per_generation / num_generations


class Finished(Exception):
    """Raised after the last measured batch: the run's end (final save, report) is not measured."""


@dataclasses.dataclass
class Spec:
    """One run: ``impl`` (rloo, trl) on ``case`` (fixed, varied) with ``variant``, setup's folder and sizes; the
    number of generation batches, whether the last is profiled, where the decode trace goes (None: none)."""

    impl: str
    case: str
    variant: str
    model_dir: Path
    sizes: dict[str, Any]
    batches: int
    profile: bool
    trace: Path | None

    @property
    def device(self) -> torch.device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def rows(self) -> list[dict[str, str]]:
        """The batch's 8 prompts (every batch draws all of them): one length, or spread over the varied range."""
        from memory_measure import prompt_rows

        low, high = self.sizes["varied_prompts"]
        rows = prompt_rows(PROMPTS, self.sizes["prompt"] if self.case == "fixed" else high)
        if self.case == "varied":
            rows = [{"prompt": r["prompt"][: low + i * (high - low) // (PROMPTS - 1)]} for i, r in enumerate(rows)]
        return rows

    def tokenizer(self) -> Any:
        from rloo.tiny import build_char_tokenizer

        return build_char_tokenizer(vocab_size=self.sizes["vocab"])

    def model(self) -> Any:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.model_dir / self.case, dtype=torch.float32).to(self.device)

    def profiled(self, index: int) -> bool:
        return self.profile and index == self.batches - 1


@contextlib.contextmanager
def patched(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    """``owner.name`` replaced by ``make(original)`` inside."""
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def lengths_note(rec: Recorder, prompts: list[int], completions: list[int]) -> None:
    rec.note(
        prompt_lengths=prompts,
        completion_lengths=completions,
        decode_steps=max(completions, default=0),
        mean_completion_length=sum(completions) / max(len(completions), 1),
    )


def timed_sampling(rec: Recorder, read: Callable[[Any, tuple[Any, ...]], tuple[list[int], list[int]]]) -> Any:
    """A wrapper maker: the call is the ``sampling`` phase, then ``read(result, args)`` gives the lengths."""

    def make(original: Any) -> Any:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with rec.phase("sampling"):
                out = original(*args, **kwargs)
            with rec.quiet():
                lengths_note(rec, *read(out, args))
            rec.finish_trace()
            return out

        return wrapper

    return make


def run_rloo(spec: Spec, rec: Recorder, started: Callable[[Any], None], done: Callable[[dict[str, Any]], None]) -> None:
    """rloo's trainer with its phase timer (``timing/<phase>``) and its sampler's entry point timed by ``rec``."""
    from memory_measure import constant_reward

    import rloo.pipeline as pipeline
    from rloo import RLOOConfig, RLOOTrainer
    from rloo.training.timing import PhaseTimer

    per_generation = TRAINING["steps_per_generation"]
    # graphs-fused: the captured decode step and the fused LM head, both opt-in until a GPU has run them;
    # cb: transformers' continuous batching behind rloo's engine seam (rloo/generation/continuous_batching.py)
    extra: dict[str, Any] = {"sampler_cuda_graphs": True} if spec.variant == "graphs-fused" else {}
    if spec.variant == "cb":
        extra = {"use_transformers_continuous_batching": True}
    args = RLOOConfig(
        output_dir=tempfile.mkdtemp(),
        max_steps=spec.batches * per_generation,
        max_completion_length=spec.sizes["completion"],
        max_prompt_length=None,
        logging_steps=1,
        save_steps=10**6,
        report_to=[],
        **TRAINING,
        **extra,
    )
    trainer = RLOOTrainer(
        model=spec.model(),
        reward_funcs=constant_reward,
        args=args,
        train_dataset=spec.rows(),
        processing_class=spec.tokenizer(),
    )
    trainer.console.quiet = True
    started(trainer.unwrapped_model)
    rec.watch(trainer.unwrapped_model)
    rec.watch(trainer.ref_model)

    def timer(original: Any) -> Any:
        @contextlib.contextmanager
        def phase(self: Any, name: str) -> Iterator[None]:
            with rec.phase(name), original(self, name):
                yield

        return phase

    def read(out: Any, args: tuple[Any, ...]) -> tuple[list[int], list[int]]:
        rollout = out.rollout
        return [int(x) for x in rollout.prompt_mask.sum(1).tolist()], [
            int(x) for x in rollout.completion_mask.sum(1).tolist()
        ]

    one_batch = trainer._train_on_next_batch

    def batch() -> None:
        rec.begin_batch(spec.profiled(len(rec.batches)))
        one_batch()
        done(rec.end_batch())
        if len(rec.batches) == spec.batches:
            raise Finished

    trainer._train_on_next_batch = batch
    with (
        patched(PhaseTimer, "__call__", timer),
        patched(pipeline, "sample_batch", timed_sampling(rec, read)),
        contextlib.suppress(Finished),
    ):
        trainer.train()


def continuous_batching_unsupported(impl: str) -> str | None:
    """Why ``use_transformers_continuous_batching`` cannot run here for ``impl`` (rloo, trl), or None when it can."""
    from transformers import GenerationMixin

    if not hasattr(GenerationMixin, "generate_batch"):
        return f"transformers {metadata.version('transformers')} has no generate_batch"
    if impl == "rloo":
        return None
    from trl import RLOOConfig

    if "use_transformers_continuous_batching" not in {f.name for f in dataclasses.fields(RLOOConfig)}:
        return f"TRL {metadata.version('trl')} has no use_transformers_continuous_batching"
    return None


def run_trl(spec: Spec, rec: Recorder, started: Callable[[Any], None], done: Callable[[dict[str, Any]], None]) -> None:
    """TRL's RLOOTrainer, its methods timed by ``rec`` (as ``run_trl.py`` does), its optimizer steps by a callback."""
    from datasets import Dataset
    from memory_measure import constant_reward
    from transformers import TrainerCallback
    from trl import RLOOConfig, RLOOTrainer

    per_generation = TRAINING["steps_per_generation"]
    extra = {"use_transformers_continuous_batching": True} if spec.variant == "cb" else {}
    args = RLOOConfig(
        output_dir=tempfile.mkdtemp(),
        max_steps=spec.batches * per_generation,
        max_completion_length=spec.sizes["completion"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_vllm=False,
        use_cpu=spec.device.type == "cpu",
        **TRAINING,
        **extra,
    )

    class Steps(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step % per_generation == 0:
                rec.begin_batch(spec.profiled(len(rec.batches)))
            rec.push("update")

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rec.pop("update")
            if state.global_step % per_generation == 0:
                done(rec.end_batch())
                if len(rec.batches) == spec.batches:
                    raise Finished

    trainer = RLOOTrainer(
        model=spec.model(),
        reward_funcs=constant_reward,
        args=args,
        train_dataset=Dataset.from_list(spec.rows()),
        processing_class=spec.tokenizer(),
        callbacks=[Steps()],
    )
    policy = trainer.accelerator.unwrap_model(trainer.model)
    started(policy)
    rec.watch(policy)
    rec.watch(trainer.ref_model)

    def phase(name: str, no_grad_only: bool = False) -> Any:
        def make(original: Any) -> Any:
            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if no_grad_only and torch.is_grad_enabled():
                    return original(*args, **kwargs)
                with rec.phase(name):
                    return original(*args, **kwargs)

            return wrapper

        return make

    def read(out: Any, args: tuple[Any, ...]) -> tuple[list[int], list[int]]:
        return [len(ids) for ids in args[1]], [len(ids) for ids in out]  # (self, prompt_ids, ...) -> completion ids

    with (
        patched(RLOOTrainer, "_generate_and_score_completions", phase("generation")),
        patched(RLOOTrainer, "_generate_single_turn", timed_sampling(rec, read)),
        patched(RLOOTrainer, "_calculate_rewards", phase("score")),
        patched(RLOOTrainer, "_get_per_token_logps_and_entropies", phase("logprobs", no_grad_only=True)),
        contextlib.suppress(Finished),
    ):
        trainer.train()
