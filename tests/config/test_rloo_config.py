"""Tests for rloo.config and rloo.config.presets: validation messages, presets, derived values."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import pkgutil
import re
from typing import Any

import pytest
import yaml

import rloo.config.validation
from rloo.algo.advantages import ADVANTAGE_ESTIMATORS
from rloo.algo.losses import AGGREGATION_MODES
from rloo.config import RLOOConfig, fields
from rloo.config.presets import PRESET_KEYS, PRESETS, AlgorithmSpec, describe_algorithm

INF, NAN = math.inf, math.nan

# (constructor kwargs, field named in the message, value shown in the message, part of the fix)
INVALID: list[tuple[dict[str, Any], str, Any, str]] = [
    # --- generation ---
    ({"num_generations": 1}, "num_generations", 1, "at least 2 completions per prompt"),
    ({"num_generations": 0}, "num_generations", 0, "use 2 or more"),
    ({"max_completion_length": 0}, "max_completion_length", 0, "must be >= 1"),
    ({"max_prompt_length": 0}, "max_prompt_length", 0, "or None for no truncation"),
    ({"temperature": 0.0}, "temperature", 0.0, "must be > 0"),
    ({"temperature": -1.0}, "temperature", -1.0, "must be > 0"),
    ({"temperature": NAN}, "temperature", NAN, "must be finite (NaN and infinity are not settings)"),
    ({"top_p": 0.0}, "top_p", 0.0, "must be in (0, 1]"),
    ({"top_p": 1.5}, "top_p", 1.5, "1.0 disables it"),
    ({"top_k": -1}, "top_k", -1, "0 disables it"),
    ({"min_p": -0.1}, "min_p", -0.1, "must be in [0, 1], or None"),
    ({"min_p": 1.5}, "min_p", 1.5, "must be in [0, 1], or None"),
    ({"repetition_penalty": 0.0}, "repetition_penalty", 0.0, "1.0 disables it"),
    # --- preset and algorithm choices: the message lists the valid names ---
    ({"preset": "ppo"}, "preset", "ppo", f"choose one of {sorted(PRESETS)}"),
    ({"advantage_estimator": "gae"}, "advantage_estimator", "gae", f"choose one of {sorted(ADVANTAGE_ESTIMATORS)}"),
    ({"kl_estimator": "k4"}, "kl_estimator", "k4", "choose one of ['k1', 'k2', 'k3']"),
    ({"kl_placement": "advantage"}, "kl_placement", "advantage", "choose one of ['reward', 'loss']"),
    ({"kl_placement": "loss", "kl_estimator": "k1"}, "kl_estimator", "k1", "expected gradient is 0"),
    ({"ratio_level": "tokens"}, "ratio_level", "tokens", "choose one of ['sequence', 'token']"),
    ({"loss_aggregation": "mean"}, "loss_aggregation", "mean", f"choose one of {list(AGGREGATION_MODES)}"),
    # --- algorithm numbers ---
    ({"beta": -0.1}, "beta", -0.1, "finite number >= 0"),
    ({"beta": INF}, "beta", INF, "must be finite (NaN and infinity are not settings)"),
    ({"beta": NAN}, "beta", NAN, "must be finite (NaN and infinity are not settings)"),
    ({"epsilon": 0.0}, "epsilon", 0.0, "must be > 0"),
    ({"epsilon": -0.2}, "epsilon", -0.2, "must be > 0"),
    ({"epsilon": 1.0}, "epsilon", 1.0, "must be < 1"),
    ({"epsilon": 1.5, "epsilon_high": 0.3}, "epsilon", 1.5, "1 - epsilon stays positive"),
    ({"epsilon_high": 0.0}, "epsilon_high", 0.0, "must be > 0"),
    ({"epsilon_high": -0.28}, "epsilon_high", -0.28, "unset to equal epsilon"),
    ({"num_iterations": 0}, "num_iterations", 0, "must be >= 1"),
    ({"off_policy_mask_threshold": -0.5}, "off_policy_mask_threshold", -0.5, "mean KL kept, > 0"),
    ({"multi_objective_aggregation": "mean"}, "multi_objective_aggregation", "mean", "choose one of"),
    ({"rollout_workers": -1, "max_staleness": 1}, "rollout_workers", -1, ">= 0 (0: sample in the trainer's process)"),
    ({"weight_sync_steps": 0, "max_staleness": 1}, "weight_sync_steps", 0, "must be >= 1 optimizer steps"),
    ({"weight_sync_steps": 2}, "weight_sync_steps", 2, "set max_staleness >= 1 too"),
    ({"rollout_workers": 1}, "rollout_workers", 1, "set max_staleness >= 1 too"),
    ({"rollout_workers": 1, "max_staleness": 1, "num_iterations": 2}, "rollout_workers", 1, "is not built yet"),
    ({"max_staleness": -1}, "max_staleness", -1, "must be >= 0 optimizer steps"),
    ({"free_running": True, "max_staleness": 1}, "free_running", True, "set rollout_workers >= 1"),
    ({"heartbeat_stale_after_s": 0.0}, "heartbeat_stale_after_s", 0.0, "without a sign of life that mean hung, > 0"),
    ({"heartbeat_stale_after_s": NAN}, "heartbeat_stale_after_s", NAN, "must be finite (NaN and infinity are not"),
    (
        {"rollout_worker_devices": ["cpu"], "max_staleness": 1, "rollout_workers": 2},
        "rollout_worker_devices",
        ["cpu"],
        "give one device per worker: rollout_workers=2",
    ),
    (
        {"rollout_worker_devices": ["cpu", "tpu:0"], "max_staleness": 1, "rollout_workers": 2},
        "rollout_worker_devices",
        ["cpu", "tpu:0"],
        "'tpu:0' is not a device: use cpu, cuda or cuda:N",
    ),
    ({"max_num_gen_batches": 0}, "max_num_gen_batches", 0, "the most generation rounds a batch may take, >= 1"),
    ({"dynamic_sampling": True, "advantage_estimator": "reinforce"}, "dynamic_sampling", True, "no group baseline"),
    ({"dynamic_sampling": True, "preset": "reinforce_pp"}, "dynamic_sampling", True, "'reinforce_pp' gives a group"),
    (
        {"dynamic_sampling": True, "max_staleness": 1, "rollout_workers": 1},
        "dynamic_sampling",
        True,
        "together with rollout_workers=1",
    ),
    ({"max_staleness": 2, "use_vllm": True}, "max_staleness", 2, "with use_vllm is not built yet"),
    ({"max_tool_calling_iterations": -1}, "max_tool_calling_iterations", -1, "must be >= 0 rounds"),
    ({"tool_timeout": 0.0}, "tool_timeout", 0.0, "must be > 0 seconds"),
    ({"max_logits_memory_mb": 0}, "max_logits_memory_mb", 0, "must be > 0"),
    ({"entropy_coef": -0.01}, "entropy_coef", -0.01, "must be >= 0"),
    ({"entropy_coef": NAN}, "entropy_coef", NAN, "must be finite (NaN and infinity are not settings)"),
    ({"reward_clip_range": (1.0, -1.0)}, "reward_clip_range", (1.0, -1.0), "min <= max"),
    ({"reward_clip_range": [0.0]}, "reward_clip_range", (0.0,), "give (min, max)"),
    ({"reward_clip_range": (0.0, 1.0, 2.0)}, "reward_clip_range", (0.0, 1.0, 2.0), "give (min, max)"),
    ({"reward_weights": []}, "reward_weights", [], "one weight per reward function"),
    ({"reward_weights": ["a", 1.0]}, "reward_weights", ["a", 1.0], "entry 0 is 'a' (a str): give a number"),
    ({"reward_weights": [1.0, True]}, "reward_weights", [1.0, True], "entry 1 is True (a bool): give a number"),
    ({"reward_clip_range": ["a", 1.0]}, "reward_clip_range", ("a", 1.0), "entry 0 is 'a' (a str)"),
    # --- optimization ---
    ({"learning_rate": 0.0}, "learning_rate", 0.0, "must be > 0"),
    ({"learning_rate": -1e-6}, "learning_rate", -1e-6, "must be > 0"),
    ({"lr_scheduler_type": "cosine_restarts"}, "lr_scheduler_type", "cosine_restarts", "'cosine_with_restarts'"),
    ({"warmup_ratio": 1.0}, "warmup_ratio", 1.0, "must be in [0, 1)"),
    ({"warmup_ratio": -0.1}, "warmup_ratio", -0.1, "must be in [0, 1)"),
    ({"warmup_steps": -1}, "warmup_steps", -1, "must be >= 0"),
    ({"max_grad_norm": -1.0}, "max_grad_norm", -1.0, "0 disables gradient clipping"),
    ({"max_grad_norm": NAN}, "max_grad_norm", NAN, "must be finite (NaN and infinity are not settings)"),
    ({"max_grad_norm": -1.0}, "max_grad_norm", -1.0, "0 disables gradient clipping"),
    ({"max_nonfinite_steps": 0}, "max_nonfinite_steps", 0, "must be >= 1"),
    ({"reward_timeout": 0.0}, "reward_timeout", 0.0, "must be > 0 seconds, or None"),
    ({"reward_error_policy": "ignore"}, "reward_error_policy", "ignore", "choose one of ['raise', 'skip']"),
    ({"epsilon_high": 0.1}, "epsilon_high", 0.1, "must be >= epsilon (0.2)"),
    ({"weight_decay": -0.1}, "weight_decay", -0.1, "must be >= 0"),
    ({"weight_decay": NAN}, "weight_decay", NAN, "must be finite (NaN and infinity are not settings)"),
    ({"weight_decay": -1.0}, "weight_decay", -1.0, "must be >= 0"),
    ({"adam_beta1": 1.0}, "adam_beta1", 1.0, "must be in [0, 1)"),
    ({"adam_beta1": -0.1}, "adam_beta1", -0.1, "must be in [0, 1)"),
    ({"adam_beta2": 1.5}, "adam_beta2", 1.5, "must be in [0, 1)"),
    ({"adam_epsilon": -1e-8}, "adam_epsilon", -1e-8, "must be >= 0"),
    ({"optim": "adamw_torh"}, "optim", "adamw_torh", "; did you mean `adamw_torch`?"),
    ({"optim": "lion"}, "optim", "lion", "choose one of ['adamw_torch', 'adamw_torch_fused', 'adafactor', 'sgd'"),
    ({"optim": "sgd", "optim_args": "momentum"}, "optim_args", "momentum", "is not key=value"),
    ({"sampler_compaction": 0.0}, "sampler_compaction", 0.0, "must be in (0, 1]"),
    ({"sampler_cuda_graphs": True, "use_vllm": True}, "sampler_cuda_graphs", True, "with use_vllm=True vLLM samples"),
    ({"fp16": True, "bf16": True}, "fp16", True, "fp16 and bf16 are both True; choose one"),
    ({"max_steps": 0}, "max_steps", 0, "or -1 to train for num_train_epochs"),
    ({"max_steps": -2}, "max_steps", -2, "or -1 to train for num_train_epochs"),
    ({"num_train_epochs": 0.0}, "num_train_epochs", 0.0, "must be > 0 when max_steps is -1"),
    # --- batches ---
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size", 0, "must be >= 1"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps", 0, "must be >= 1"),
    (
        {"generation_batch_size": 16, "steps_per_generation": 2},
        "generation_batch_size",
        16,
        "set either generation_batch_size or steps_per_generation, not both",
    ),
    (
        {"generation_batch_size": 12},
        "generation_batch_size",
        12,
        "must be a multiple of per_device_train_batch_size (8)",
    ),
    ({"steps_per_generation": 0}, "steps_per_generation", 0, "must be >= 1"),
    (
        {"steps_per_generation": 3, "gradient_accumulation_steps": 2},
        "steps_per_generation",
        3,
        "must be a multiple of gradient_accumulation_steps (2) so no optimizer step straddles",
    ),
    (
        {"num_generations": 3},
        "generation_batch_size",
        8,
        "(per_device_train_batch_size x steps_per_generation = 8) must be divisible by num_generations (3)",
    ),
    ({"torch_compile_mode": "fast"}, "torch_compile_mode", "fast", "choose one of ['default'"),
    ({"model_init_kwargs": {"dtype": "int8"}}, "model_init_kwargs", {"dtype": "int8"}, "dtype must be a torch dtype"),
    ({"generation_kwargs": {"num_beams": 2}}, "generation_kwargs", {"num_beams": 2}, "rloo does not do beam search"),
    ({"chat_template_kwargs": {"x": object}}, "chat_template_kwargs", {"x": object}, "cannot be recorded"),
    ({"dataloader_num_workers": 1}, "dataloader_num_workers", 1, "only 0"),
    ({"cache_implementation": "static"}, "cache_implementation", "static", "only None or 'dynamic'"),
    ({"pad_to_multiple_of": 0}, "pad_to_multiple_of", 0, "must be >= 1"),
    ({"per_device_eval_batch_size": 0}, "per_device_eval_batch_size", 0, "must be >= 1"),
    ({"accelerator_config": {"even_batches": False}}, "accelerator_config", {"even_batches": False}, "drop even"),
    ({"router_aux_loss_coef": -1.0}, "router_aux_loss_coef", -1.0, "must be >= 0"),
    ({"ref_model_mixup_alpha": -0.1}, "ref_model_mixup_alpha", -0.1, "must be in [0, 1]"),
    ({"ref_model_sync_steps": 0}, "ref_model_sync_steps", 0, "must be >= 1"),
    ({"sync_ref_model": True, "beta": 0.0}, "sync_ref_model", True, "set beta > 0"),
    # --- logging and checkpoints ---
    ({"logging_steps": 0}, "logging_steps", 0, "must be > 0"),
    ({"save_steps": 0}, "save_steps", 0, "must be > 0"),
    ({"save_total_limit": 0}, "save_total_limit", 0, "or None to keep every checkpoint"),
    ({"eval_steps": 0}, "eval_steps", 0, "or None to skip evaluation"),
    ({"load_best_model_at_end": True}, "load_best_model_at_end", True, "it needs evaluations"),
    ({"eval_strategy": "often"}, "eval_strategy", "often", "choose one of ['steps', 'epoch', 'no']"),
    ({"save_strategy": "best"}, "save_strategy", "best", "choose one of ['steps', 'epoch', 'no']"),
    ({"num_generations_eval": 0}, "num_generations_eval", 0, "or None for num_generations"),
    ({"report_to": ["tensorboard", "mlfow"]}, "report_to", ["tensorboard", "mlfow"], "'mlflow'"),
    ({"report_to": "neptune"}, "report_to", ["neptune"], "each entry must be one of"),
    ({"num_completions_to_print": -1}, "num_completions_to_print", -1, "must be >= 0"),
    ({"log_grad_variance": -1}, "log_grad_variance", -1, "must be >= 0 (steps between measurements; 0 = off)"),
    # --- vllm ---
    ({"vllm_mode": "remote"}, "vllm_mode", "remote", "use 'server' (a `rloo vllm-serve` process) or 'colocate'"),
    ({"vllm_server_timeout": 0.0}, "vllm_server_timeout", 0.0, "give the seconds to wait, > 0"),
    ({"vllm_server_port": 0}, "vllm_server_port", 0, "give a TCP port, 1-65535"),
    ({"vllm_server_base_url": "localhost:8000"}, "vllm_server_base_url", "localhost:8000", "e.g. http://127.0.0.1"),
    ({"vllm_importance_sampling_mode": "token"}, "vllm_importance_sampling_mode", "token", "choose one of"),
    ({"vllm_importance_sampling_clip_max": 0.0}, "vllm_importance_sampling_clip_max", 0.0, "an upper bound > 0"),
    ({"vllm_importance_sampling_clip_min": -1.0}, "vllm_importance_sampling_clip_min", -1.0, "a lower bound >= 0"),
    ({"vllm_structured_outputs_regex": "a+"}, "vllm_structured_outputs_regex", "a+", "not supported yet"),
]


@pytest.mark.parametrize(("kwargs", "name", "value", "fix"), INVALID, ids=[f"{c[1]}-{c[0]}" for c in INVALID])
def test_invalid_value_names_field_value_and_fix(kwargs: dict[str, Any], name: str, value: Any, fix: str) -> None:
    with pytest.raises(ValueError) as info:
        RLOOConfig(**kwargs)
    message = str(info.value)
    assert message.startswith(f"RLOOConfig.{name}={value!r} is invalid: "), message
    assert fix in message


def test_every_validated_field_is_covered() -> None:
    # each field with a check in RLOOConfig (a field group's or a cross-group one) appears above, so a new
    # check needs a new case
    covered = {case[1] for case in INVALID}
    groups = [importlib.import_module(f"rloo.config.fields.{m.name}") for m in pkgutil.iter_modules(fields.__path__)]
    source = "".join(inspect.getsource(module) for module in [rloo.config.validation, *groups])
    checked = set(re.findall(r'fail\(\s*"(\w+)"', source)) | {"logging_steps", "save_steps"}
    assert checked <= covered, checked - covered


def test_divisibility_message_suggests_a_valid_batch_size() -> None:
    for kwargs in ({"num_generations": 3}, {"num_generations": 4, "per_device_train_batch_size": 5}):
        with pytest.raises(ValueError, match="every prompt's") as info:
            RLOOConfig(**kwargs)
        suggested = int(re.search(r"per_device_train_batch_size=(\d+)", str(info.value)).group(1))  # type: ignore[union-attr]
        config = RLOOConfig(**{**kwargs, "per_device_train_batch_size": suggested})
        assert config.completions_per_generation % config.num_generations == 0
    # hand-checked: 8 completions, K=3 -> 6 ; 5 completions, K=4 -> 4
    with pytest.raises(ValueError, match=r"e\.g\. per_device_train_batch_size=6$"):
        RLOOConfig(num_generations=3)
    with pytest.raises(ValueError, match=r"e\.g\. per_device_train_batch_size=4$"):
        RLOOConfig(num_generations=4, per_device_train_batch_size=5)


def test_divisibility_suggestion_valid_with_generation_batch_size() -> None:
    # 16 completions can never split into groups of 3: the fix is another generation_batch_size
    kwargs: dict[str, Any] = {"generation_batch_size": 16, "num_generations": 3}
    with pytest.raises(ValueError, match=r"every prompt's.*e\.g\. generation_batch_size=24$") as info:
        RLOOConfig(**kwargs)
    suggested = int(re.search(r"generation_batch_size=(\d+)$", str(info.value)).group(1))  # type: ignore[union-attr]
    config = RLOOConfig(**{**kwargs, "generation_batch_size": suggested})
    assert config.completions_per_generation % config.num_generations == 0


def test_micro_batch_message_names_the_field_the_user_set() -> None:
    # the user set generation_batch_size=16 (2 micro-batches of 8) with GA=4, not steps_per_generation
    with pytest.raises(ValueError, match=r"^RLOOConfig\.generation_batch_size=16 is invalid"):
        RLOOConfig(generation_batch_size=16, gradient_accumulation_steps=4)


def test_valid_edge_values_are_accepted() -> None:
    RLOOConfig(top_p=1.0, top_k=0, min_p=0.0, max_prompt_length=None, max_grad_norm=0.0, beta=0.0)
    RLOOConfig(min_p=1.0, epsilon=0.99, warmup_ratio=0.0, save_total_limit=1, eval_steps=1)
    RLOOConfig(max_steps=10, num_train_epochs=0.0)  # epochs unused when max_steps is set
    RLOOConfig(reward_clip_range=(-1.0, -1.0), reward_weights=[1.0, 0.5], report_to=["tensorboard", "wandb"])
    RLOOConfig(generation_batch_size=24, num_generations=3)
    RLOOConfig(steps_per_generation=4, gradient_accumulation_steps=2)


def test_default_config_is_valid_on_cpu() -> None:
    config = RLOOConfig()
    assert config.bf16 is None  # bf16 resolved at run time, so no GPU is needed to build it
    assert config.preset == "trl" and config.preset_overrides == {}
    assert config.report_to == ("none",)


def test_report_to_string_becomes_list() -> None:
    assert RLOOConfig(report_to="wandb").report_to == ("wandb",)


# ---------------------------------------------------------------------------- presets

_TRL = {
    "advantage_estimator": "rloo",
    "normalize_advantages": False,
    "kl_estimator": "k1",
    "kl_placement": "reward",
    "ratio_level": "sequence",
    "loss_aggregation": "seq_mean_token_sum",
    "epsilon": 0.2,
    "epsilon_high": 0.2,
    "clip_ratio": True,
    "beta": 0.05,
    "mask_truncated_completions": False,
}
_TOKEN_LOSS = {"kl_placement": "loss", "ratio_level": "token"}
# Written out from the preset docs (presets.py comments and the module docstring of config.py).
DOCUMENTED = {
    "trl": _TRL,
    "rloo_paper": {**_TRL, "clip_ratio": False},
    "reinforce_pp": {
        **_TRL,
        **_TOKEN_LOSS,
        "advantage_estimator": "reinforce_pp",
        "kl_estimator": "k2",
        "loss_aggregation": "token_mean",
    },
    "reinforce_pp_baseline": {
        **_TRL,
        **_TOKEN_LOSS,
        "advantage_estimator": "reinforce_pp_baseline",
        "kl_estimator": "k2",
        "loss_aggregation": "token_mean",
    },
    "grpo": {
        **_TRL,
        **_TOKEN_LOSS,
        "advantage_estimator": "grpo",
        "kl_estimator": "k3",
        "loss_aggregation": "seq_mean_token_mean",
        "beta": 0.04,
    },
    "dr_grpo": {
        **_TRL,
        **_TOKEN_LOSS,
        "advantage_estimator": "group_mean",
        "kl_estimator": "k3",
        "loss_aggregation": "seq_mean_token_sum_norm",
        "beta": 0.0,
    },
    # TRL 1.16 GRPOConfig's defaults: scale_rewards="group", loss_type="dapo", beta=0.0
    "trl_grpo": {
        **_TRL,
        **_TOKEN_LOSS,
        "advantage_estimator": "grpo",
        "kl_estimator": "k3",
        "loss_aggregation": "token_mean",
        "beta": 0.0,
    },
    "dapo": {
        **_TRL,
        **_TOKEN_LOSS,
        "advantage_estimator": "grpo",
        "kl_estimator": "k3",
        "loss_aggregation": "token_mean",
        "epsilon_high": 0.28,
        "beta": 0.0,
        "mask_truncated_completions": True,
    },
}


def test_documented_table_covers_every_preset() -> None:
    assert set(DOCUMENTED) == set(PRESETS)
    for values in PRESETS.values():
        assert set(values) == set(PRESET_KEYS)


@pytest.mark.parametrize("preset", sorted(DOCUMENTED))
def test_preset_resolves_to_documented_spec(preset: str) -> None:
    config = RLOOConfig(preset=preset)
    assert config.algorithm == AlgorithmSpec(**DOCUMENTED[preset])
    assert config.preset_overrides == {}
    # the resolved values are also the config's own fields (the trainer may read either)
    for key, value in DOCUMENTED[preset].items():
        assert getattr(config, key) == value
    text = config.describe_algorithm()
    assert f"preset {preset!r}" in text and "explicit" not in text


def test_explicit_field_wins_and_is_reported() -> None:
    config = RLOOConfig(preset="grpo", beta=0.1, loss_aggregation="token_mean", kl_estimator="k3")
    assert config.algorithm.beta == 0.1
    assert config.algorithm.loss_aggregation == "token_mean"
    assert config.algorithm.advantage_estimator == "grpo"  # the rest still from the preset
    # kl_estimator="k3" equals the preset's value: not an override
    assert config.preset_overrides == {"beta": (0.1, 0.04), "loss_aggregation": ("token_mean", "seq_mean_token_mean")}
    text = config.describe_algorithm()
    assert "  explicit   beta=0.1 wins over the preset's 0.04" in text
    assert "  explicit   loss_aggregation='token_mean' wins over the preset's 'seq_mean_token_mean'" in text
    assert "kl_estimator" not in text


def test_explicit_false_and_zero_win_over_preset() -> None:
    # falsy explicit values must not be mistaken for "unset"
    config = RLOOConfig(preset="dapo", mask_truncated_completions=False, clip_ratio=False)
    assert config.algorithm.mask_truncated_completions is False
    assert config.algorithm.clip_ratio is False
    assert config.algorithm.clip_range == (INF, INF)
    config = RLOOConfig(beta=0.0)
    assert config.algorithm.beta == 0.0 and config.preset_overrides == {"beta": (0.0, 0.05)}
    assert "R_i = r_i\n" in config.describe_algorithm() + "\n"


def test_epsilon_alone_sets_symmetric_clip() -> None:
    config = RLOOConfig(epsilon=0.3)
    assert (config.algorithm.epsilon, config.algorithm.epsilon_high) == (0.3, 0.3)
    assert "clip(rho, 1-0.3, 1+0.3)" in config.describe_algorithm()
    # TRL semantics even against a clip-higher preset: epsilon_high follows epsilon
    config = RLOOConfig(preset="dapo", epsilon=0.1)
    assert config.algorithm.clip_range == (0.1, 0.1)


def test_explicit_epsilon_high_wins_with_dapo() -> None:
    config = RLOOConfig(preset="dapo", epsilon=0.1, epsilon_high=0.4)
    assert config.algorithm.clip_range == (0.1, 0.4)
    config = RLOOConfig(preset="dapo", epsilon_high=0.3)
    assert config.algorithm.clip_range == (0.2, 0.3)
    assert config.preset_overrides == {"epsilon_high": (0.3, 0.28)}
    assert RLOOConfig(preset="dapo").algorithm.clip_range == (0.2, 0.28)


def test_describe_default_has_leave_one_out_formula() -> None:
    text = RLOOConfig().describe_algorithm()
    assert text.splitlines()[0] == "algorithm (preset 'trl'):"
    assert "A_i = R_i - 1/(K-1) sum_{j!=i} R_j" in text
    assert "R_i = r_i - beta * sum_t k1_t" in text  # TRL: KL in the reward
    assert "rho_i = exp(sum_t log pi_t - log pi_old_t), one per completion" in text
    assert "clip(rho, 1-0.2, 1+0.2)" in text
    assert "seq_mean_token_sum: 1/N sum_i S_i" in text


def test_describe_kl_in_loss_and_no_clipping() -> None:
    text = RLOOConfig(preset="grpo").describe_algorithm()
    assert "+ beta * sum_t k3_t" in text and "R_i = r_i\n" in text
    assert "one per token" in text
    assert "rho (no clipping)" in RLOOConfig(preset="rloo_paper").describe_algorithm()
    assert "truncated completions masked" in RLOOConfig(preset="dapo").describe_algorithm()


@pytest.mark.parametrize("estimator", sorted(ADVANTAGE_ESTIMATORS))
@pytest.mark.parametrize("aggregation", AGGREGATION_MODES)
def test_describe_knows_every_registered_name(estimator: str, aggregation: str) -> None:
    # a name in the registries but missing from the formula tables would raise KeyError
    spec = AlgorithmSpec(**{**_TRL, "advantage_estimator": estimator, "loss_aggregation": aggregation})
    assert describe_algorithm("trl", spec, {})
    RLOOConfig(advantage_estimator=estimator, loss_aggregation=aggregation)


# ---------------------------------------------------------------------------- derived values


@pytest.mark.parametrize(
    ("kwargs", "micro", "completions", "prompts", "optimizer_steps"),
    [
        # default: pd=8, GA=1, K=2 -> one micro-batch of 8 completions = 4 prompts
        ({}, 1, 8, 4, 1),
        # steps_per_generation defaults to GA: 2 micro-batches of 4 = 8 completions, K=4
        ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_generations": 4}, 2, 8, 2, 1),
        # 4 micro-batches of 8 = 32 completions of 8 prompts; 4 micro / GA 2 = 2 steps
        ({"steps_per_generation": 4, "gradient_accumulation_steps": 2, "num_generations": 4}, 4, 32, 8, 2),
        # 24 / 8 = 3 micro-batches, K=3 -> 8 prompts, GA=1 -> 3 steps
        ({"generation_batch_size": 24, "num_generations": 3}, 3, 24, 8, 3),
        # two passes over the batch: 4 micro * 2 iterations / GA 2 = 4 steps
        ({"steps_per_generation": 4, "gradient_accumulation_steps": 2, "num_iterations": 2}, 4, 32, 16, 4),
        ({"num_iterations": 2}, 1, 8, 4, 2),
    ],
)
def test_derived_batch_sizes(
    kwargs: dict[str, Any], micro: int, completions: int, prompts: int, optimizer_steps: int
) -> None:
    config = RLOOConfig(**kwargs)
    assert config.micro_batches_per_generation == micro
    assert config.completions_per_generation == completions
    assert config.prompts_per_generation == prompts
    assert config.optimizer_steps_per_generation == optimizer_steps


# ---------------------------------------------------------------------------- serialization

ROUND_TRIP = [
    {},
    {"preset": "dapo", "epsilon_high": 0.3, "beta": 0.01},
    {"epsilon": 0.3, "reward_clip_range": (-1.0, 1.0), "reward_weights": [1.0, 0.5]},
    {"report_to": "tensorboard", "steps_per_generation": 2, "min_p": 0.05, "model_init_kwargs": {"dtype": "float32"}},
]


@pytest.mark.parametrize("kwargs", ROUND_TRIP)
def test_to_dict_round_trip(kwargs: dict[str, Any]) -> None:
    config = RLOOConfig(**kwargs)
    d = config.to_dict()
    assert set(d) == set(RLOOConfig.field_names())
    again = RLOOConfig(**d)
    assert again.to_dict() == d
    assert again.algorithm == config.algorithm
    # YAML (the saved config.yaml) round-trips through from_dict too
    loaded = yaml.safe_load(yaml.safe_dump(d))
    assert RLOOConfig.from_dict(loaded).to_dict() == d


def test_round_trip_keeps_preset_overrides() -> None:
    config = RLOOConfig(epsilon=0.3)
    assert RLOOConfig(**config.to_dict()).preset_overrides == config.preset_overrides


def test_from_dict_suggests_closest_field() -> None:
    with pytest.raises(
        ValueError, match=r"unknown RLOOConfig field `num_generation`; did you mean `num_generations`\?"
    ):
        RLOOConfig.from_dict({"num_generation": 4})
    with pytest.raises(ValueError, match="unknown RLOOConfig field `zzzz`") as info:
        RLOOConfig.from_dict({"zzzz": 1})
    assert "did you mean" not in str(info.value)
    # resolved-only attributes are not constructor fields
    with pytest.raises(ValueError, match="unknown RLOOConfig field `algorithm`"):
        RLOOConfig.from_dict({"algorithm": None})
    assert RLOOConfig.from_dict({"num_generations": 4}).num_generations == 4


def test_an_assignment_rebuilds_the_config_so_a_late_change_is_never_half_applied() -> None:
    # once: `args.beta = 0.5` after construction reached config.yaml while the trainer kept the
    # resolved copy (beta 0.05). Then the config refused every assignment, and TRL's own script
    # (`training_args.model_init_kwargs = ...` after parsing) died. Now an assignment re-validates
    # and re-resolves the whole config; it is read-only once a trainer took it.
    args = RLOOConfig()
    args.beta = 0.5
    assert args.beta == args.algorithm.beta == args.to_dict()["beta"] == 0.5
    args.preset = "grpo"  # the knobs left unset follow the new preset; beta was set by hand
    assert args.algorithm.advantage_estimator == "grpo" and args.beta == 0.5
    args.model_init_kwargs = {"dtype": "bfloat16"}
    with pytest.raises(TypeError):  # normalized and read-only like a constructor argument
        args.model_init_kwargs["dtype"] = "float32"  # type: ignore[index]
    with pytest.raises(ValueError, match=r"^RLOOConfig\.temperature=-1 is invalid"):
        args.temperature = -1
    assert args.temperature == 1.0  # a refused assignment changes nothing
    with pytest.raises(ValueError, match=r"^unknown RLOOConfig field `learnig_rate`; did you mean `learning_rate`"):
        args.learnig_rate = 1e-5
    with pytest.raises(dataclasses.FrozenInstanceError):
        del args.seed
    args.freeze()
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"once a trainer took it.*args\.replace\(beta=\.\.\.\)"):
        args.beta = 0.1
    changed = args.replace(beta=0.1)
    assert changed.beta == changed.algorithm.beta == 0.1 and not changed.frozen
    assert args.beta == 0.5  # the original is untouched


def test_an_older_name_assigned_maps_like_a_keyword() -> None:
    args = RLOOConfig()
    with pytest.warns(FutureWarning, match="kl_coef"):
        args.kl_coef = 0.2
    assert args.beta == 0.2


def test_config_containers_are_immutable_too() -> None:
    args = RLOOConfig(reward_weights=[1.0, 0.5], model_init_kwargs={"dtype": "float32"}, report_to=["none"])
    assert args.reward_weights == (1.0, 0.5) and args.report_to == ("none",)
    with pytest.raises(TypeError):
        args.model_init_kwargs["dtype"] = "bfloat16"  # type: ignore[index]
    # to_dict gives plain YAML types back
    values = args.to_dict()
    assert values["reward_weights"] == [1.0, 0.5] and values["model_init_kwargs"] == {"dtype": "float32"}
    assert RLOOConfig(**values) == args


def test_replace_lets_the_preset_fill_the_knobs_again() -> None:
    grpo = RLOOConfig(beta=0.1).replace(preset="grpo")
    assert grpo.algorithm.advantage_estimator == "grpo" and grpo.loss_aggregation == "seq_mean_token_mean"
    assert grpo.beta == 0.1  # set by hand, so it still wins
    assert RLOOConfig().replace(preset="grpo").beta == 0.04


def test_numpy_numbers_are_accepted_as_plain_numbers() -> None:
    # the type check takes any real number; config.yaml can only hold plain ones
    import numpy as np
    import yaml

    config = RLOOConfig(learning_rate=np.float64(2e-5), per_device_train_batch_size=np.int64(8))
    assert type(config.learning_rate) is float and type(config.per_device_train_batch_size) is int
    assert "per_device_train_batch_size: 8" in yaml.safe_dump(config.to_dict())


def test_asynchronous_sampling_without_clipping_is_cautioned() -> None:
    from rloo.config.fields.rollouts import staleness_caution

    assert staleness_caution(0, clip_ratio=False) is None  # synchronous: nothing lags
    assert staleness_caution(2, clip_ratio=True) is None  # clipped: each step's move is bounded
    caution = staleness_caution(3, clip_ratio=False)
    assert caution is not None and "clip_ratio: true" in caution and "tinker-cookbook#822" in caution
