"""Every field of TRL's RLOOConfig and GRPOConfig (transformers' TrainingArguments under them) is
either an RLOOConfig field, an older or GRPO name rloo translates, or refused saying what rloo does
instead: none ends in a bare "unknown field", or in a "did you mean" of a field that only looks alike."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest

from rloo import RLOOConfig
from rloo.config.trl.elsewhere import ELSEWHERE
from rloo.config.trl.grpo_names import GRPO_NAMES
from rloo.config.trl.legacy import RENAMED, refusal_reason


def _trl_configs() -> list[type]:
    """The installed TRL's RLOOConfig, GRPOConfig and (TRL >= 1.14) experimental AsyncGRPOConfig."""
    import trl

    configs: list[type] = [trl.RLOOConfig, trl.GRPOConfig]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL warns on any import from trl.experimental
        try:
            from trl.experimental.async_grpo import AsyncGRPOConfig
        except ImportError:
            return configs
    return [*configs, AsyncGRPOConfig]


def test_every_trl_field_rloo_lacks_has_a_reason() -> None:
    import trl

    ours = set(RLOOConfig.field_names()) | set(RENAMED) | set(GRPO_NAMES) | {"dtype"}  # dtype: model_init_kwargs
    theirs = {f.name for config in _trl_configs() for f in dataclasses.fields(config) if f.init}
    lacking = sorted(name for name in theirs - ours if refusal_reason(name) is None)
    assert not lacking, f"TRL {trl.__version__} fields with no reason in rloo/config/trl/elsewhere.py: {lacking}"
    assert set(ELSEWHERE) <= theirs, "ELSEWHERE names a field TRL does not have"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("deepspeed", "FSDP2"),  # before: "did you mean `seed`?"
        ("log_level", "TRANSFORMERS_VERBOSITY"),  # before: "did you mean `ratio_level`?"
        ("disable_tqdm", "only on a terminal"),  # before: "did you mean `disable_dropout`?"
        ("dataloader_pin_memory", "no DataLoader"),
        ("max_inflight_tasks", "max_staleness"),  # AsyncGRPOConfig's
        ("token_budget", "max_logits_memory_mb"),
        ("fork_threshold_tokens", "never re-tokenizes"),
    ],
)
def test_a_trl_field_rloo_lacks_says_what_rloo_does_instead(tmp_path: Path, name: str, says: str) -> None:
    with pytest.raises(
        ValueError, match=rf"^RLOOConfig\({name}=\.\.\.\) is a TRL setting rloo does not support: .*{says}"
    ):
        RLOOConfig(output_dir=str(tmp_path), **{name: 1})


def test_async_grpos_dtype_loads_the_policy_in_it(tmp_path: Path) -> None:
    # TRL AsyncGRPOConfig's dtype is the policy's load dtype: rloo's from_pretrained keywords hold it
    assert RLOOConfig(output_dir=str(tmp_path), dtype="bfloat16").model_init_kwargs == {"dtype": "bfloat16"}
    given = RLOOConfig(output_dir=str(tmp_path), dtype="bfloat16", model_init_kwargs={"dtype": "float32"})
    assert given.model_init_kwargs == {"dtype": "float32"}  # model_init_kwargs' wins, as in TRL
    async_grpo_names = {"max_staleness": 4, "weight_sync_steps": 2, "heartbeat_stale_after_s": 60.0}
    config = RLOOConfig(output_dir=str(tmp_path), epsilon=0.2, **async_grpo_names)  # rloo's own fields
    assert (config.max_staleness, config.weight_sync_steps, config.heartbeat_stale_after_s) == (4, 2, 60.0)


def test_a_name_that_only_looks_alike_is_not_suggested(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        RLOOConfig(output_dir=str(tmp_path), losss_type="dapo")
    assert "lora_task_type" not in str(info.value)
    with pytest.raises(ValueError, match="did you mean `learning_rate`"):  # a typo still gets its field
        RLOOConfig(output_dir=str(tmp_path), learnig_rate=1e-5)
