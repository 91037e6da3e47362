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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rloo.config.presets import PRESET_KEYS, PRESETS, AlgorithmSpec, describe_algorithm
from rloo.config.validation import fail, validate
from rloo.suggest import unknown_name_error


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
    reward_weights: Sequence[float] | None = None
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
    model_init_kwargs: Mapping[str, Any] | None = None
    # --- logging and checkpoints ---
    logging_steps: int = 10
    save_steps: int = 500
    save_total_limit: int | None = None
    eval_steps: int | None = None
    report_to: Sequence[str] = ("none",)
    log_completions: bool = False
    num_completions_to_print: int = 0

    # resolved in __post_init__, not constructor arguments
    algorithm: AlgorithmSpec = field(init=False, repr=False)
    preset_overrides: dict[str, tuple[Any, Any]] = field(init=False, repr=False)
    _given: dict[str, Any] = field(init=False, repr=False, compare=False)
    _frozen: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        if isinstance(self.report_to, str):
            self._set("report_to", [self.report_to])
        if self.reward_clip_range is not None:
            self._set("reward_clip_range", tuple(self.reward_clip_range))
        # the preset knobs as the user gave them (None = from the preset), for replace()
        self._set("_given", {key: getattr(self, key) for key in PRESET_KEYS})
        self._resolve_preset()
        validate(self)
        # containers become immutable too: a frozen config holds no list to append to
        for name in ("report_to", "reward_weights"):
            if getattr(self, name) is not None:
                self._set(name, tuple(getattr(self, name)))
        if self.model_init_kwargs is not None:
            self._set("model_init_kwargs", MappingProxyType(dict(self.model_init_kwargs)))
        self._set("_frozen", True)

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen", False):
            raise dataclasses.FrozenInstanceError(
                f"RLOOConfig is frozen once validated (the trainer and config.yaml must see the same values); "
                f"cannot set `{name}`. Build a changed copy with `args.replace({name}=...)`"
            )
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"RLOOConfig is frozen once validated; cannot delete `{name}`")

    def replace(self, **changes: Any) -> RLOOConfig:
        """A new, validated config with ``changes``; unset algorithm knobs follow its preset again.

        ``dataclasses.replace`` works too, but it passes every resolved knob as if set by hand,
        so a changed ``preset`` would not apply to them; this method does not.
        """
        given = {key: value for key, value in self._given.items() if key not in changes}
        return RLOOConfig(**{**self.to_dict(), **given, **changes})

    # ----- preset resolution -----
    def _resolve_preset(self) -> None:
        if self.preset not in PRESETS:
            raise fail("preset", self.preset, f"choose one of {sorted(PRESETS)}")
        values = PRESETS[self.preset]
        overrides: dict[str, tuple[Any, Any]] = {}
        for key in PRESET_KEYS:
            explicit, default = getattr(self, key), values[key]
            # an explicit epsilon without epsilon_high means a symmetric clip, as in TRL
            if key == "epsilon_high" and "epsilon" in overrides:
                default = self.epsilon
            if explicit is None:
                self._set(key, default)
            elif explicit != default:
                overrides[key] = (explicit, default)
        self._set("preset_overrides", overrides)
        self._set("algorithm", AlgorithmSpec(**{key: getattr(self, key) for key in PRESET_KEYS}))

    def describe_algorithm(self) -> str:
        """The resolved formula, printed by the trainer at start-up."""
        return describe_algorithm(self.preset, self.algorithm, self.preset_overrides)

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
        """The constructor arguments with their resolved values (YAML-serializable: plain lists and dicts)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        for name, value in out.items():
            if isinstance(value, tuple):
                out[name] = list(value)
            elif isinstance(value, Mapping):
                out[name] = dict(value)
        return out

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RLOOConfig:
        """Build from a mapping; an unknown key is rejected with the closest valid name."""
        names = cls.field_names()
        for key in values:
            if key not in names:
                raise unknown_name_error("RLOOConfig field", key, names)
        return cls(**values)
