"""Our math core reproduces TRL's RLOOTrainer default math exactly (1.13 and 1.16, identical here).

The reference below is transcribed from TRL's ``_generate_and_score_completions`` and
``_compute_loss`` (rewards -> KL penalty -> leave-one-out baseline -> sequence-level
clipped loss); see the TRL source, ``trl/trainer/rloo_trainer.py``. Since trl#5902 a completion
every reward function returned None for is unscorable there too: NaN in the rewards, left out of
the baseline and of the normalization, advantage 0 (read in the 1.13.0 and 1.16.0 wheels).
"""

from __future__ import annotations

import pytest
import torch

from rloo.algo.advantages import clip_rewards, combine_rewards, get_advantage_estimator, normalize_advantages
from rloo.algo.kl import kl_k1, kl_penalized_rewards
from rloo.algo.losses import aggregate_loss, sequence_level_loss

N, G, T, F = 8, 4, 5, 2
BETA = 0.05
REWARD_WEIGHTS = [1.0, 0.5]
CLIP_RANGE = (-1.0, 1.5)


def trl_reference(
    rewards_per_func: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    ref_per_token_logps: torch.Tensor,
    per_token_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    normalize: bool,
    epsilon: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's math, as in the trainer (variable names kept). Returns (advantages, loss)."""
    reward_weights = torch.tensor(REWARD_WEIGHTS, dtype=rewards_per_func.dtype)
    num_generations = G
    epsilon_low = epsilon
    # _generate_and_score_completions
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * reward_weights.unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    rewards = rewards.clamp(min=CLIP_RANGE[0], max=CLIP_RANGE[1])
    per_token_kl = old_per_token_logps - ref_per_token_logps
    kl = (per_token_kl * completion_mask).sum(-1)
    rewards = rewards - BETA * kl
    grouped_rewards = rewards.view(-1, num_generations)
    scorable_counts = (~torch.isnan(grouped_rewards)).sum(dim=1, keepdim=True)
    grouped_sum = torch.nansum(grouped_rewards, dim=1, keepdim=True)
    baselines = (grouped_sum - grouped_rewards) / (scorable_counts - 1)
    baselines = baselines.view(-1)
    advantages = rewards - baselines
    if normalize:
        advantages = (advantages - torch.nanmean(advantages)) / (nanstd(advantages) + 1e-4)
    advantages = torch.nan_to_num(advantages, nan=0.0)
    # _compute_loss
    logps = (per_token_logps * completion_mask).sum(1)
    old_logps = (old_per_token_logps * completion_mask).sum(1)
    log_ratio = logps - old_logps
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_sequence_loss1 = coef_1 * advantages
    per_sequence_loss2 = coef_2 * advantages
    per_sequence_loss = -torch.min(per_sequence_loss1, per_sequence_loss2)
    loss = per_sequence_loss.mean()
    return advantages, loss


def nanstd(tensor: torch.Tensor) -> torch.Tensor:
    """TRL's ``trl.trainer.utils.nanstd`` over every dimension: the sample std of the non-NaN values."""
    mean = torch.nanmean(tensor, dim=None, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=None, keepdim=True)
    # TRL divides the integer counts, which gives torch's default float32; in the tensor's dtype here,
    # so the float64 comparison is not limited by a float32 Bessel factor
    count = torch.sum(~torch.isnan(tensor), dim=None, keepdim=True).to(tensor.dtype)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    return torch.sqrt(variance * correction)


def ours(
    rewards_per_func: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    ref_per_token_logps: torch.Tensor,
    per_token_logps: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    normalize: bool,
    epsilon: float,
    epsilon_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    weights = torch.tensor(REWARD_WEIGHTS, dtype=rewards_per_func.dtype)
    rewards, scorable = combine_rewards(rewards_per_func, weights)
    rewards = clip_rewards(rewards, CLIP_RANGE)
    rewards = kl_penalized_rewards(rewards, kl_k1(old_per_token_logps, ref_per_token_logps), completion_mask, BETA)
    group_ids = torch.arange(N // G).repeat_interleave(G)
    advantages = get_advantage_estimator("rloo")(rewards, group_ids, scorable)
    if normalize:
        advantages = normalize_advantages(advantages, scorable)
    out = sequence_level_loss(per_token_logps, old_per_token_logps, advantages, completion_mask, epsilon, epsilon_high)
    loss = aggregate_loss(out.sequence_loss, completion_mask, "seq_mean_token_sum")
    return advantages, loss


def make_inputs(seed: int, off_policy: bool, unscorable: tuple[int, ...] = ()) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    rewards_per_func = torch.randn(N, F, generator=gen, dtype=torch.float64) * 1.5
    rewards_per_func[1, 0] = float("nan")  # one function returned None: still scorable
    rewards_per_func[6, 1] = float("nan")
    rewards_per_func[list(unscorable)] = float("nan")  # every function returned None: unscorable
    old = -torch.rand(N, T, generator=gen, dtype=torch.float64) * 2.0
    ref = old + torch.randn(N, T, generator=gen, dtype=torch.float64) * 0.2
    # off policy (num_iterations > 1): the policy moved since the completions were sampled
    noise = torch.randn(N, T, generator=gen, dtype=torch.float64) * 0.15
    logps = old + noise if off_policy else old.clone()
    lengths = torch.tensor([5, 3, 1, 5, 2, 4, 5, 3])
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.float64)
    # Padding holds junk (as a real forward pass would); the mask must remove it.
    old = torch.where(mask.bool(), old, -7.0)
    logps = torch.where(mask.bool(), logps, -3.0)
    return {"rewards_per_func": rewards_per_func, "old": old, "ref": ref, "logps": logps, "mask": mask}


# partly unscorable batches: row 2 of the first group, rows 4 and 5 of the second (two scorable left);
# then row 7 too, which leaves the second group a single scorable member (no baseline: advantage 0)
PARTLY_UNSCORABLE = (2, 4, 5)
SINGLETON = (2, 4, 5, 7)
CASES = {"scorable": (), "one": (2,), "partly": PARTLY_UNSCORABLE, "singleton": SINGLETON}


@pytest.mark.parametrize("unscorable", list(CASES.values()), ids=list(CASES))
@pytest.mark.parametrize("epsilon_high", [0.2, 0.28])
@pytest.mark.parametrize("off_policy", [False, True])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_trl(
    seed: int, normalize: bool, off_policy: bool, epsilon_high: float, unscorable: tuple[int, ...]
) -> None:
    if normalize and unscorable == SINGLETON:
        pytest.skip("a departure: test_a_singletons_zero_advantage_counts_in_the_normalization")
    x = make_inputs(seed, off_policy, unscorable)
    results = []
    for fn in (trl_reference, ours):
        logps = x["logps"].clone().requires_grad_(True)
        advantages, loss = fn(
            x["rewards_per_func"], x["old"], x["ref"], logps, x["mask"],
            normalize=normalize, epsilon=0.2, epsilon_high=epsilon_high,
        )  # fmt: skip
        loss.backward()
        results.append((advantages.detach(), loss.detach(), logps.grad))
    (adv_trl, loss_trl, grad_trl), (adv_ours, loss_ours, grad_ours) = results
    assert grad_trl is not None and grad_ours is not None
    torch.testing.assert_close(adv_ours, adv_trl, atol=1e-9, rtol=0)
    torch.testing.assert_close(loss_ours, loss_trl, atol=1e-6, rtol=0)
    torch.testing.assert_close(grad_ours, grad_trl, atol=1e-6, rtol=0)
    assert grad_trl.abs().sum() > 0
    if off_policy:
        # The comparison covers the clipped case: some sequences lie outside the clip range
        # with the sign that zeroes their gradient, and some do not.
        ratio = torch.exp(((x["logps"] - x["old"]) * x["mask"]).sum(1))
        clipped = ((ratio > 1 + epsilon_high) & (adv_trl > 0)) | ((ratio < 0.8) & (adv_trl < 0))
        assert 0 < int(clipped.sum()) < N
        assert (grad_trl[clipped] == 0).all()


def test_epsilon_high_matters() -> None:
    # Guard against a vacuous comparison: with seed 0, completion 6 has rho = 1.228 and A > 0,
    # clipped by epsilon_high = 0.2 but not by 0.28, so the two runs differ there.
    x = make_inputs(0, off_policy=True)
    grads = []
    for epsilon_high in (0.2, 0.28):
        logps = x["logps"].clone().requires_grad_(True)
        _, loss = ours(
            x["rewards_per_func"], x["old"], x["ref"], logps, x["mask"],
            normalize=False, epsilon=0.2, epsilon_high=epsilon_high,
        )  # fmt: skip
        loss.backward()
        grads.append(logps.grad)
    assert grads[0] is not None and grads[1] is not None
    assert (grads[0][6] == 0).all() and (grads[1][6] != 0).all()
    torch.testing.assert_close(grads[0][:6], grads[1][:6], atol=0, rtol=0)


def test_a_singletons_zero_advantage_counts_in_the_normalization() -> None:
    """The one departure on partly unscorable batches: a completion whose group has no other scorable
    member gets advantage 0 in both, and with ``normalize_advantages`` rloo counts that 0 in the batch
    statistics (it is scorable) where TRL leaves it out (its 0/0 is NaN until after normalizing)."""
    x = make_inputs(0, off_policy=False, unscorable=SINGLETON)
    args = (x["rewards_per_func"], x["old"], x["ref"], x["logps"], x["mask"])
    kwargs = {"normalize": True, "epsilon": 0.2, "epsilon_high": 0.2}
    adv_trl, _ = trl_reference(*args, **kwargs)
    adv_ours, _ = ours(*args, **kwargs)
    raw, _ = ours(*args, normalize=False, epsilon=0.2, epsilon_high=0.2)
    assert raw[6] == 0.0 and adv_trl[6] == 0.0  # the singleton, before normalizing in both
    scored, with_singleton = [0, 1, 3], [0, 1, 3, 6]
    stats = raw[with_singleton]
    expected_ours = (raw[with_singleton] - stats.mean()) / (stats.std() + 1e-4)
    expected_trl = (raw[scored] - raw[scored].mean()) / (raw[scored].std() + 1e-4)
    torch.testing.assert_close(adv_ours[with_singleton], expected_ours, atol=1e-9, rtol=0)
    torch.testing.assert_close(adv_trl[scored], expected_trl, atol=1e-9, rtol=0)
    assert (adv_ours[scored] - adv_trl[scored]).abs().max() > 1e-3  # a real difference, not rounding
