"""Dynamic sampling (rloo.training.rollouts.dynamic_sampling): batches of groups with a learning signal, refilled
round by round, counted as generated, resumed exactly. (Two processes against one: tests/training/parallel.)"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rloo.algo.advantages import groups_with_signal
from rloo.data.prompt_order import IndexedRows
from rloo.pipeline import ScoredRollout
from rloo.report import metric_names as names
from rloo.training.parallel.distributed import Ranks
from rloo.training.rollouts.dynamic_sampling import DynamicSampling
from rloo.training.rollouts.groups import join, to_device
from rloo.training.rollouts.source import SynchronousRollouts
from tests.helpers.models import always_one, dataset, frac7_when_odd, make_tokenizer, params, trainer
from tests.helpers.scored import PAD, batch

K = 2


def source(
    with_signal: set[int],
    max_rounds: int,
    prompts_per_batch: int = 4,
    ranks: Ranks | None = None,
    device: str = "cpu",
) -> DynamicSampling:
    """Dynamic sampling over a source whose group g's two rewards differ (0, 1) iff g is in ``with_signal``; its
    batches on ``device`` but for the reward scores, which stay on the CPU (as the pipeline keeps them)."""

    def generate(rows: list[dict[str, Any]], groups: list[int], model: Any = None) -> ScoredRollout:
        rewards = torch.tensor([[0.0, 1.0] if g in with_signal else [1.0, 1.0] for g in groups]).flatten()
        # batches padded to different widths (the same completions): joins pad
        scored = batch(groups[0], len(groups), K, prompt_width=1, completion_width=2 + groups[0] % 3, rewards=rewards)
        moved = to_device(scored, torch.device(device))
        return replace(moved, rewards=replace(moved.rewards, scores=scored.rewards.scores))

    prompts = IndexedRows(dataset(40), seed=0, shuffle=False)
    drawn = SynchronousRollouts(
        prompts=prompts, generate=generate, ranks=ranks or Ranks(), prompts_per_batch=prompts_per_batch
    )
    return DynamicSampling(drawn, signal=signal, max_rounds=max_rounds, pad_token_id=PAD)


def signal(scored: ScoredRollout) -> torch.Tensor:
    return groups_with_signal(scored.rewards.rewards, scored.rollout.group_ids, scored.rewards.scorable)


def test_rounds_until_the_batch_is_full_of_groups_with_a_signal() -> None:
    dynamic = source(with_signal={1, 3, 4, 6, 7, 9}, max_rounds=5)
    first = dynamic.next_batch()
    # round 1 (groups 0-3) has 1 and 3, round 2 (4-7) has 4, 6 and 7: the batch is 1, 3, 4, 6; 7 is dropped
    assert first.rollout.group_ids.tolist() == [1, 1, 3, 3, 4, 4, 6, 6]
    assert first.prompts == ["prompt 1", "prompt 3", "prompt 4", "prompt 6"]
    assert first.rewards.rewards.tolist() == [0.0, 1.0] * 4
    assert dynamic.groups_drawn == 8  # the prompt order moved past both rounds
    assert first.sampling_metrics == {
        names.GEN_BATCHES: 2.0,
        names.GENERATED_COMPLETIONS: 16.0,
        names.KEPT_GROUPS: 4.0,
        names.FILLED_GROUPS: 0.0,
        names.GENERATED_REWARD: 11 / 16,  # 5 groups with rewards (0, 1), 3 with (1, 1)
        names.GENERATED_ZERO_STD: 3 / 8,
    }
    # both rounds: 8 one-token prompts and completions of 1, 2, 1, 2, ... tokens each
    assert first.generated_tokens == 2 * (8 + 12)
    second = dynamic.next_batch()  # the limit is per batch: 5 rounds (groups 8-27), of which only 9 has a signal
    assert second.rollout.group_ids.tolist() == [8, 8, 9, 9, 10, 10, 11, 11]
    assert second.sampling_metrics[names.GEN_BATCHES] == 5.0 and dynamic.groups_drawn == 28
    assert second.sampling_metrics[names.KEPT_GROUPS] == 1.0 and second.sampling_metrics[names.FILLED_GROUPS] == 3.0


def test_the_round_limit_fills_the_batch_with_the_earliest_groups_without_a_signal() -> None:
    dynamic = source(with_signal={6}, max_rounds=2)
    filled = dynamic.next_batch()
    assert filled.rollout.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 6, 6]  # draw order: 6 and the first three
    assert filled.sampling_metrics[names.GEN_BATCHES] == 2.0  # the limit
    assert filled.sampling_metrics[names.KEPT_GROUPS] == 1.0 and filled.sampling_metrics[names.FILLED_GROUPS] == 3.0
    assert dynamic.groups_drawn == 8
    # every per-batch count is of both rounds (each round's batch reports nonfinite_counts = its first group id)
    assert filled.rewards.scores.nonfinite_counts == [0 + 4] and filled.num_truncated_prompts == 4
    assert filled.generate_seconds == 2.0


def test_one_round_is_the_batch_as_drawn() -> None:
    dynamic = source(with_signal={2}, max_rounds=1)
    drawn = dynamic.next_batch()
    assert drawn.rollout.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3] and dynamic.groups_drawn == 4


class ThreadRanks(Ranks):
    """Rank ``rank`` of processes simulated by threads: ``gather_objects`` meets the others at a barrier
    (the exchange logic without torch.distributed; real processes: tests/training/parallel)."""

    def __init__(self, rank: int, hub: Any) -> None:
        super().__init__(rank, len(hub.values))
        self.hub = hub

    def gather_objects(self, value: Any) -> list[Any]:
        self.hub.values[self.rank] = value
        self.hub.barrier.wait()
        gathered = list(self.hub.values)
        self.hub.barrier.wait()  # every rank has read before the next gather writes
        return gathered


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_two_ranks_train_the_groups_one_process_trains_each_its_share(device: str) -> None:
    with_signal = {2, 3, 5, 8, 9, 12}  # round 1 (0-3): 2, 3; round 2 (4-7): 5; round 3 (8-11): 8, 9: 2, 3, 5, 8
    one = source(with_signal, max_rounds=5, device=device).next_batch()
    hub = SimpleNamespace(values=[None, None], barrier=threading.Barrier(2, timeout=30))
    shares: list[ScoredRollout | None] = [None, None]

    def rank(r: int) -> None:
        shares[r] = source(with_signal, 5, prompts_per_batch=2, ranks=ThreadRanks(r, hub), device=device).next_batch()

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    first, second = shares
    assert first is not None and second is not None
    # rank 0 sampled groups 0-1, 4-5, 8-9 and rank 1 2-3, 6-7, 10-11: each trains groups the other sampled
    assert first.rollout.group_ids.tolist() == [2, 2, 3, 3] and second.rollout.group_ids.tolist() == [5, 5, 8, 8]
    together = join([first, second], PAD)
    assert torch.equal(together.rollout.completion_ids.cpu(), one.rollout.completion_ids.cpu())
    assert torch.equal(together.rollout.completion_mask.cpu(), one.rollout.completion_mask.cpu())
    assert together.completion_texts == one.completion_texts and together.prompts == one.prompts
    assert first.rollout.completion_ids.device.type == device and first.rewards.rewards.device.type == device
    assert first.sampling_metrics == second.sampling_metrics == one.sampling_metrics


# ---------------------------------------------------------------------------- tiny-model runs
def train_rows(run: Any) -> list[dict[str, float]]:
    return [row for row in run.state.log_history if "reward" in row]


def test_a_run_refills_trains_only_groups_with_a_signal_and_counts_what_it_generated(tmp_path: Path) -> None:
    tokenizer, seen = make_tokenizer(), {"completions": 0, "tokens": 0}

    def counting(prompts: list[str], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        seen["completions"] += len(completion_ids)
        seen["tokens"] += sum(len(ids) for ids in completion_ids)
        seen["tokens"] += sum(len(tokenizer(prompt)["input_ids"]) for prompt in prompts)
        return frac7_when_odd(prompts, completion_ids)

    run = trainer(tmp_path, reward_funcs=counting, dynamic_sampling=True, max_steps=3, max_num_gen_batches=4)
    run.train()
    rows = train_rows(run)
    assert len(rows) == 3 and any(row[names.GEN_BATCHES] > 1 for row in rows)  # it refilled
    for row in rows:  # every trained group has a signal, or the limit was hit and filling counted
        assert row[names.KEPT_GROUPS] + row[names.FILLED_GROUPS] == 2.0  # 2 prompts x K=4 per batch
        assert row[names.FRAC_TASK_REWARD_ZERO_STD] == row[names.FILLED_GROUPS] / 2
    generated = sum(row[names.GENERATED_COMPLETIONS] for row in rows)
    assert generated == seen["completions"] == 4 * run.state.num_groups_seen > 3 * 8
    assert run.state.num_input_tokens_seen == seen["tokens"]  # every round's prompt and completion tokens
    assert run.state.epoch == run.state.num_groups_seen / 40  # the prompt order counts every drawn prompt


def test_one_round_trains_exactly_as_without_dynamic_sampling(tmp_path: Path) -> None:
    plain = trainer(tmp_path / "plain", reward_funcs=frac7_when_odd)
    plain.train()
    dynamic = trainer(tmp_path / "one", reward_funcs=frac7_when_odd, dynamic_sampling=True, max_num_gen_batches=1)
    dynamic.train()
    a, b = params(plain.unwrapped_model), params(dynamic.unwrapped_model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [row["loss"] for row in train_rows(plain)] == [row["loss"] for row in train_rows(dynamic)]
    assert dynamic.state.num_groups_seen == plain.state.num_groups_seen == 4


def test_the_round_limit_fills_the_batch_warns_and_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = trainer(tmp_path, reward_funcs=always_one, dynamic_sampling=True, max_steps=2, max_num_gen_batches=3)
    run.train()
    assert (
        "completions per generation (dynamic sampling: groups with a signal, up to 3 rounds)" in capsys.readouterr().err
    )
    assert [row[names.GEN_BATCHES] for row in train_rows(run)] == [3.0, 3.0]
    assert [row[names.FILLED_GROUPS] for row in train_rows(run)] == [2.0, 2.0]
    assert run.state.num_groups_seen == 2 * 3 * 2 and run.state.global_step == 2
    warnings = (tmp_path / "run" / "warnings.log").read_text()
    assert warnings.count("max_num_gen_batches generation rounds found fewer groups with a learning signal") == 1


def test_a_resumed_run_draws_and_trains_as_the_uninterrupted_one(tmp_path: Path) -> None:
    common: dict[str, Any] = {"reward_funcs": frac7_when_odd, "dynamic_sampling": True, "max_steps": 4, "save_steps": 2}
    straight = trainer(tmp_path / "straight", **common)
    straight.train()
    resumed = trainer(tmp_path / "resumed", **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "straight" / "run" / "checkpoint-2"))
    a, b = params(straight.unwrapped_model), params(resumed.unwrapped_model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.state.num_groups_seen == straight.state.num_groups_seen
    assert resumed.state.num_input_tokens_seen == straight.state.num_input_tokens_seen

    def dynamic_metrics(run: str) -> list[dict[str, float]]:
        rows = [json.loads(line) for line in (tmp_path / run / "run" / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if k.startswith("dynamic_sampling/")} for row in rows if "loss" in row]

    assert dynamic_metrics("resumed")[-2:] == dynamic_metrics("straight")[-2:]
    assert sum(row[names.GEN_BATCHES] for row in dynamic_metrics("straight")) > 4  # it refilled


def test_with_older_weights_every_round_samples_with_the_batchs_version(tmp_path: Path) -> None:
    run = trainer(tmp_path, reward_funcs=frac7_when_odd, dynamic_sampling=True, max_staleness=1, max_steps=3)
    run.train()  # the policy version of every round is checked against max(0, step - 1)
    assert [row[names.POLICY_VERSION] for row in train_rows(run)] == [0.0, 0.0, 1.0]
