"""``RLOOConfig``: every setting of a run, validated once when constructed.

Names and default semantics follow TRL 1.13's ``RLOOConfig`` where a field means the same.
Departures, on purpose:

- ``bf16=None`` (the default) picks bf16 on GPUs that support it and fp32 elsewhere, so
  the default config runs on a CPU machine (TRL's ``bf16=True`` default errors there).
- ``gradient_checkpointing`` defaults to False (TRL: True): it trades speed for memory,
  a choice the user makes.
- ``max_prompt_length`` exists (TRL has none): longer prompts are truncated from the left.
- The algorithm knobs (advantage estimator, KL estimator and placement, ratio level, loss
  aggregation, clipping) default to ``None`` = "from the preset"; the default preset
  ``trl`` is TRL's math.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from typing import Any

from rloo.algo.advantages import ADVANTAGE_ESTIMATORS
from rloo.algo.kl import KL_ESTIMATORS, KL_PLACEMENTS
from rloo.algo.losses import AGGREGATION_MODES, POLICY_LOSSES
from rloo.config.presets import PRESET_KEYS, PRESETS, AlgorithmSpec, describe_algorithm

LR_SCHEDULERS: tuple[str, ...] = ("linear", "cosine", "constant", "constant_with_warmup")
REPORT_SINKS: tuple[str, ...] = ("none", "tensorboard", "wandb")


def _fail(name: str, value: Any, fix: str) -> ValueError:
    return ValueError(f"RLOOConfig.{name}={value!r} is invalid: {fix}")


@dataclass
class RLOOConfig:
    """Configuration of an RLOO run. Invalid values raise ``ValueError`` naming the field."""

    # --- run ---
    output_dir: str = "runs/rloo"
    seed: int = 42
    preset: str = "trl"
    # --- data and generation ---
    num_generations: int = 2
    max_prompt_length: int | None = 512
    max_completion_length: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    generation_batch_size: int | None = None
    steps_per_generation: int | None = None
    shuffle_dataset: bool = True
    # --- algorithm (None = from the preset) ---
    beta: float | None = None
    num_iterations: int = 1
    epsilon: float | None = None
    epsilon_high: float | None = None
    clip_ratio: bool | None = None
    advantage_estimator: str | None = None
    normalize_advantages: bool | None = None
    kl_estimator: str | None = None
    kl_placement: str | None = None
    ratio_level: str | None = None
    loss_aggregation: str | None = None
    mask_truncated_completions: bool | None = None
    reward_weights: list[float] | None = None
    reward_clip_range: tuple[float, float] | None = None
    entropy_coef: float = 0.0
    # --- optimization ---
    learning_rate: float = 1e-6
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_steps: int = -1
    num_train_epochs: float = 1.0
    warmup_ratio: float = 0.0
    warmup_steps: int = 0
    lr_scheduler_type: str = "linear"
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    bf16: bool | None = None
    gradient_checkpointing: bool = False
    disable_dropout: bool = True
    # speed and memory: exact, they change no gradient
    skip_zero_advantage: bool = True
    max_logits_memory_mb: float = 256.0
    model_init_kwargs: dict[str, Any] | None = None
    # --- logging and checkpoints ---
    logging_steps: int = 10
    save_steps: int = 500
    save_total_limit: int | None = None
    eval_steps: int | None = None
    report_to: list[str] = field(default_factory=lambda: ["none"])
    log_completions: bool = False
    num_completions_to_print: int = 0

    # resolved in __post_init__, not constructor arguments
    algorithm: AlgorithmSpec = field(init=False, repr=False)
    preset_overrides: dict[str, tuple[Any, Any]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to]
        if self.reward_clip_range is not None:
            self.reward_clip_range = tuple(self.reward_clip_range)  # type: ignore[assignment]
        self._resolve_preset()
        self._validate_generation()
        self._validate_algorithm()
        self._validate_optimization()
        self._validate_batches()
        self._validate_logging()

    # ----- preset resolution -----
    def _resolve_preset(self) -> None:
        if self.preset not in PRESETS:
            raise _fail("preset", self.preset, f"choose one of {sorted(PRESETS)}")
        values = PRESETS[self.preset]
        overrides: dict[str, tuple[Any, Any]] = {}
        for key in PRESET_KEYS:
            explicit, default = getattr(self, key), values[key]
            # an explicit epsilon without epsilon_high means a symmetric clip, as in TRL
            if key == "epsilon_high" and "epsilon" in overrides:
                default = self.epsilon
            if explicit is None:
                setattr(self, key, default)
            elif explicit != default:
                overrides[key] = (explicit, default)
        self.preset_overrides = overrides
        self.algorithm = AlgorithmSpec(**{key: getattr(self, key) for key in PRESET_KEYS})

    def describe_algorithm(self) -> str:
        """The resolved formula, printed by the trainer at start-up."""
        return describe_algorithm(self.preset, self.algorithm, self.preset_overrides)

    # ----- validation -----
    def _validate_generation(self) -> None:
        if self.num_generations < 2:
            raise _fail(
                "num_generations",
                self.num_generations,
                "the leave-one-out baseline needs at least 2 completions per prompt; use 2 or more (4-8 is typical)",
            )
        if self.max_completion_length < 1:
            raise _fail("max_completion_length", self.max_completion_length, "must be >= 1")
        if self.max_prompt_length is not None and self.max_prompt_length < 1:
            raise _fail("max_prompt_length", self.max_prompt_length, "must be >= 1, or None for no truncation")
        if not self.temperature > 0:
            raise _fail("temperature", self.temperature, "must be > 0 (use a small value like 0.01 for near-greedy)")
        if not 0 < self.top_p <= 1:
            raise _fail("top_p", self.top_p, "must be in (0, 1]; 1.0 disables it")
        if self.top_k < 0:
            raise _fail("top_k", self.top_k, "must be >= 0; 0 disables it")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            raise _fail("min_p", self.min_p, "must be in [0, 1], or None to disable it")
        if not self.repetition_penalty > 0:
            raise _fail("repetition_penalty", self.repetition_penalty, "must be > 0; 1.0 disables it")

    def _validate_algorithm(self) -> None:
        spec = self.algorithm
        choices: list[tuple[str, str, tuple[str, ...]]] = [
            ("advantage_estimator", spec.advantage_estimator, tuple(sorted(ADVANTAGE_ESTIMATORS))),
            ("kl_estimator", spec.kl_estimator, tuple(sorted(KL_ESTIMATORS))),
            ("kl_placement", spec.kl_placement, KL_PLACEMENTS),
            ("ratio_level", spec.ratio_level, tuple(sorted(POLICY_LOSSES))),
            ("loss_aggregation", spec.loss_aggregation, AGGREGATION_MODES),
        ]
        for name, value, valid in choices:
            if value not in valid:
                raise _fail(name, value, f"choose one of {list(valid)}")
        if spec.beta < 0 or not math.isfinite(spec.beta):
            raise _fail("beta", spec.beta, "the KL coefficient must be a finite number >= 0 (0 disables the KL)")
        if not spec.epsilon > 0:
            raise _fail("epsilon", spec.epsilon, "the clip range must be > 0 (0.2 is typical)")
        if not spec.epsilon_high > 0:
            raise _fail("epsilon_high", spec.epsilon_high, "must be > 0 (DAPO uses 0.28), or unset to equal epsilon")
        if spec.epsilon >= 1:
            raise _fail("epsilon", spec.epsilon, "must be < 1 so that 1 - epsilon stays positive")
        if self.num_iterations < 1:
            raise _fail("num_iterations", self.num_iterations, "must be >= 1 (1 = each batch used once)")
        if not self.max_logits_memory_mb > 0:
            raise _fail("max_logits_memory_mb", self.max_logits_memory_mb, "must be > 0 (MiB of logits per pass)")
        if not self.entropy_coef >= 0:
            raise _fail("entropy_coef", self.entropy_coef, "must be >= 0 (0 disables the entropy bonus)")
        clip = self.reward_clip_range
        if clip is not None and (len(clip) != 2 or clip[0] > clip[1]):
            raise _fail("reward_clip_range", self.reward_clip_range, "give (min, max) with min <= max")
        if self.reward_weights is not None and len(self.reward_weights) == 0:
            raise _fail("reward_weights", self.reward_weights, "give one weight per reward function, or None")

    def _validate_optimization(self) -> None:
        if not self.learning_rate > 0:
            raise _fail("learning_rate", self.learning_rate, "must be > 0 (1e-6 is typical for RL on LLMs)")
        if self.lr_scheduler_type not in LR_SCHEDULERS:
            raise _fail("lr_scheduler_type", self.lr_scheduler_type, f"choose one of {list(LR_SCHEDULERS)}")
        if not 0 <= self.warmup_ratio < 1:
            raise _fail("warmup_ratio", self.warmup_ratio, "must be in [0, 1)")
        if self.warmup_steps < 0:
            raise _fail("warmup_steps", self.warmup_steps, "must be >= 0")
        if not self.max_grad_norm >= 0:
            raise _fail("max_grad_norm", self.max_grad_norm, "must be >= 0 (0 disables gradient clipping)")
        if not self.weight_decay >= 0:
            raise _fail("weight_decay", self.weight_decay, "must be >= 0")
        if self.max_steps == 0 or self.max_steps < -1:
            raise _fail("max_steps", self.max_steps, "must be >= 1, or -1 to train for num_train_epochs")
        if self.max_steps == -1 and not self.num_train_epochs > 0:
            raise _fail("num_train_epochs", self.num_train_epochs, "must be > 0 when max_steps is -1")

    def _validate_batches(self) -> None:
        if self.per_device_train_batch_size < 1:
            raise _fail("per_device_train_batch_size", self.per_device_train_batch_size, "must be >= 1")
        if self.gradient_accumulation_steps < 1:
            raise _fail("gradient_accumulation_steps", self.gradient_accumulation_steps, "must be >= 1")
        if self.generation_batch_size is not None and self.steps_per_generation is not None:
            raise _fail(
                "generation_batch_size",
                self.generation_batch_size,
                "set either generation_batch_size or steps_per_generation, not both",
            )
        if self.generation_batch_size is not None and self.generation_batch_size % self.per_device_train_batch_size:
            raise _fail(
                "generation_batch_size",
                self.generation_batch_size,
                f"must be a multiple of per_device_train_batch_size ({self.per_device_train_batch_size})",
            )
        if self.steps_per_generation is not None and self.steps_per_generation < 1:
            raise _fail("steps_per_generation", self.steps_per_generation, "must be >= 1")
        # name the field the user set: generation_batch_size, else steps_per_generation
        batch_field = "generation_batch_size" if self.generation_batch_size is not None else "steps_per_generation"
        if self.micro_batches_per_generation % self.gradient_accumulation_steps:
            value = self.generation_batch_size or self.micro_batches_per_generation
            raise _fail(
                batch_field,
                value,
                f"micro-batches per generation ({self.micro_batches_per_generation}) must be a multiple of "
                f"gradient_accumulation_steps ({self.gradient_accumulation_steps}) so no optimizer step straddles "
                "two generation batches",
            )
        if self.completions_per_generation % self.num_generations:
            raise _fail("generation_batch_size", self.completions_per_generation, self._divisibility_fix())

    def _divisibility_fix(self) -> str:
        """Why the completions of a generation batch must split into groups, and a value that works."""
        n, k = self.completions_per_generation, self.num_generations
        why = f"must be divisible by num_generations ({k}) so every prompt's {k} completions are scored together; "
        if self.generation_batch_size is not None:
            step = math.lcm(self.per_device_train_batch_size, k) * self.gradient_accumulation_steps
            return (
                f"the generation batch ({n} completions) {why}e.g. generation_batch_size={math.ceil(n / step) * step}"
            )
        return (
            f"the completions per generation batch (per_device_train_batch_size x steps_per_generation = {n}) "
            f"{why}e.g. per_device_train_batch_size={k * max(1, self.per_device_train_batch_size // k)}"
        )

    def _validate_logging(self) -> None:
        for name in ("logging_steps", "save_steps"):
            if getattr(self, name) < 1:
                raise _fail(name, getattr(self, name), "must be >= 1")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise _fail("save_total_limit", self.save_total_limit, "must be >= 1, or None to keep every checkpoint")
        if self.eval_steps is not None and self.eval_steps < 1:
            raise _fail("eval_steps", self.eval_steps, "must be >= 1, or None to skip evaluation")
        for sink in self.report_to:
            if sink not in REPORT_SINKS:
                raise _fail("report_to", self.report_to, f"each entry must be one of {list(REPORT_SINKS)}")
        if self.num_completions_to_print < 0:
            raise _fail("num_completions_to_print", self.num_completions_to_print, "must be >= 0")

    # ----- derived values -----
    @property
    def micro_batches_per_generation(self) -> int:
        """Micro-batches of ``per_device_train_batch_size`` in one generation batch (one process)."""
        if self.steps_per_generation is not None:
            return self.steps_per_generation
        if self.generation_batch_size is not None:
            return self.generation_batch_size // self.per_device_train_batch_size
        return self.gradient_accumulation_steps

    @property
    def completions_per_generation(self) -> int:
        """Completions sampled per generation batch on one process."""
        return self.per_device_train_batch_size * self.micro_batches_per_generation

    @property
    def prompts_per_generation(self) -> int:
        return self.completions_per_generation // self.num_generations

    @property
    def optimizer_steps_per_generation(self) -> int:
        """Optimizer steps taken on one generation batch, over all its iterations."""
        return self.micro_batches_per_generation * self.num_iterations // self.gradient_accumulation_steps

    def to_dict(self) -> dict[str, Any]:
        """The constructor arguments with their resolved values (YAML-serializable)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        if out["reward_clip_range"] is not None:
            out["reward_clip_range"] = list(out["reward_clip_range"])
        return out

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RLOOConfig:
        """Build from a mapping; an unknown key is rejected with the closest valid name."""
        names = cls.field_names()
        for key in values:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f"; did you mean `{close[0]}`?" if close else ""
                raise ValueError(f"unknown RLOOConfig field `{key}`{hint}")
        return cls(**values)
