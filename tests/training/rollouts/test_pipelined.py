"""``max_staleness`` (rloo.training.rollouts.source.PipelinedRollouts): each batch sampled by the weights of s
optimizer steps before, exactly; corrected with the importance weights; resumed bit-exactly; s = 0 is the
synchronous loop."""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rloo import RLOOConfig, RLOOTrainer
from rloo.generation.rollout import Rollout
from rloo.pipeline import SampledBatch
from rloo.tiny import build_tiny_llama
from rloo.training.parallel import rollout_worker
from rloo.training.rollouts import versions
from rloo.training.rollouts import workers as worker_rollouts
from rloo.training.rollouts.source import PipelinedRollouts, SynchronousRollouts
from rloo.training.rollouts.versions import trainable_weights
from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer, next_train_batch, params, trainer


def run(tmp_path: Path, **overrides: Any) -> Any:
    values = {"max_steps": 4, "lr_scheduler_type": "constant", "save_steps": 2, "report_to": [], **overrides}
    return trainer(tmp_path, **values)


def test_zero_staleness_is_the_synchronous_loop(tmp_path: Path) -> None:
    assert type(run(tmp_path / "a", max_staleness=0).rollouts) is SynchronousRollouts


def test_each_batch_is_sampled_by_the_weights_of_s_steps_before(tmp_path: Path) -> None:
    """The weights the sampler holds when it samples the batch of step t are the policy's after step t - 2."""
    t = run(tmp_path, max_staleness=2, max_steps=5)
    seen: dict[int, dict[str, torch.Tensor]] = {}
    after: dict[int, dict[str, torch.Tensor]] = {0: trainable_weights(t.unwrapped_model)}
    original = t.rollouts.generate

    def recording(rows: Any, groups: Any, model: Any = None, **more: Any) -> Any:
        seen[t.state.global_step] = {name: p.detach().clone() for name, p in model.named_parameters()}
        return original(rows, groups, model=model, **more)

    t.rollouts.generate = recording
    step_callback = t.rollouts.policy_updated

    def updated(version: int) -> None:
        after[version] = trainable_weights(t.unwrapped_model)
        step_callback(version)

    t.rollouts.policy_updated = updated
    t.train()
    assert sorted(seen) == [0, 1, 2, 3, 4]
    for step, weights in seen.items():
        expected = after[max(0, step - 2)]
        assert all(torch.equal(weights[name], expected[name]) for name in expected), step
    assert not torch.equal(seen[4]["model.embed_tokens.weight"], after[4]["model.embed_tokens.weight"])
    logged = [row for row in t.state.log_history if "staleness" in row]
    assert [row["staleness"] for row in logged] == [0.0, 1.0, 2.0, 2.0, 2.0]
    assert [row["policy_version"] for row in logged] == [0.0, 0.0, 0.0, 1.0, 2.0]


def test_the_lag_is_corrected_and_measured(tmp_path: Path) -> None:
    t = run(tmp_path, max_staleness=1, vllm_importance_sampling_mode="token_truncate", learning_rate=0.05)
    t.train()
    logged = [row for row in t.state.log_history if "staleness" in row]
    assert "sampling/importance_sampling_ratio/mean" in logged[0]
    assert logged[0]["sampling/sampling_logp_difference/max"] < 1e-4  # step 0: the same weights
    assert logged[-1]["sampling/sampling_logp_difference/mean"] > 1e-3  # one step behind: a measurable lag
    assert logged[-1]["sampling/importance_sampling_ratio/max"] != pytest.approx(1.0)


def test_without_the_correction_the_batch_is_still_sampled_stale(tmp_path: Path) -> None:
    t = run(tmp_path, max_staleness=1, vllm_importance_sampling_correction=False)
    t.train()
    logged = [row for row in t.state.log_history if "staleness" in row]
    assert logged[-1]["staleness"] == 1.0 and "sampling/importance_sampling_ratio/mean" not in logged[-1]


def test_a_resumed_pipeline_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    """The checkpoint at step 2 holds the weights of steps 0 and 1, which the batches of steps 2 and 3 sample with."""
    straight = run(tmp_path / "straight", max_staleness=2)
    straight.train()
    run(tmp_path / "resumed", max_staleness=2, max_steps=2).train()
    resumed = run(tmp_path / "resumed", max_staleness=2)
    resumed.train(resume_from_checkpoint=True)
    a, b = params(straight.unwrapped_model), params(resumed.unwrapped_model)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_pipeline_keeps_only_the_versions_it_still_samples_with() -> None:
    model = make_model(make_tokenizer())
    source = PipelinedRollouts(
        policy=lambda: model, staleness=2, prompts=None, generate=None, ranks=None, prompts_per_batch=1
    )
    for version in range(5):
        source.policy_updated(version)
    assert sorted(source.versions) == [2, 3, 4] and sorted(source.state()) == ["2", "3"]
    with pytest.raises(RuntimeError, match=r"the weights of step 0 are gone \(kept: \[2, 3, 4\]\)"):
        source.policy_version = 2
        source.sampling_weights()


def test_a_stale_first_batch_trains_like_the_synchronous_one(tmp_path: Path) -> None:
    """Before any step every version is the initial weights: the first batch of a pipeline is the synchronous one."""
    sync = next_train_batch(run(tmp_path / "a"))
    stale = next_train_batch(run(tmp_path / "b", max_staleness=3))
    assert torch.equal(sync.rollout.completion_ids, stale.rollout.completion_ids)
    assert torch.equal(sync.advantages, stale.advantages)


def test_staleness_is_refused_under_fsdp_and_with_vllm(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_staleness=2 is invalid: with use_vllm is not built yet"):
        RLOOConfig(output_dir=str(tmp_path), max_staleness=2, use_vllm=True)


# ------------------------------------------------------------------ a rollout worker process (rollout_workers 1)
@pytest.mark.system
def test_worker_processes_sample_what_the_trainers_process_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same prompts, groups, seeds and weight versions: two workers' shares, put back together, train to the
    same weights as the in-process pipeline's (float rounding of one thread against two aside: a tolerance).
    Each version is flattened for sending once, whatever the number of workers."""
    inline = run(tmp_path / "inline", max_staleness=1)
    inline.train()
    flattened: list[int] = []
    real_flatten = worker_rollouts.flatten
    monkeypatch.setattr(worker_rollouts, "flatten", lambda w: flattened.append(1) or real_flatten(w))
    worker = run(tmp_path / "worker", max_staleness=1, rollout_workers=2)
    worker.train()
    assert len(flattened) == 5  # versions 0-4 (the last for batch 5, asked for after the last step), not 10
    assert len(worker.rollouts.workers) == 2
    assert not any(w.process.is_alive() for w in worker.rollouts.workers)  # closed at the end of train()
    a, b = params(inline.unwrapped_model), params(worker.unwrapped_model)
    assert all(torch.allclose(a[name], b[name], atol=1e-5) for name in a)
    logged = [row["staleness"] for row in worker.state.log_history if "staleness" in row]
    assert logged == [0.0, 1.0, 1.0, 1.0]


@pytest.mark.system
def test_a_resumed_worker_run_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    """The checkpoint keeps the batches asked of the worker and not yet trained; the resumed run asks again."""
    straight = run(tmp_path / "straight", max_staleness=2, rollout_workers=1)
    straight.train()
    run(tmp_path / "resumed", max_staleness=2, rollout_workers=1, max_steps=2).train()
    resumed = run(tmp_path / "resumed", max_staleness=2, rollout_workers=1)
    resumed.train(resume_from_checkpoint=True)
    a, b = params(straight.unwrapped_model), params(resumed.unwrapped_model)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_shares_and_merging_hand_example() -> None:
    """5 prompts over 2 workers: 3 and 2; 1 prompt over 2: one share. Rollouts of different widths concatenate
    with prompts left-padded and completions right-padded (masked), rows in order."""
    assert worker_rollouts.shares(5, 2) == [slice(0, 3), slice(3, 5)] and worker_rollouts.shares(1, 2) == [slice(0, 1)]
    first = Rollout(
        torch.tensor([[7, 8]]), torch.tensor([[1, 1]]), torch.tensor([[5]]), torch.tensor([[1.0]]),
        torch.tensor([True]), torch.tensor([[-0.5]]), torch.tensor([0]),
    )  # fmt: skip
    second = Rollout(
        torch.tensor([[9]]), torch.tensor([[1]]), torch.tensor([[4, 3]]), torch.tensor([[1.0, 1.0]]),
        torch.tensor([False]), torch.tensor([[-0.25, -0.125]]), torch.tensor([1]),
    )  # fmt: skip
    merged = worker_rollouts.merge_sampled([SampledBatch(first, 1), SampledBatch(second, 0)], pad_token_id=0)
    r = merged.rollout
    assert r.prompt_ids.tolist() == [[7, 8], [0, 9]] and r.prompt_mask.tolist() == [[1, 1], [0, 1]]
    assert r.completion_ids.tolist() == [[5, 0], [4, 3]] and r.completion_mask.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    assert r.sampling_logprobs.tolist() == [[-0.5, 0.0], [-0.25, -0.125]] and r.group_ids.tolist() == [0, 1]
    assert r.truncated.tolist() == [True, False] and merged.num_truncated_prompts == 1


def kill_worker_at(t: Any, steps: set[int]) -> None:
    """Kill ``t``'s rollout worker once at each optimizer step of ``steps``, right after it is asked for batches."""
    real = t.rollouts.request_through

    def kill_then_request(last: int) -> None:
        real(last)
        if t.state.global_step in steps:
            steps.discard(t.state.global_step)
            t.rollouts.worker.process.kill()

    t.rollouts.request_through = kill_then_request


@pytest.mark.system
def test_a_worker_that_dies_is_replaced_and_samples_the_same_batches(tmp_path: Path) -> None:
    """A new worker is sent the versions still in use and asked for the same batches (seeded per group): the
    run trains to exactly the weights of a run whose worker never died, and logs the restart. Every batch logs
    the trainer's wait, the worker's idle time, the queue depth (batches t..t+s asked for) and the probe's gap
    after the weight sync (float rounding: the sync is right)."""
    straight = run(tmp_path / "straight", max_staleness=1, rollout_workers=1)
    straight.train()
    killed = run(tmp_path / "killed", max_staleness=1, rollout_workers=1)
    kill_worker_at(killed, {1})
    with pytest.warns(
        UserWarning, match=r"the rollout worker \(pid \d+\) was killed by SIGKILL .* starting a new worker"
    ):
        killed.train()
    a, b = params(straight.unwrapped_model), params(killed.unwrapped_model)
    assert all(torch.equal(a[name], b[name]) for name in a)
    restarts = [row["async/worker_restarts"] for row in killed.state.log_history if "async/worker_restarts" in row]
    # the batch already written when the worker was killed may still be read: the death shows at step 1 or 2
    assert restarts in ([0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0])
    logged = [row for row in straight.state.log_history if "async/queue_depth" in row]
    assert len(logged) == 4 and all(row["async/queue_depth"] == 2.0 for row in logged)
    assert all(row["async/trainer_wait_seconds"] >= 0 and row["async/worker_idle_seconds"] >= 0 for row in logged)
    assert all(0 <= row["async/weight_sync_probe_gap"] < 1e-4 for row in logged)


def vm_size(pid: int) -> int:
    """Bytes of address space the process ``pid`` holds (``VmSize``)."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))


@pytest.mark.system
def test_a_worker_that_runs_out_of_memory_is_replaced_saying_so(tmp_path: Path) -> None:
    """A real out-of-memory in a worker process: after step 1 its address space is capped 24 MB above what it
    holds, so receiving the next weights (a 40 MB buffer: a 10M-parameter model) fails in torch's CPU allocator.
    The worker says so before it ends, the warning names memory (it read "died (exit code 1)" before), and a new
    worker finishes the run."""
    tokenizer = make_tokenizer()
    model = build_tiny_llama(len(tokenizer), hidden_size=1024, num_layers=1, tokenizer=tokenizer)
    t = RLOOTrainer(
        model=model,
        reward_funcs=frac7,
        args=config(tmp_path, max_steps=3, report_to=[], max_staleness=1, rollout_workers=1),
        train_dataset=dataset(),
        processing_class=tokenizer,
    )
    real = t.rollouts.request_through

    def starve_then_request(last: int) -> None:
        if t.state.global_step == 1:
            pid = t.rollouts.worker.process.pid
            cap = vm_size(pid) + (24 << 20)
            resource.prlimit(pid, resource.RLIMIT_AS, (cap, cap))
        real(last)

    t.rollouts.request_through = starve_then_request
    with pytest.warns(
        UserWarning,
        match=r"rollout worker \(pid \d+\) ran out of memory starting up or loading new weights before the batch of "
        r"step 2 \(RuntimeError: .*can't allocate memory.*starting a new worker",
    ):
        t.train()
    assert t.rollouts.restarts == 1 and t.state.global_step == 3


@pytest.mark.system
def test_a_worker_that_hangs_is_killed_and_replaced(tmp_path: Path) -> None:
    """A worker stopped (SIGSTOP: alive, silent) at step 1 beats no more: after heartbeat_stale_after_s the
    trainer kills it and a new one samples the same batches, so the run trains to the weights of a run whose
    worker never stopped."""
    straight = run(tmp_path / "straight", max_staleness=1, rollout_workers=1, max_steps=3)
    straight.train()
    hung = run(tmp_path / "hung", max_staleness=1, rollout_workers=1, max_steps=3, heartbeat_stale_after_s=5.0)
    real = hung.rollouts.request_through

    def stop_then_request(last: int) -> None:
        real(last)
        if hung.state.global_step == 1 and hung.rollouts.worker.process.is_alive():
            os.kill(hung.rollouts.worker.process.pid, signal.SIGSTOP)

    hung.rollouts.request_through = stop_then_request
    with pytest.warns(UserWarning, match=r"gave no sign of life for \d+ s \(heartbeat_stale_after_s=5\) .* hung"):
        hung.train()
    assert hung.rollouts.restarts == 1
    a, b = params(straight.unwrapped_model), params(hung.unwrapped_model)
    assert all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.system
def test_a_worker_that_keeps_dying_stops_the_run_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_rollouts, "MAX_WORKER_RESTARTS", 1)
    t = run(tmp_path, max_staleness=1, rollout_workers=1, max_steps=5)
    kill_worker_at(t, {1, 3})  # the first death shows at step 1 or 2; the second kills its replacement
    with (
        pytest.warns(UserWarning, match="restart 1 of at most 1"),
        pytest.raises(
            RuntimeError, match=r"killed by SIGKILL .* after 1 restarts .* resume it from its last checkpoint"
        ),
    ):
        t.train()


@pytest.mark.system
def test_a_weight_sync_that_loads_other_weights_stops_the_run_naming_the_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weights of step 2 arrive scaled (a sync gone wrong): the worker's probe disagrees with the trainer's."""
    from rloo.training.parallel.rollout_worker import RolloutWorker

    real = RolloutWorker.send_weights

    def corrupting(self: Any, version: int, flat: Any) -> None:
        layout, flats = flat
        real(self, version, (layout, [f * 1.5 for f in flats]) if version == 2 else flat)

    monkeypatch.setattr(RolloutWorker, "send_weights", corrupting)
    t = run(tmp_path, max_staleness=1, rollout_workers=1)
    with pytest.raises(RuntimeError, match=r"weight sync check failed for the weights of step 2: .* nats away"):
        t.train()
    assert t.state.global_step == 3  # the batches of steps 0-2, sampled by versions 0 and 1, trained


@pytest.mark.system
@pytest.mark.usefixtures("fresh_accelerate_state")
def test_the_weight_sync_check_allows_for_mixed_precision(tmp_path: Path) -> None:
    """Under bf16 autocast (accelerate wraps the policy's forward in it) the trainer scores the probe in bf16 and
    the worker's copy in float32: the check takes the half-precision tolerance (a GPU run stopped at step 0 on
    a 0.013-nat gap before), and the gap it logs is that rounding, not a failed sync. The worker's device named
    (one string: a list of one), its weights cross a gloo group, and the time it took is logged."""
    t = run(tmp_path, max_staleness=1, rollout_workers=1, max_steps=2, bf16=True, rollout_worker_devices="cpu")
    t.train()
    gaps = [row["async/weight_sync_probe_gap"] for row in t.state.log_history if "async/weight_sync_probe_gap" in row]
    assert len(gaps) == 2 and all(gap < 0.05 for gap in gaps)
    assert t.args.rollout_worker_devices == ("cpu",) and t.rollouts.worker.backend == "gloo"
    synced = [row["async/weight_sync_seconds"] for row in t.state.log_history if "async/weight_sync_seconds" in row]
    assert len(synced) == 2 and synced[0] > 0 and synced[1] == 0  # batch 1 samples with version 0 too: no sync


def test_weight_sync_steps_sample_with_the_last_synced_weights(tmp_path: Path) -> None:
    """s = 1, weights synced every 2 steps: batch t samples with version 2 x floor((t - 1) / 2), so the versions
    are 0, 0, 0, 2, 2, 4 and the staleness 0, 1, 2, 1, 2, 1; a resumed run equals an uninterrupted one."""
    straight = run(tmp_path / "straight", max_staleness=1, weight_sync_steps=2, max_steps=6)
    straight.train()
    logged = [row for row in straight.state.log_history if "staleness" in row]
    assert [row["policy_version"] for row in logged] == [0.0, 0.0, 0.0, 2.0, 2.0, 4.0]
    assert [row["staleness"] for row in logged] == [0.0, 1.0, 2.0, 1.0, 2.0, 1.0]
    assert sorted(straight.rollouts.versions) == [4, 6]  # what the next batches sample with, and the newest
    run(tmp_path / "resumed", max_staleness=1, weight_sync_steps=2, max_steps=3, save_steps=3).train()
    resumed = run(tmp_path / "resumed", max_staleness=1, weight_sync_steps=2, max_steps=6)
    resumed.train(resume_from_checkpoint=True)
    a, b = params(straight.unwrapped_model), params(resumed.unwrapped_model)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_sampling_versions_hand_example() -> None:
    assert [versions.sampling_version(t, 0) for t in range(4)] == [0, 1, 2, 3]  # the synchronous loop
    assert [versions.sampling_version(t, 2) for t in range(5)] == [0, 0, 0, 1, 2]
    assert [versions.sampling_version(t, 1, 3) for t in range(8)] == [0, 0, 0, 0, 3, 3, 3, 6]


# ------------------------------------------------------------------ free_running
@pytest.mark.system
def test_free_running_loads_the_newest_weights_already_sent_before_each_batch(tmp_path: Path) -> None:
    """Batches 0 and 1 sampled with version 0; then, the worker held (SIGSTOP) while batch 2 is asked, version 1
    sent and batch 3 asked: free-running, batch 2 samples with version 1 (sent after it was asked), otherwise
    with version 0."""
    from rloo.data.prompts import columns_of
    from rloo.training.parallel.rollout_worker import RolloutWorker
    from rloo.training.parallel.weight_sync import flatten, host_store

    t = run(tmp_path, max_staleness=1, rollout_workers=1)
    rows, groups = t.rollouts.draw()
    first = trainable_weights(t.unwrapped_model)
    second = {name: value + 0.01 for name, value in first.items()}
    prompts, columns = [row["prompt"] for row in rows], columns_of(rows)
    versions = {}
    for free in (False, True):
        worker = RolloutWorker(
            t.unwrapped_model, t.rollouts.processing_class, t.rollouts.settings, store=host_store(),
            prefix=f"test/{free}/", free=free,
        )  # fmt: skip
        try:
            worker.send_weights(0, flatten(first))
            found = []
            for step in (0, 1):
                worker.request(step, prompts, columns, groups, 0)
                found.append(worker.receive(step)[0])
            os.kill(worker.process.pid, signal.SIGSTOP)  # all three below wait in its queue
            worker.request(2, prompts, columns, groups, 0)
            worker.send_weights(1, flatten(second))
            worker.request(3, prompts, columns, groups, 0)
            time.sleep(0.5)  # the queue's feeder thread writes them into the pipe
            os.kill(worker.process.pid, signal.SIGCONT)
            versions[free] = found + [worker.receive(step)[0] for step in (2, 3)]
        finally:
            worker.close()
    assert versions == {False: [0, 0, 0, 1], True: [0, 0, 1, 1]}


def test_newest_first_hand_example() -> None:
    pending = [("sample", 2), ("weights", 1, "a"), ("sample", 3), ("weights", 2, "b"), ("stop",)]
    headers, rest = rollout_worker.newest_first(pending)
    assert headers == [("weights", 1, "a"), ("weights", 2, "b")]  # both received in order, the last loaded
    assert rest == [("sample", 2), ("sample", 3), ("stop",)]


def test_free_running_accepts_any_version_within_the_bound() -> None:
    """Step 5, s = 2: the pipeline needs version 3 exactly; free-running takes 3, 4 or 5, never 2 or 6."""
    for version, free, ok in [(3, False, True), (4, False, False), (4, True, True), (5, True, True),
                              (2, True, False), (6, True, False)]:  # fmt: skip
        scored: Any = type("Scored", (), {"policy_version": version})()
        if ok:
            versions.check_policy_version(scored, 5, 2, free=free)
        else:
            with pytest.raises(RuntimeError, match="missed a weight update"):
                versions.check_policy_version(scored, 5, 2, free=free)


@pytest.mark.system
def test_a_free_running_run_keeps_to_the_bound_and_resumes(tmp_path: Path) -> None:
    """Every batch sampled by weights at most s = 2 steps old, before and after a resume (the resumed run's
    first requests are sent its current weights, which its checkpoint holds as the model's)."""
    run(tmp_path, max_staleness=2, rollout_workers=1, free_running=True, max_steps=2).train()
    t = run(tmp_path, max_staleness=2, rollout_workers=1, free_running=True, max_steps=5)
    t.train(resume_from_checkpoint=True)
    logged = [row for row in t.state.log_history if "staleness" in row]
    assert [row["step"] for row in logged] == [1, 2, 3, 4, 5]  # the first two from the checkpoint's history
    assert all(0 <= row["staleness"] <= 2 for row in logged)
