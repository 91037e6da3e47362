"""GRPO's names (TRL's GRPOConfig) as RLOOConfig keywords: translated where they mean the same as one
of rloo's knobs, refused with the reason where they do not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rloo import GRPOConfig, RLOOConfig


@pytest.mark.parametrize(
    ("given", "knob", "value"),
    [
        ({"loss_type": "grpo"}, "loss_aggregation", "seq_mean_token_mean"),
        ({"loss_type": "dapo"}, "loss_aggregation", "token_mean"),
        ({"loss_type": "dr_grpo"}, "loss_aggregation", "seq_mean_token_sum_norm"),
        ({"scale_rewards": "group"}, "advantage_estimator", "grpo"),
        ({"scale_rewards": True}, "advantage_estimator", "grpo"),
        ({"scale_rewards": "batch"}, "advantage_estimator", "reinforce_pp_baseline"),
        ({"scale_rewards": "none"}, "advantage_estimator", "group_mean"),
        ({"scale_rewards": False}, "advantage_estimator", "group_mean"),
        ({"importance_sampling_level": "token"}, "ratio_level", "token"),
    ],
)
def test_a_grpo_name_sets_the_knob_that_means_the_same(
    tmp_path: Path, given: dict[str, Any], knob: str, value: str
) -> None:
    # before: "unknown RLOOConfig field `loss_type`; did you mean `lora_task_type`?"
    args = RLOOConfig(output_dir=str(tmp_path), **given)
    assert getattr(args, knob) == getattr(args.algorithm, knob) == value
    assert args.to_dict()[knob] == value and next(iter(given)) not in args.to_dict()  # config.yaml: rloo's knob


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ({"loss_type": "bnpo"}, "depends on per_device_train_batch_size"),
        ({"loss_type": "cispo"}, "no CISPO objective"),
        ({"loss_type": "vespo"}, "no VESPO objective"),
        ({"importance_sampling_level": "sequence"}, r"exp\(mean_t log-ratio\)"),
        ({"loss_type": "dapo", "loss_aggregation": "seq_mean_token_sum"}, "give only one"),
        ({"scale_rewards": "sometimes"}, "choose one of"),
    ],
)
def test_a_grpo_value_rloo_has_no_equal_for_is_refused_with_the_reason(
    tmp_path: Path, given: dict[str, Any], reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        RLOOConfig(output_dir=str(tmp_path), **given)


def test_grpoconfig_is_rloos_config_with_trls_grpo_defaults(tmp_path: Path) -> None:
    args = GRPOConfig(output_dir=str(tmp_path))
    assert isinstance(args, RLOOConfig) and args.preset == "trl_grpo"
    # TRL 1.16 GRPOConfig: scale_rewards='group', loss_type='dapo', beta=0.0, importance_sampling_level='token'
    assert (args.advantage_estimator, args.loss_aggregation, args.beta, args.ratio_level) == (
        "grpo",
        "token_mean",
        0.0,
        "token",
    )
    assert GRPOConfig(output_dir=str(tmp_path), loss_type="grpo").loss_aggregation == "seq_mean_token_mean"
    assert isinstance(args.replace(beta=0.04), GRPOConfig)
    rebuilt = RLOOConfig(**args.to_dict())  # config.yaml read back by `rloo train` trains the same
    assert rebuilt.algorithm == args.algorithm


def test_grpo_configs_defaults_are_trls_and_its_names_read_back() -> None:
    from rloo import GRPOConfig

    grpo, rloo = GRPOConfig(output_dir="x"), RLOOConfig(output_dir="x")
    # TRL 1.16: GRPOConfig num_generations 8, max_completion_length 512; RLOOConfig 2 and 512
    assert (grpo.num_generations, grpo.max_completion_length) == (8, 512)
    assert (rloo.num_generations, rloo.max_completion_length) == (2, 512)
    assert (grpo.loss_type, grpo.scale_rewards, grpo.importance_sampling_level) == ("dapo", "group", "token")
    assert RLOOConfig(output_dir="x", loss_type="dr_grpo", scale_rewards="batch").loss_type == "dr_grpo"
    assert rloo.scale_rewards is None  # rloo's leave-one-out baseline has no GRPO name


def test_a_grpo_configs_refusals_name_grpoconfig() -> None:
    from rloo import GRPOConfig

    with pytest.raises(ValueError, match=r"^GRPOConfig\(loss_type='bnpo'\) is not supported"):
        GRPOConfig(output_dir="x", loss_type="bnpo")
    with pytest.raises(ValueError, match=r"^GRPOConfig\.beta=-1 is invalid"):
        GRPOConfig(output_dir="x", beta=-1)
