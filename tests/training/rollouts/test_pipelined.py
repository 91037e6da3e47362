"""``max_staleness`` (rloo.training.rollouts.source.PipelinedRollouts): each batch sampled by the weights of s
optimizer steps before, exactly; corrected with the importance weights; resumed bit-exactly; s = 0 is the
synchronous loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from rloo import RLOOConfig
from rloo.training.rollouts.source import PipelinedRollouts, SynchronousRollouts, trainable_weights
from tests.helpers.models import make_model, make_tokenizer, next_train_batch, params, trainer


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
def test_a_worker_process_samples_what_the_trainers_process_would(tmp_path: Path) -> None:
    """The same prompts, groups, seeds and weight versions: the worker's batches train to the same weights as
    the in-process pipeline's (float rounding of one thread against two aside: compared with a tolerance)."""
    inline = run(tmp_path / "inline", max_staleness=1)
    inline.train()
    worker = run(tmp_path / "worker", max_staleness=1, rollout_workers=1)
    worker.train()
    assert not worker.rollouts.worker.process.is_alive()  # closed at the end of train()
    a, b = params(inline.unwrapped_model), params(worker.unwrapped_model)
    assert all(torch.allclose(a[name], b[name], atol=1e-5) for name in a)
    logged = [row["staleness"] for row in worker.state.log_history if "staleness" in row]
    assert logged == [0.0, 1.0, 1.0, 1.0]


def test_a_resumed_worker_run_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    """The checkpoint keeps the batches asked of the worker and not yet trained; the resumed run asks again."""
    straight = run(tmp_path / "straight", max_staleness=2, rollout_workers=1)
    straight.train()
    run(tmp_path / "resumed", max_staleness=2, rollout_workers=1, max_steps=2).train()
    resumed = run(tmp_path / "resumed", max_staleness=2, rollout_workers=1)
    resumed.train(resume_from_checkpoint=True)
    a, b = params(straight.unwrapped_model), params(resumed.unwrapped_model)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_a_worker_that_dies_stops_the_run_naming_it(tmp_path: Path) -> None:
    t = run(tmp_path, max_staleness=1, rollout_workers=1, max_steps=3)
    real = t.rollouts.request_through

    def kill_then_request(last: int) -> None:
        real(last)
        if t.state.global_step == 1:
            t.rollouts.worker.process.kill()

    t.rollouts.request_through = kill_then_request
    with pytest.raises(
        RuntimeError, match=r"the rollout worker \(pid \d+\) died .* resume it from its last checkpoint"
    ):
        t.train()
