"""The gradient-variance diagnostic: its math (rloo.algo.variance) against the softmax bandit's
closed form, the count sketch, per-completion gradients of a real model, and the trainer hook
(``log_grad_variance``), which must leave training unchanged bit for bit.

Statistics: a total variance measured from M groups is a mean of M i.i.d. terms
``M/(M-1) ||G_g - mean G||^2``; its standard error (SE) is estimated from those terms, and a
correct measurement lands within 4.5 SE of the closed form (a two-sided normal tail of 6.8e-6;
the seeds are fixed, so the outcome is reproducible).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from rloo.algo.advantages import get_advantage_estimator
from rloo.algo.bandit import closed_form_variance, exact_gradient, sample_groups
from rloo.algo.variance import group_estimates, total_variance, variance_metrics, variance_reduction
from rloo.generation.rollout import Rollout
from rloo.training.metrics import nonzero_advantage_tokens
from rloo.training.monitoring.grad_variance import SKETCH_DIM, GradVarianceProbe, completion_sketches, count_sketch
from rloo.training.parallel.distributed import Ranks
from rloo.training.passes import TrainBatch
from tests.helpers.models import config, make_model, make_tokenizer, params, trainer

Z = 4.5
THETA = torch.tensor([0.5, -0.2, 0.1, -0.8, 0.3], dtype=torch.float64)
ARM_REWARDS = torch.tensor([3.0, 5.0, 4.0, 7.0, 2.0], dtype=torch.float64)  # all positive: no baseline is noisy


def standard_error(estimates: Tensor) -> float:
    """SE of :func:`total_variance` of ``(M, D)`` estimates, from the per-group squared deviations."""
    m = estimates.shape[0]
    terms = ((estimates - estimates.mean(dim=0)) ** 2).sum(dim=1) * m / (m - 1)
    return float(terms.std() / math.sqrt(m))


# ---------------------------------------------------------------------------- the math, by hand
def test_group_estimates_and_total_variance_by_hand() -> None:
    vectors = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 1.0], [1.0, 1.0], [2.0, 2.0], [0.0, 4.0]])
    advantages = torch.tensor([1.0, -1.0, 2.0, 0.0, 0.5, -0.5])
    group_ids = torch.tensor([7, 7, 3, 3, 9, 9])  # ids in any order: rows come out by ascending id
    estimates = group_estimates(vectors, advantages, group_ids)
    # group 3: (2*[3,1] + 0)/2 = [3, 1]; group 7: ([1,0] - [0,2])/2 = [0.5, -1]; group 9: ([1,1] - [0,2])/2
    expected = torch.tensor([[3.0, 1.0], [0.5, -1.0], [0.5, -0.5]], dtype=torch.float64)
    torch.testing.assert_close(estimates, expected, rtol=0, atol=1e-15)
    # mean [4/3, -1/6]; squared deviations, x: (5/3)^2 + 2 (5/6)^2 = 75/18, y: (7/6)^2 + (5/6)^2 + (1/3)^2
    # = 78/36; their sum over M - 1 = 2
    assert total_variance(estimates) == pytest.approx((75 / 18 + 78 / 36) / 2, rel=1e-14)
    with pytest.raises(ValueError, match="M >= 2"):
        total_variance(estimates[:1])


def test_variance_reduction_is_one_minus_the_ratio() -> None:
    assert variance_reduction(1.0, 4.0) == 0.75
    assert variance_reduction(6.0, 4.0) == -0.5  # more variance than no baseline: negative
    assert math.isnan(variance_reduction(0.0, 0.0))  # nothing to reduce
    estimates = {"used": torch.tensor([[0.0], [2.0]]), "none": torch.tensor([[0.0], [4.0]])}
    metrics = variance_metrics(estimates)
    assert metrics == {
        "grad_var/used": 2.0,
        "grad_var/none": 8.0,
        "grad_var/reduction_vs_none": 0.75,
        "grad_var/groups": 2.0,
    }


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("estimator", ["reinforce", "rloo", "group_mean"])
def test_the_closed_form_is_the_exact_variance(k: int, estimator: str) -> None:
    """Every one of the A^K outcomes of a group, weighted by its probability: the exact variance."""
    pi = torch.softmax(THETA, dim=0)
    mean, second = torch.zeros(5, dtype=torch.float64), 0.0
    for arms in itertools.product(range(5), repeat=k):
        a = torch.tensor(arms)
        scores = torch.nn.functional.one_hot(a, 5).double() - pi
        adv = get_advantage_estimator(estimator)(ARM_REWARDS[a], torch.zeros(k, dtype=torch.long), torch.ones(k) > 0)
        g = (adv.unsqueeze(1) * scores).mean(dim=0)
        mean, second = mean + pi[a].prod() * g, second + float(pi[a].prod() * (g**2).sum())
    scale = (k - 1) / k if estimator == "group_mean" else 1.0  # the group mean includes r_i: biased by (K-1)/K
    torch.testing.assert_close(mean, scale * exact_gradient(THETA, ARM_REWARDS), rtol=1e-12, atol=1e-12)
    exact = second - float((mean**2).sum())
    assert closed_form_variance(THETA, ARM_REWARDS, k, estimator) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_measured_variances_converge_to_the_closed_form(k: int) -> None:
    samples = sample_groups(THETA, ARM_REWARDS, k, 400_000, torch.Generator().manual_seed(k))
    measured = {}
    for estimator in ("reinforce", "rloo"):
        estimates = samples.estimates(estimator)
        exact = closed_form_variance(THETA, ARM_REWARDS, k, estimator)
        measured[estimator] = total_variance(estimates)
        se = standard_error(estimates)
        assert se < 0.005 * exact  # the check is tight: half a percent
        assert abs(measured[estimator] - exact) < Z * se, (estimator, measured[estimator], exact, se)
    # on the same samples the group-mean advantage is (K-1)/K x the leave-one-out one: exactly
    assert total_variance(samples.estimates("group_mean")) == pytest.approx(
        measured["rloo"] * ((k - 1) / k) ** 2, rel=1e-12
    )
    exact_reduction = 1 - closed_form_variance(THETA, ARM_REWARDS, k, "rloo") / closed_form_variance(
        THETA, ARM_REWARDS, k, "reinforce"
    )
    assert variance_reduction(measured["rloo"], measured["reinforce"]) == pytest.approx(exact_reduction, abs=0.01)


# ---------------------------------------------------------------------------- the count sketch
def test_the_sketch_sends_each_coordinate_to_one_signed_bucket_and_is_linear() -> None:
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    basis = torch.eye(12).reshape(12, 3, 4)
    columns = torch.stack([count_sketch([e]) for e in basis])  # (12, D): row j = S e_j
    assert ((columns != 0).sum(dim=1) == 1).all() and set(columns[columns != 0].tolist()) <= {-1.0, 1.0}
    torch.testing.assert_close(count_sketch([x]), x.reshape(-1) @ columns, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(count_sketch([x]), count_sketch([x]), rtol=0, atol=0)  # the same S every call
    # parameters are sketched apart (seeded by position) and add up; None is a zero gradient
    y = torch.randn(5, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(count_sketch([x, y]), count_sketch([x, None]) + count_sketch([None, y]))
    assert not torch.equal(count_sketch([None, x]), count_sketch([x, None]))


def test_the_sketch_preserves_inner_products_in_expectation() -> None:
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(3000, generator=gen), torch.randn(3000, generator=gen) + 0.5
    products = torch.tensor([float(count_sketch([x], 64, s) @ count_sketch([y], 64, s)) for s in range(400)])
    norms = torch.tensor([float(count_sketch([x], 64, s).square().sum()) for s in range(400)])
    for values, exact in ((products, float(x @ y)), (norms, float(x @ x))):
        se = float(values.std()) / math.sqrt(values.numel())
        assert abs(float(values.mean()) - exact) < Z * se, (float(values.mean()), exact, se)
    # at the default size one sketch is already close: |error| ~ sqrt(2 / 1024) ||x||^2
    assert float(count_sketch([x]).square().sum()) == pytest.approx(float(x @ x), rel=0.15)


# ---------------------------------------------------------------------------- per-completion gradients
def _rollout(completion_ids: Tensor, completion_mask: Tensor, group_ids: Tensor, prompt_ids: Tensor) -> Rollout:
    n = completion_ids.shape[0]
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        truncated=torch.zeros(n, dtype=torch.bool),
        sampling_logprobs=torch.zeros(completion_ids.shape),
        group_ids=group_ids,
    )


def test_completion_sketches_are_the_sketched_gradients_and_leave_the_model_alone() -> None:
    from rloo.forward.logprobs import completion_logprobs

    tok = make_tokenizer()
    model = make_model(tok).train()
    gen = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, len(tok), (4, 3), generator=gen)
    completion_ids = torch.randint(3, len(tok), (4, 5), generator=gen)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.float32)
    loss_mask = mask.clone()
    loss_mask[3] = 0  # e.g. a truncated completion with mask_truncated_completions
    rollout = _rollout(completion_ids, mask, torch.tensor([0, 0, 1, 1]), prompt_ids)
    batch = TrainBatch(rollout, loss_mask, torch.ones(4), None, None, {})
    rng = torch.get_rng_state()
    sketches = completion_sketches(model, batch, temperature=0.7)
    assert torch.equal(torch.get_rng_state(), rng) and model.training  # restored
    assert all(p.grad is None for p in model.parameters())  # .grad never touched
    trainable = [p for p in model.parameters() if p.requires_grad]
    for i in range(4):  # the full, untrimmed row, by plain autograd
        logprobs = completion_logprobs(
            model.eval(),
            prompt_ids[i : i + 1],
            rollout.prompt_mask[i : i + 1],
            completion_ids[i : i + 1],
            mask[i : i + 1],
            0.7,
        ).logprobs
        total = (logprobs * loss_mask[i]).sum()
        if loss_mask[i].any():
            expected = count_sketch(torch.autograd.grad(total, trainable, allow_unused=True))
            torch.testing.assert_close(sketches[i], expected, rtol=1e-4, atol=1e-5)
        else:
            assert torch.equal(sketches[i], torch.zeros(SKETCH_DIM))  # no loss token: no gradient


class BanditLM(nn.Module):
    """A causal LM that is a softmax bandit: the logits are ``theta`` at every position, whatever the
    input. A one-token completion is an arm pull and its score function is ``e_a - softmax(theta)``."""

    def __init__(self, theta: Tensor) -> None:
        super().__init__()
        self.theta = nn.Parameter(theta.clone())

    def forward(self, input_ids: Tensor, logits_to_keep: Tensor, **_: Any) -> Any:
        return SimpleNamespace(logits=self.theta.expand(input_ids.shape[0], logits_to_keep.numel(), -1))


def test_the_trainer_probe_measures_the_closed_form_variance_on_a_bandit_model() -> None:
    """End to end through the probe (per-row forward and backward, the sketch, the gather, the
    estimators): the variances are the bandit's exact-score ones, which converge to the closed form."""
    k, m = 4, 3000
    samples = sample_groups(THETA, ARM_REWARDS, k, m, torch.Generator().manual_seed(5))
    arms = samples.scores.argmax(dim=1)  # e_a - pi: the pulled arm is the one positive entry
    n = arms.numel()
    rollout = _rollout(arms.unsqueeze(1), torch.ones(n, 1), samples.group_ids, torch.zeros(n, 1, dtype=torch.long))
    scorable = torch.ones(n, dtype=torch.bool)
    used = get_advantage_estimator("rloo")(samples.rewards, samples.group_ids, scorable)
    batch = TrainBatch(rollout, torch.ones(n, 1), used.float(), None, None, {})
    buckets = {int(count_sketch([e]).nonzero()) for e in torch.eye(5)}
    assert len(buckets) == 5  # no two arms share a bucket: here the sketch is an exact isometry
    probe = GradVarianceProbe(every=1, steps_per_batch=1, temperature=1.0, ranks=Ranks())
    metrics = probe.measure(BanditLM(THETA.float()), batch, samples.rewards.float(), scorable, contextlib.nullcontext)
    assert metrics["grad_var/groups"] == m and metrics["timing/grad_variance"] > 0
    assert metrics["grad_var/used"] == pytest.approx(metrics["grad_var/rloo"], rel=1e-6)  # float32 vs float64
    for name, estimator in (("none", "reinforce"), ("rloo", "rloo"), ("group_mean", "group_mean")):
        estimates = samples.estimates(estimator)
        assert metrics[f"grad_var/{name}"] == pytest.approx(total_variance(estimates), rel=1e-5)  # float32 noise
        exact = closed_form_variance(THETA, ARM_REWARDS, k, estimator)
        assert abs(metrics[f"grad_var/{name}"] - exact) < Z * standard_error(estimates), name
    exact_reduction = 1 - closed_form_variance(THETA, ARM_REWARDS, k, "rloo") / closed_form_variance(
        THETA, ARM_REWARDS, k, "reinforce"
    )
    assert metrics["grad_var/reduction_vs_none"] == pytest.approx(exact_reduction, abs=0.03)
    grpo = total_variance(samples.estimates("grpo"))
    assert metrics["grad_var/grpo"] == pytest.approx(grpo, rel=1e-4)


# ---------------------------------------------------------------------------- the trainer
def test_the_schedule_measures_batches_that_feed_a_multiple_of_every() -> None:
    probe = GradVarianceProbe(every=3, steps_per_batch=2, temperature=1.0, ranks=Ranks())
    # batches feed steps (1, 2), (3, 4), (5, 6), (7, 8), (9, 10): 3, 6 and 9 are in the 2nd, 3rd and 5th
    assert [probe.due(done) for done in (0, 2, 4, 6, 8)] == [False, True, True, False, True]
    every_step = GradVarianceProbe(every=1, steps_per_batch=1, temperature=1.0, ranks=Ranks())
    assert all(every_step.due(done) for done in range(5))


def test_nonzero_advantage_tokens_counts_the_loss_tokens_that_carry_a_signal() -> None:
    advantages = torch.tensor([0.5, 0.0, -1.0])
    completion_mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 1, 1]])
    loss_mask = completion_mask.clone()
    loss_mask[2] = 0  # masked (truncated): its advantage reaches no token
    assert nonzero_advantage_tokens(advantages, loss_mask, completion_mask) == [3.0, 8.0]


def test_bad_settings_are_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"RLOOConfig.log_grad_variance=-1 is invalid: must be >= 0"):
        config(tmp_path, log_grad_variance=-1)
    with pytest.raises(ValueError, match=r"log_grad_variance=5 is invalid: the gradient variance is measured across"):
        trainer(tmp_path, log_grad_variance=5, per_device_train_batch_size=4)  # one prompt per batch


def test_measuring_leaves_the_run_unchanged_bit_for_bit(tmp_path: Path) -> None:
    """Same weights and the same metrics with and without the diagnostic (beta > 0: reference
    log-probs; dropout on in the model, which the diagnostic must not draw for)."""
    runs = {}
    for every, dropout in ((0, 0.1), (2, 0.1), (0, 0.0)):
        t = trainer(tmp_path / f"{every}-{dropout}", max_steps=4, beta=0.05, log_grad_variance=every)
        for module in t.unwrapped_model.modules():
            if hasattr(module, "attention_dropout"):
                module.attention_dropout = dropout  # draws from the global generator in training passes
        t.train()
        runs[every, dropout] = (params(t.unwrapped_model), [r for r in t.state.log_history if "reward" in r])
    (off_params, off_logs), (on_params, on_logs) = runs[0, 0.1], runs[2, 0.1]
    assert all(torch.equal(off_params[k], on_params[k]) for k in off_params)
    # and the check has teeth: the dropout draws matter, so a diagnostic that drew would show
    assert not all(torch.equal(off_params[k], runs[0, 0.0][0][k]) for k in off_params)
    assert [row["step"] for row in on_logs if "grad_var/rloo" in row] == [2.0, 4.0]
    for off, on in zip(off_logs, on_logs, strict=True):
        assert not any(key.startswith("grad_var/") for key in off)
        same = {k: v for k, v in on.items() if not k.startswith(("grad_var/", "timing/", "step_time", "tokens_per"))}
        assert same == {k: v for k, v in off.items() if not k.startswith(("timing/", "step_time", "tokens_per"))}
        assert 0.0 < on["frac_tokens_nonzero_advantage"] <= 1.0
    measured = on_logs[1]
    assert measured["grad_var/used"] == measured["grad_var/rloo"] and measured["grad_var/groups"] == 2.0
    assert measured["grad_var/reduction_vs_none"] == 1 - measured["grad_var/rloo"] / measured["grad_var/none"]


def test_rloo_bandit_reports_the_measured_and_the_closed_form_reduction() -> None:
    from tests.helpers.cli import flat, invoke

    result = invoke("bandit", "--num-groups", "20000")
    assert result.exit_code == 0, result.output
    rows = {
        int(m[0]): (float(m[1]), float(m[2]))
        for m in re.findall(r"│\s+(\d+) │\s+([\d.]+)% │\s+([\d.]+)% │", result.output)
    }
    assert sorted(rows) == [2, 4, 8, 16]
    theta = torch.tensor([0.5, -0.3, 0.1, 0.8, -1.0], dtype=torch.float64)
    arm_rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.8], dtype=torch.float64)
    for k, (measured, exact) in rows.items():
        closed = 1 - closed_form_variance(theta, arm_rewards, k, "rloo") / closed_form_variance(
            theta, arm_rewards, k, "reinforce"
        )
        assert exact == pytest.approx(100 * closed, abs=0.05)
        assert measured == pytest.approx(exact, abs=2.0)  # 20000 groups: within 2 points
    assert "as the trainer's grad_var/reduction_vs_none" in flat(result.output)


def test_a_resumed_run_measures_the_same_batches_with_the_same_numbers(tmp_path: Path) -> None:
    """Two optimizer steps per generation batch and a measurement every 3 steps: the batches of
    steps (3, 4) and (5, 6) are measured, straight or resumed from checkpoint-4."""
    knobs = {"max_steps": 6, "save_steps": 3, "steps_per_generation": 2, "log_grad_variance": 3}
    straight = trainer(tmp_path / "straight", **knobs)
    straight.train()
    resumed = trainer(tmp_path / "resumed", **knobs)
    resumed.train(resume_from_checkpoint=str(tmp_path / "straight" / "run" / "checkpoint-4"))

    def measured(t: Any) -> dict[float, dict[str, float]]:
        rows = [r for r in t.state.log_history if "grad_var/used" in r]
        return {r["step"]: {k: v for k, v in r.items() if k.startswith("grad_var/")} for r in rows}

    assert sorted(measured(straight)) == [3.0, 4.0, 5.0, 6.0]
    assert measured(resumed) == measured(straight)  # steps 5, 6 measured after the resume; 3, 4 restored


def test_a_parameter_larger_than_a_chunk_is_sketched_in_pieces_of_one_fixed_sketch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rloo.training.monitoring.grad_variance as module

    monkeypatch.setattr(module, "SKETCH_CHUNK", 5)
    x = torch.randn(23, generator=torch.Generator().manual_seed(2))
    columns = torch.stack([count_sketch([e]) for e in torch.eye(23)])
    assert ((columns != 0).sum(dim=1) == 1).all()
    torch.testing.assert_close(count_sketch([x]), x @ columns, rtol=1e-6, atol=1e-6)


def test_sketched_variances_are_close_to_the_exact_ones_on_a_models_gradients() -> None:
    """Full per-completion gradients of the tiny Llama (21k parameters) against their sketches:
    a sketched squared norm errs by about sqrt(2 / 1024) = 4.4% at worst (Gaussian-like), less
    for a sum over groups; measured here: about 1%."""
    from rloo.algo.variance import alternative_advantages
    from rloo.forward.logprobs import completion_logprobs

    tok = make_tokenizer()
    model = make_model(tok).eval()
    gen = torch.Generator().manual_seed(0)
    n, k = 64, 4
    prompts, completions = (
        torch.randint(3, len(tok), (n, 4), generator=gen),
        torch.randint(3, len(tok), (n, 6), generator=gen),
    )
    trainable = list(model.parameters())
    full, sketched = [], []
    for i in range(n):
        logprobs = completion_logprobs(
            model, prompts[i : i + 1], torch.ones(1, 4, dtype=torch.long), completions[i : i + 1], torch.ones(1, 6), 1.0
        ).logprobs
        grads = torch.autograd.grad(logprobs.sum(), trainable)
        full.append(torch.cat([g.reshape(-1) for g in grads]))
        sketched.append(count_sketch(grads))
    group_ids = torch.arange(n) // k
    rewards = torch.rand(n, generator=gen) + 1.0
    for name, advantages in alternative_advantages(rewards, group_ids, torch.ones(n, dtype=torch.bool)).items():
        exact = total_variance(group_estimates(torch.stack(full), advantages, group_ids))
        assert total_variance(group_estimates(torch.stack(sketched), advantages, group_ids)) == pytest.approx(
            exact, rel=0.03
        ), name
