"""A generation batch whose one optimizer step is one pass takes the old log-probs its advantages need (the KL
reward penalty's policy side) from that pass's own forward (issue 40): no no-grad policy forward runs for them,
and the step is the one the separate forward gave."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rloo import RLOOTrainer
from rloo.training import experience
from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer, params, trainer


def _perturbed(run: Any) -> Any:
    """The policy moved off its reference (seeded), so the first batch's KL is not 0."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in run.unwrapped_model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    return run


def _counting_passes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The no-grad log-prob passes phase 3 runs (the models they ran)."""
    calls: list[Any] = []
    original = experience.no_grad_logprobs

    def counted(model: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(model)
        return original(model, *args, **kwargs)

    monkeypatch.setattr(experience, "no_grad_logprobs", counted)
    return calls


def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_pass: bool, dropout: float = 0.0, **overrides: Any
) -> tuple[Any, int]:
    """A perturbed run of 1 step with beta 0.1 (KL in the reward); the number of no-grad passes it ran."""
    calls = _counting_passes(monkeypatch)
    run = _perturbed(trainer(tmp_path, beta=0.1, max_steps=1, skip_zero_advantage=False, **overrides))
    for module in run.unwrapped_model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = dropout  # drawn in training forwards
    if not one_pass:
        run.updater.one_pass = lambda rollout: False
    run.train()
    return run, len(calls)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"gradient_checkpointing": True}, {"kl_estimator": "k3", "normalize_advantages": True}, {"bf16": True}],
)
def test_a_one_pass_step_takes_the_kl_rewards_policy_side_from_its_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any], fresh_accelerate_state: Any
) -> None:
    fused, fused_passes = _run(tmp_path / "fused", monkeypatch, one_pass=True, **overrides)
    separate, separate_passes = _run(tmp_path / "separate", monkeypatch, one_pass=False, **overrides)
    assert (fused_passes, separate_passes) == (1, 2)  # the reference's, and (before) the policy's own
    a, b = fused.state.log_history[0], separate.state.log_history[0]
    assert a["kl"] != 0.0
    for name in ("kl", "reward", "advantages/std", "loss", "grad_norm", "entropy"):
        assert a[name] == pytest.approx(b[name], rel=1e-5, abs=1e-7), name
    assert a["clip_ratio/region_mean"] == 0.0  # the step's ratio is exactly 1
    for name, weight in params(fused.unwrapped_model).items():
        torch.testing.assert_close(weight, params(separate.unwrapped_model)[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "overrides",
    [
        {"num_iterations": 2},  # two optimizer steps on the batch: the old log-probs must be of the sampling policy
        {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2},  # one step of two passes
        {"dropout": 0.1},  # the advantages would share the gradient's dropout draw
    ],
    ids=["two-steps", "two-passes", "dropout"],
)
def test_a_step_that_is_not_one_pass_keeps_its_old_log_prob_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any]
) -> None:
    _, passes = _run(tmp_path, monkeypatch, one_pass=True, **overrides)
    assert passes == 2


def test_the_gradient_variance_probe_sees_a_pending_batch_before_its_backward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the probe needs the batch's advantages and the weights it was sampled with: it runs once the pass has
    # completed the batch and before the backward, so the step stays one pass and the probe's numbers are those
    # of the separate pass's batch
    probed, probed_passes = _run(tmp_path / "fused", monkeypatch, one_pass=True, log_grad_variance=1)
    separate, _ = _run(tmp_path / "separate", monkeypatch, one_pass=False, log_grad_variance=1)
    assert probed_passes == 1
    a, b = probed.state.log_history[0], separate.state.log_history[0]
    for name in ("grad_var/rloo", "grad_var/none", "grad_var/groups"):
        assert a[name] == pytest.approx(b[name], rel=1e-4), name
    for name, weight in params(probed.unwrapped_model).items():
        torch.testing.assert_close(weight, params(separate.unwrapped_model)[name], rtol=1e-5, atol=1e-6)


def test_a_pass_of_empty_completions_only_takes_a_step_without_a_gradient(tmp_path: Path) -> None:
    # every completion is empty (a rollout_func's; the sampler can end one before its first token too): no token
    # to score, so the one pass's loss is a constant; before, its backward raised "element 0 of tensors does not
    # require grad" (a separate pass skipped every row instead: A = 0)
    def empty(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        rows = [prompt for prompt in prompts for _ in range(trainer.args.num_generations)]
        ids = [trainer.processing_class(p, add_special_tokens=False)["input_ids"] for p in rows]
        return {"prompt_ids": ids, "completion_ids": [[] for _ in rows], "logprobs": [[] for _ in rows]}

    tok = make_tokenizer()
    run = RLOOTrainer(
        make_model(tok), frac7, args=config(tmp_path, beta=0.1, max_steps=1), train_dataset=dataset(),
        processing_class=tok, rollout_func=empty,
    )  # fmt: skip
    before = params(run.unwrapped_model)
    run.train()
    assert run.state.log_history[0]["completions/mean_length"] == 0.0
    assert all(torch.equal(before[name], weight) for name, weight in params(run.unwrapped_model).items())
