"""Every fast path against the plain path: same log-probs, same update; a pass's router (load-balancing) loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from accelerate.state import AcceleratorState
from pytest import MonkeyPatch

import rloo.training.passes as passes_module
import rloo.training.update as update
from rloo.config import RLOOConfig
from rloo.op_counts import OpCounts
from rloo.training.passes import Pass, no_grad_logprobs, pass_loss
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


def forwards_of_one_step(tmp_path: Path, bf16: bool, **overrides: Any) -> int:
    """Forwards of the model in one step (sampling, reference log-probs, the update) of a 2-layer model
    with Qwen2.5's 151,936-token vocabulary, whose float32 logits of one row exceed the 4 MiB budget."""
    from rloo.tiny import build_char_tokenizer

    tok = build_char_tokenizer(vocab_size=151_936)
    t = RLOOTrainer(
        model=qwen_vocab_model(len(tok), pad_token_id=tok.pad_token_id),
        reward_funcs=frac7,
        args=config_of(
            tmp_path / f"{bf16}{sorted(overrides)}",
            max_steps=1,
            beta=0.05,
            bf16=bf16,
            max_logits_memory_mb=4,
            **overrides,
        ),
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


def test_torch_compile_keeps_the_heads_rows_per_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the whole model compiled took the plain head: (rows, T, V) float32 logits within the budget, one-row
    # passes at this vocabulary (8 training passes for this step's 8 rows); the decoder layers compiled
    # (rloo.training.regional_compile) keep the chunked head's rows, a whole micro-batch a pass
    planned: list[int] = []
    plan = update.plan_passes

    def recorded(rows: Any, lengths: Any, max_rows: int) -> Any:
        planned.append(max_rows)
        return plan(rows, lengths, max_rows)

    monkeypatch.setattr(update, "plan_passes", recorded)
    forwards_of_one_step(tmp_path, bf16=False, torch_compile_backend="aot_eager")
    assert planned == [8]


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


# tiny mixture-of-experts models of three families, with the load-balancing loss (router_aux_loss_coef)
ROUTED = {
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", {"num_experts": 4, "moe_intermediate_size": 16}),
    "gpt_oss": ("GptOssForCausalLM", "GptOssConfig", {"num_local_experts": 4, "head_dim": 8}),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", {"num_local_experts": 4}),
}


def routed_model(family: str, vocab: int) -> Any:
    model_class, config_class, fields = ROUTED[family]
    shape = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
    model_config = getattr(transformers, config_class)(
        vocab_size=vocab, num_key_value_heads=2, num_experts_per_tok=2, **shape, **fields
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return getattr(transformers, model_class)(model_config)


def routed_pass(vocab: int, advantages: torch.Tensor) -> Pass:
    """4 rows: prompts left-padded, completions right-padded (the mask keeps padding out of the router loss)."""
    g = torch.Generator().manual_seed(1)
    prompt_mask, completion_mask = torch.ones(4, 5, dtype=torch.long), torch.ones(4, 6, dtype=torch.long)
    prompt_mask[0, :2] = prompt_mask[1, :1] = completion_mask[2, 3:] = completion_mask[3, 5:] = 0
    return Pass(
        prompt_ids=torch.randint(3, vocab, (4, 5), generator=g),
        prompt_mask=prompt_mask,
        completion_ids=torch.randint(3, vocab, (4, 6), generator=g),
        completion_mask=completion_mask,
        loss_mask=completion_mask.float(),
        advantages=advantages,
        old_logprobs=None,
        reference_logprobs=None,
    )


@pytest.mark.parametrize("family", sorted(ROUTED))
def test_a_pass_adds_the_models_own_load_balancing_loss_and_its_gradient_reaches_the_routers(family: str) -> None:
    vocab = 40
    model = routed_model(family, vocab)
    objective = RLOOConfig(output_dir="x").algorithm.objective(8, 0.0)
    # the step has 8 sequences: this pass's 4 carry half of coef x its aux loss
    kwargs: dict[str, Any] = {"temperature": 1.0, "total_tokens": 21.0, "total_sequences": 8.0}
    rows = routed_pass(vocab, torch.tensor([1.0, -1.0, 0.5, -0.5]))
    plain = pass_loss(model, rows, objective, **kwargs)
    routed = pass_loss(model, rows, objective, aux_loss_coef=0.5, **kwargs)
    # by hand: the model's own aux_loss over prompt + completion, padding masked, rloo's positions
    attention = torch.cat([rows.prompt_mask, rows.completion_mask], dim=1)
    direct = model(
        input_ids=torch.cat([rows.prompt_ids, rows.completion_ids], dim=1),
        attention_mask=attention,
        position_ids=(attention.cumsum(1) - 1).clamp(min=0),
        output_router_logits=True,
    ).aux_loss
    aux = float(direct.detach())
    assert plain.aux_loss is None and routed.aux_loss == pytest.approx(aux, rel=1e-6)
    assert routed.loss_value == pytest.approx(plain.loss_value + 0.5 * aux * 4 / 8, rel=1e-6)
    # A = 0 everywhere: the policy loss has no gradient, so the routers' is the aux loss's alone
    model.zero_grad()
    pass_loss(model, routed_pass(vocab, torch.zeros(4)), objective, aux_loss_coef=0.5, **kwargs).loss.backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    (0.5 * direct * 4 / 8).backward()
    routers = [name for name in ours if name.endswith(("mlp.gate.weight", "mlp.router.weight"))]
    assert len(routers) == 2
    for name in routers:
        assert ours[name].abs().sum() > 0
        torch.testing.assert_close(ours[name], model.get_parameter(name).grad, rtol=1e-5, atol=1e-8)
