"""Every fast path against the plain path: same log-probs, same update."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate.state import AcceleratorState
from pytest import MonkeyPatch

import rloo.training.passes as passes_module
from rloo.op_counts import OpCounts
from rloo.training.passes import no_grad_logprobs
from rloo.training.trainer import RLOOTrainer
from tests.helpers.models import config as config_of
from tests.helpers.models import dataset, frac7, next_train_batch, params, qwen_vocab_model, trainer


def first_digit_is_one(prompts: list[str], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    """Constant within most groups (all prompts starting with '1' score 1): many zero-std groups."""
    return [1.0 if p.startswith("1") else float(len(ids) % 2) for p, ids in zip(prompts, completion_ids, strict=True)]


def trained(tmp_path: Path, **overrides: Any) -> dict[str, torch.Tensor]:
    t = trainer(tmp_path, **overrides)
    t.train()
    return params(t.unwrapped_model)


def step_gradients(tmp_path: Path, **overrides: Any) -> list[list[torch.Tensor]]:
    """The gradients handed to the optimizer at every step of a short run."""
    t = trainer(tmp_path, **overrides)
    seen: list[list[torch.Tensor]] = []
    step = t.optimizer.step

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append([p.grad.clone() for p in t.unwrapped_model.parameters() if p.grad is not None])
        return step(*args, **kwargs)

    t.optimizer.step = spy  # type: ignore[method-assign]
    t.train()
    return seen


def assert_same_gradients(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> None:
    assert len(a) == len(b) and all(len(x) == len(y) for x, y in zip(a, b, strict=True))
    for x, y in zip(a, b, strict=True):
        for gx, gy in zip(x, y, strict=True):
            torch.testing.assert_close(gx, gy, rtol=1e-4, atol=1e-7)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Equal up to float summation order (a few ulps of the gradient, amplified by Adam)."""
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-5)


def test_skipping_zero_advantage_rows_gives_the_same_update(tmp_path: Path) -> None:
    data = [{"prompt": f"1{a}+{a}="} for a in range(12)] + dataset(4)
    # beta = 0: a KL term in the reward would make every group's rewards differ
    common: dict[str, Any] = {"reward_funcs": first_digit_is_one, "data": data, "max_steps": 3, "beta": 0.0}
    t = trainer(tmp_path / "skip", skip_zero_advantage=True, **common)
    t.train()
    skipped = [h["train/skipped_rows_frac"] for h in t.state.log_history if "reward" in h]
    assert max(skipped) > 0  # the fast path was taken
    assert_same_gradients(
        step_gradients(tmp_path / "a", skip_zero_advantage=True, **common),
        step_gradients(tmp_path / "b", skip_zero_advantage=False, **common),
    )


def test_all_rows_skipped_still_steps_like_zero_gradients(tmp_path: Path) -> None:
    def constant(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        return [1.0] * len(completion_ids)

    common: dict[str, Any] = {"reward_funcs": constant, "max_steps": 2, "beta": 0.0, "weight_decay": 0.1}
    assert_same(
        trained(tmp_path / "skip", skip_zero_advantage=True, **common),
        trained(tmp_path / "plain", skip_zero_advantage=False, **common),
    )


def test_splitting_passes_by_logits_memory_gives_the_same_update(tmp_path: Path, monkeypatch: MonkeyPatch) -> None:
    # one step: later steps start from parameters that differ by float rounding amplified by Adam
    common: dict[str, Any] = {"max_steps": 1, "beta": 0.05, "per_device_train_batch_size": 16}
    big = step_gradients(tmp_path / "big", max_logits_memory_mb=1e4, **common)
    rows: list[int] = []
    plan = passes_module.plan_passes

    def spy(all_rows: Any, lengths: Any, max_rows: int) -> list[list[int]]:
        rows.append(max_rows)
        return plan(all_rows, lengths, max_rows)

    monkeypatch.setattr(passes_module, "plan_passes", spy)
    # the chunked head: whole passes, the LM head one token at a time
    assert_same_gradients(step_gradients(tmp_path / "chunks", max_logits_memory_mb=1e-6, **common), big)
    assert rows and min(rows) > 1
    monkeypatch.setattr(passes_module, "head_is_exact", lambda *args: False)  # the plain path: one row per pass
    rows.clear()
    assert_same_gradients(step_gradients(tmp_path / "small", max_logits_memory_mb=1e-6, **common), big)
    assert rows and max(rows) == 1


def test_sampling_logprobs_are_the_policy_logprobs(tmp_path: Path) -> None:
    """KL in the reward uses the sampler's log-probs instead of an extra forward pass."""
    t = trainer(tmp_path, beta=0.05)
    batch = next_train_batch(t)
    forward = no_grad_logprobs(t.model, batch.rollout, t.args.temperature, max_rows=batch.num_rows)
    torch.testing.assert_close(forward, batch.rollout.sampling_logprobs, rtol=0, atol=1e-5)


def test_no_old_logprob_pass_when_the_batch_is_used_once_without_a_kl_reward_penalty(tmp_path: Path) -> None:
    once = trainer(tmp_path / "once", beta=0.0)
    assert next_train_batch(once).old_logprobs is None
    twice = trainer(tmp_path / "twice", beta=0.0, num_iterations=2)
    assert next_train_batch(twice).old_logprobs is not None
    # a KL reward penalty takes its policy side from the reference side's passes (issue 25)
    penalized = trainer(tmp_path / "penalized", beta=0.05, kl_placement="reward")
    assert next_train_batch(penalized).old_logprobs is not None
    in_loss = trainer(tmp_path / "in-loss", beta=0.05, kl_placement="loss", kl_estimator="k3")
    assert next_train_batch(in_loss).old_logprobs is None


def test_detached_current_logprobs_equal_a_separate_old_pass(tmp_path: Path) -> None:
    """With one optimizer step per batch, old = current.detach() gives the update of a real old pass."""
    plain = trainer(tmp_path / "a", max_steps=1, beta=0.0)
    batch = next_train_batch(plain)
    with_old = type(batch)(
        batch.rollout,
        batch.loss_mask,
        batch.advantages,
        no_grad_logprobs(plain.model, batch.rollout, plain.args.temperature, max_rows=batch.num_rows),
        batch.reference_logprobs,
        batch.metrics,
    )
    twin = trainer(tmp_path / "b", max_steps=1, beta=0.0)
    rows = [torch.arange(batch.num_rows)]
    plain.updater.step(batch, rows, 0, first=True)
    twin.updater.step(with_old, rows, 0, first=False)  # the stored old log-probs, as a later step reads them
    assert_same(params(plain.unwrapped_model), params(twin.unwrapped_model))


def test_frac7_reward_is_used(tmp_path: Path) -> None:
    assert frac7([[1, 2]]) == [0.0]


def forwards_of_one_step(tmp_path: Path, bf16: bool) -> int:
    """Forwards of the model in one step (sampling, reference log-probs, the update) of a 2-layer model
    with Qwen2.5's 151,936-token vocabulary, whose float32 logits of one row exceed the 4 MiB budget."""
    from rloo.tiny import build_char_tokenizer

    tok = build_char_tokenizer(vocab_size=151_936)
    t = RLOOTrainer(
        model=qwen_vocab_model(len(tok), pad_token_id=tok.pad_token_id),
        reward_funcs=frac7,
        args=config_of(tmp_path / str(bf16), max_steps=1, beta=0.05, bf16=bf16, max_logits_memory_mb=4),
        train_dataset=dataset(),
        processing_class=tok,
    )
    calls = [0]
    forward = t.unwrapped_model.forward

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return forward(*args, **kwargs)

    t.unwrapped_model.forward = counted  # type: ignore[method-assign]
    t.train()
    AcceleratorState._reset_state(reset_partial_state=True)  # one mixed-precision setting per process
    return calls[0]


def test_bf16_autocast_runs_as_many_forwards_as_float32(tmp_path: Path, fresh_accelerate_state: Any) -> None:
    # the head probe compared float32 with bf16 logits under bf16, failed, and planned one-row passes:
    # 8 reference passes and 8 training passes instead of 1 and 1
    assert forwards_of_one_step(tmp_path, bf16=True) == forwards_of_one_step(tmp_path, bf16=False)


@pytest.mark.parametrize("padding_free", [False, True], ids=["shared-prompts", "packed"])
def test_a_no_grad_pass_reads_the_host_a_few_times(tmp_path: Path, padding_free: bool) -> None:
    # lengths read once per batch and once per pass, handed down; the packed layout's bins gathered with
    # indices built on the host (39 host syncs per packed pass before, one or more per row)
    t = trainer(tmp_path, beta=0.05, max_completion_length=16, padding_free=padding_free)
    rollout = next_train_batch(t).rollout
    assert rollout.completion_mask.sum(dim=1).unique().numel() > 2  # varied lengths
    with OpCounts() as counts:
        no_grad_logprobs(t.unwrapped_model, rollout, 1.0, max_rows=4, padding_free=padding_free)
    passes = -(-rollout.completion_ids.shape[0] // 4)
    assert counts.total_syncs <= 1 + 9 * passes, dict(counts.syncs)
