"""``RLOOConfig``: every setting of a run, validated once when constructed.

Names and default semantics follow TRL 1.13's ``RLOOConfig`` where a field means the same (the defaults are
TRL 1.16's, but for the deliberate differences :mod:`rloo.config.trl.defaults` lists with their reasons).
Departures, on purpose:

- ``bf16=None`` (the default) picks bf16 on GPUs that support it and fp32 elsewhere, so
  the default config runs on a CPU machine (TRL's ``bf16=True`` default errors there).
- ``gradient_checkpointing`` defaults to False (TRL: True): it trades speed for memory,
  a choice the user makes.
- ``max_prompt_length`` exists (TRL has none): longer prompts are truncated from the left.
- ``fp16=True`` without a CUDA GPU trains in fp32 with a warning (TRL: an error). Older TRL names
  (``kl_coef``, ``rloo_k``, ...) are accepted with a warning: :mod:`rloo.config.trl.legacy`.
- The algorithm knobs (advantage estimator, KL estimator and placement, ratio level, loss
  aggregation, clipping) default to ``None`` = "from the preset"; the default preset
  ``trl`` is TRL's math.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rloo.config.errors import fail
from rloo.config.field_types import CONTAINER_KINDS, declared_annotation, parse_json_object
from rloo.config.fields import RLOOFields
from rloo.config.frozen import FrozenAfterInit
from rloo.config.health import resolve_health_thresholds
from rloo.config.presets import PRESET_KEYS, PRESETS, AlgorithmSpec, describe_algorithm, resolve_preset
from rloo.config.schedule import optimizer_steps, whole_if_integral
from rloo.config.trl.grpo_names import grpo_value
from rloo.config.trl.legacy import accept_older_names
from rloo.config.trl.passthrough import KwargsError, check_writable, normalize_generation_kwargs, normalize_init_kwargs
from rloo.config.validation import validate

# step counts that may be given as a fraction of the run (rloo.config.schedule)
STEP_FIELDS = ("warmup_steps", "logging_steps", "save_steps", "eval_steps")


@dataclass
class RLOOConfig(FrozenAfterInit, RLOOFields):
    """Configuration of an RLOO run. Invalid values raise ``ValueError`` naming the field.

    The fields and their documentation are in :mod:`rloo.config.fields`, one module per feature."""

    # resolved in __post_init__, not constructor arguments
    algorithm: AlgorithmSpec = field(init=False, repr=False)
    preset_overrides: dict[str, tuple[Any, Any]] = field(init=False, repr=False)
    _given: dict[str, Any] = field(init=False, repr=False, compare=False)
    _validated: bool = field(init=False, repr=False, compare=False, default=False)
    _frozen: bool = field(init=False, repr=False, compare=False, default=False)
    _translate_keywords = staticmethod(accept_older_names)  # kl_coef=... -> beta=..., before __init__

    @property
    def loss_type(self) -> str | None:
        """GRPO's name for the resolved ``loss_aggregation`` (``dapo``, ``grpo``, ``dr_grpo``), as TRL scripts
        read it back; None where GRPO has none."""
        return grpo_value("loss_type", self.algorithm.loss_aggregation)

    @property
    def scale_rewards(self) -> str | None:
        """GRPO's name for the resolved ``advantage_estimator`` (``group``, ``batch``, ``none``); None for
        rloo's own (``rloo``: the leave-one-out baseline has no GRPO equal)."""
        return grpo_value("scale_rewards", self.algorithm.advantage_estimator)

    @property
    def importance_sampling_level(self) -> str | None:
        """GRPO's name for the resolved ``ratio_level``: ``token``; None for rloo's sequence ratio (not GSPO's)."""
        return grpo_value("importance_sampling_level", self.algorithm.ratio_level)

    def __post_init__(self) -> None:
        for name in self.field_names():  # numpy scalars as plain numbers (config.yaml must hold them)
            value: Any = getattr(self, name)
            if type(value) not in (int, float, bool) and isinstance(value, numbers.Number) and hasattr(value, "item"):
                self._set(name, value.item())
        self._parse_flag_values()
        if self.reward_clip_range is not None:
            self._set("reward_clip_range", tuple(self.reward_clip_range))
        self._set("health_thresholds", MappingProxyType(resolve_health_thresholds(self.health_thresholds)))
        # the fields resolved here as the user gave them (None = from the preset, or from eval_steps), for replace()
        self._set("_given", {key: getattr(self, key) for key in (*PRESET_KEYS, "eval_strategy")})
        if self.eval_strategy is None:  # resolved, so that scripts reading it (TRL's: != "no") see TRL's values
            self._set("eval_strategy", "steps" if self.eval_steps is not None else "no")
        if self.preset not in PRESETS:
            raise fail("preset", self.preset, f"choose one of {sorted(PRESETS)}")
        resolved, overrides = resolve_preset(self.preset, {key: self._given[key] for key in PRESET_KEYS})
        for key, value in resolved.items():
            self._set(key, value)
        self._set("preset_overrides", overrides)
        self._set("algorithm", AlgorithmSpec(**resolved))
        if self.torch_compile_backend is not None or self.torch_compile_mode is not None:
            self._set("torch_compile", True)  # as transformers' TrainingArguments
        validate(self)
        self._freeze_containers()
        self._validated_now()

    def _assign(self, name: str, value: Any) -> None:
        """``args.name = value``: the config rebuilt with the change (validated; the algorithm knobs
        left unset follow the preset again) takes this object's place, field by field."""
        for key, changed in vars(self.replace(**{name: value})).items():
            self._set(key, changed)

    def _parse_flag_values(self) -> None:
        """Values as a command line gives them (transformers' HfArgumentParser, TRL's TrlParser):
        a JSON object for a mapping field, one name for a list of names (:mod:`rloo.config.field_types`)."""
        for name in ("report_to", "rollout_worker_devices"):
            if isinstance(getattr(self, name), str):
                self._set(name, [getattr(self, name)])
        for name in STEP_FIELDS:  # --logging_steps 10 parses as 10.0: config.yaml records 10
            self._set(name, whole_if_integral(getattr(self, name)))
        for name in self.field_names():
            value = getattr(self, name)
            if (
                isinstance(value, str)
                and CONTAINER_KINDS.get(declared_annotation(RLOOConfig, name).split(" |")[0]) == "mapping"
            ):
                try:
                    self._set(name, parse_json_object(value))
                except ValueError as err:
                    raise fail(name, value, str(err)) from None

    def _freeze_containers(self) -> None:
        """Containers become immutable too (a frozen config holds no list to append to); the keyword
        mappings passed through to transformers are normalized on the way."""
        for name in ("report_to", "reward_weights", "rollout_worker_devices"):
            if getattr(self, name) is not None:
                self._set(name, tuple(getattr(self, name)))
        for name, normalize in (
            ("model_init_kwargs", self._init_kwargs),
            ("generation_kwargs", normalize_generation_kwargs),
            ("chat_template_kwargs", check_writable),
            ("gradient_checkpointing_kwargs", check_writable),
            ("lr_scheduler_kwargs", check_writable),
            ("accelerator_config", check_writable),
        ):
            if getattr(self, name) is not None:
                self._set(name, MappingProxyType(_normalized(name, getattr(self, name), normalize)))

    def _init_kwargs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        kwargs = normalize_init_kwargs(given)
        if kwargs.get("trust_remote_code", self.trust_remote_code) != self.trust_remote_code:
            raise KwargsError("trust_remote_code", "set trust_remote_code once, as the config field")
        return kwargs

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return tuple((self.generation_kwargs or {}).get("stop_strings", ()))

    @property
    def extra_eos_token_ids(self) -> tuple[int, ...]:
        return tuple((self.generation_kwargs or {}).get("eos_token_id", ()))

    @property
    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """What ``from_pretrained`` gets for the policy and reference: float32 weights unless
        ``model_init_kwargs`` names a dtype (as TRL; mixed precision is autocast), and
        ``trust_remote_code``."""
        return {"dtype": "float32", **(self.model_init_kwargs or {}), "trust_remote_code": self.trust_remote_code}

    def replace(self, **changes: Any) -> RLOOConfig:
        """A new, validated config with ``changes``; unset algorithm knobs follow its preset again.

        ``dataclasses.replace`` works too, but it passes every resolved knob as if set by hand,
        so a changed ``preset`` would not apply to them; this method does not.
        """
        changes = accept_older_names(changes)
        given = {key: value for key, value in self._given.items() if key not in changes}
        return type(self)(**{**self.to_dict(), **given, **changes})

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

    def steps(self, name: str, max_steps: int) -> int:
        """Field ``name`` of :data:`STEP_FIELDS` in optimizer steps: a fraction in (0, 1) is that share of
        ``max_steps``, rounded up (transformers 5); None (no ``eval_steps``) is 0."""
        value = getattr(self, name)
        return 0 if value is None else optimizer_steps(value, max_steps)

    @property
    def evaluation_strategy(self) -> str:
        """``eval_strategy`` as resolved at construction: None is ``steps`` with ``eval_steps``, else ``no``."""
        return self.eval_strategy or "no"

    @property
    def eval_prompts_per_batch(self) -> int:
        """Prompts per evaluation batch on one process: ``per_device_eval_batch_size`` completions in
        whole prompts (at least one), or a training generation batch's prompts."""
        if self.per_device_eval_batch_size is None:
            return self.prompts_per_generation
        return max(1, self.per_device_eval_batch_size // (self.num_generations_eval or self.num_generations))

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
        if not isinstance(values, Mapping):
            raise ValueError(f"RLOOConfig.from_dict takes a mapping of field names to values, got {values!r}")
        return cls(**values)


def _normalized(name: str, given: Mapping[str, Any], normalize: Any) -> dict[str, Any]:
    """``normalize(given)``, its :class:`KwargsError` re-raised as the config's error for field ``name``."""
    try:
        return dict(normalize(given))
    except KwargsError as err:
        raise fail(name, dict(given), err.fix) from None
