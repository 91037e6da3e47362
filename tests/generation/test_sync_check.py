"""The one weight-sync check (rloo.generation.sync_check) and the tolerances its two callers name."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rloo.generation.sync_check import ProbeTolerance, check_weight_sync, probe_logprobs
from rloo.generation.vllm import sampler as vllm_sampler
from rloo.training.parallel import rollout_worker

REFUSAL = "off by {gap:.3g} nats (tolerance {tolerance:g}): resync"


def test_the_gap_is_the_largest_difference_and_beyond_the_tolerance_the_run_stops() -> None:
    ours, theirs = torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-1.0, -2.5, -2.9])
    assert check_weight_sync(ours, theirs, 0.5, REFUSAL) == pytest.approx(0.5)
    with pytest.raises(RuntimeError, match=r"^off by 0\.5 nats \(tolerance 0\.1\): resync$"):
        check_weight_sync(ours, theirs, 0.1, REFUSAL)
    with pytest.raises(RuntimeError, match="off by nan nats"):  # a NaN probe is no agreement
        check_weight_sync(ours, torch.tensor([float("nan"), -2.0, -3.0]), 0.5, REFUSAL)


def test_each_engine_names_its_tolerance() -> None:
    vllm, worker = vllm_sampler.PROBE_TOLERANCE, rollout_worker.PROBE_TOLERANCE
    assert vllm == ProbeTolerance(full=0.02, half=0.1)  # another engine's kernels
    assert worker == ProbeTolerance(full=1e-3, half=0.05)  # the same forward on another device or thread count
    assert [rollout_worker.PROBE_TOLERANCE.at(half) for half in (False, True)] == [1e-3, 0.05]


def test_the_probe_scores_the_tokens_after_start(peaked_model: Any) -> None:
    ids = torch.tensor([3, 5, 7, 11, 13])
    logits = peaked_model(input_ids=ids[None]).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(1, 4), ids[2:]]
    scored = probe_logprobs(peaked_model, ids, 2)
    assert scored.shape == (3,) and scored.device.type == "cpu" and not scored.requires_grad
    torch.testing.assert_close(scored, expected.detach(), rtol=0, atol=1e-6)
