"""``rollout_func`` (rloo.tools.rollout_func): the user samples the batch; rloo scores it, masks what the
``env_mask`` marks as inserted, passes the extra fields to the rewards, and trains."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rloo import RLOOConfig, RLOOTrainer
from rloo.tools.rollout_func import custom_rollout
from tests.helpers.models import make_model, make_tokenizer, next_train_batch

TOK = make_tokenizer()
EOS = TOK.eos_token_id


def encode(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def scripted(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
    """K completions per prompt: the model's "1", an inserted " ok ", the model's "2" and EOS."""
    k = trainer.args.num_generations
    out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "tag": []}
    for prompt in prompts:
        for j in range(k):
            ids = encode("1") + encode(" ok ") + encode(str(j)) + [EOS]
            out["prompt_ids"].append(encode(prompt))
            out["completion_ids"].append(ids)
            out["logprobs"].append([-1.0] * len(ids))
            out["env_mask"].append([1] + [0] * 4 + [1, 1])
            out["tag"].append(f"{prompt}/{j}")
    return out


def args(tmp_path: Path, **overrides: Any) -> RLOOConfig:
    values = {"output_dir": str(tmp_path / "run"), "num_generations": 4, "per_device_train_batch_size": 8}
    return RLOOConfig(**{**values, "max_steps": 2, "logging_steps": 1, "report_to": [], "seed": 0, **overrides})


def test_a_rollout_funcs_batch_is_scored_masked_and_trained(tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def reward(completions: list[str], tag: list[str], prompts: list[str], **_: Any) -> list[float]:
        seen.update(tags=tag, prompts=prompts)
        return [float(t.endswith(("/0", "/1"))) for t in tag]

    calls: list[list[Any]] = []

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        calls.append(prompts)
        return scripted(prompts, trainer)

    data = [{"prompt": f"{a}+{a}="} for a in range(8)]
    trainer = RLOOTrainer(
        make_model(TOK),
        reward,
        args=args(tmp_path),
        train_dataset=data,
        processing_class=TOK,
        rollout_func=rollout_func,
    )
    batch = next_train_batch(trainer)
    assert len(calls[0]) == 2 and len(set(calls[0])) == 2  # P raw prompts, each once
    assert batch.loss_mask[0].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]  # " ok " is context only
    assert batch.rollout.completion_mask[0].sum() == 7 and not batch.rollout.truncated.any()
    assert seen["tags"][:4] == [f"{calls[0][0]}/{j}" for j in range(4)] and seen["prompts"][0] == calls[0][0]
    assert batch.advantages[:4].tolist() == pytest.approx([2 / 3, 2 / 3, -2 / 3, -2 / 3])
    trainer.train()
    assert trainer.state.global_step == 2


def test_a_completion_without_eos_counts_as_truncated() -> None:
    output = {"prompt_ids": [[5], [5]], "completion_ids": [[6, EOS], [6, 7]], "logprobs": [None, [-1.0, -2.0]]}
    rollout, extra = custom_rollout(output, 1, 2, [0], [EOS], TOK.pad_token_id, torch.device("cpu"))
    assert rollout.truncated.tolist() == [False, True] and extra == {}
    assert rollout.sampling_logprobs.tolist() == [[0.0, 0.0], [-1.0, -2.0]] and rollout.tool_mask is None


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ({"prompt_ids": [[5]], "completion_ids": [[6]]}, r"must return keys \['logprobs'\]"),
        ({"prompt_ids": [[5]], "completion_ids": [[6]], "logprobs": [[0.0]]}, r"'prompt_ids' has 1 entries; give one "),
        (
            {"prompt_ids": [[5]] * 2, "completion_ids": [[6]] * 2, "logprobs": [[0.0, 0.0]] * 2},
            r"logprobs\[0\] has 2 values for 1 tokens",
        ),
        (
            {"prompt_ids": [[5]] * 2, "completion_ids": [[6]] * 2, "logprobs": [[0.0]] * 2, "env_mask": [[1, 1]] * 2},
            r"env_mask\[0\] has 2 values for 1 tokens",
        ),
        ([1, 2], "rollout_func returned list"),
    ],
)
def test_a_malformed_output_names_the_key_and_what_is_expected(output: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        custom_rollout(output, 1, 2, [0], [EOS], TOK.pad_token_id, torch.device("cpu"))


def test_rollout_func_with_tools_or_vllm_is_refused_saying_why(tmp_path: Path) -> None:
    data = [{"prompt": "1+1="}] * 4
    with pytest.raises(ValueError, match="got rollout_func and tools/environment_factory"):
        RLOOTrainer(make_model(TOK), lambda **_: [0.0], args=args(tmp_path), train_dataset=data, processing_class=TOK,
                    rollout_func=scripted, tools=[print])  # fmt: skip
    with pytest.raises(ValueError, match="with use_vllm=True is not built yet"):
        RLOOTrainer(make_model(TOK), lambda **_: [0.0], args=args(tmp_path, use_vllm=True, vllm_mode="server"),
                    train_dataset=data, processing_class=TOK, rollout_func=scripted)  # fmt: skip
