"""The performance guard: counts that do not depend on the machine's speed (forwards, rows and tokens per
phase, the layouts' FLOPs, aten ops and host syncs, peak tensor bytes; ``benchmarks/perf_counts.py``)
against the committed baseline ``tests/perf_baseline.json``.

A count more than 5% above its baseline fails, naming the case and the count; one more than 5% below
asks (a warning) for a new baseline. A change that raises a count on purpose rewrites the baseline with
``make perf-baseline``, and the diff shows in review."""

from __future__ import annotations

import dataclasses
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import perf_counts  # noqa: E402

import rloo.generation.shared_prefix as shared_prefix  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CASES = {case.name: case for case in perf_counts.CASES}
COUNTS_PER_STEP = ("ops_per_step", "non_view_ops_per_step", "syncs_per_step")


@pytest.fixture(scope="module")
def collected() -> dict[str, Any]:
    return perf_counts.collect()


def test_no_count_rose_more_than_5_percent_over_the_baseline(collected: dict[str, Any]) -> None:
    baseline = perf_counts.read_baseline()
    pinned = {key: value for key, value in baseline["settings"].items() if key not in ("torch", "transformers")}
    assert pinned.items() <= collected["settings"].items(), "the guard's pinned settings changed: make perf-baseline"
    rises, falls = perf_counts.compare(baseline["counts"], collected["counts"])
    if falls:
        note = "counts fell more than 5%: rewrite the baseline (make perf-baseline) to hold the gain:\n"
        warnings.warn(note + "\n".join(falls), stacklevel=1)
    versions = f"(baseline torch {baseline['settings']['torch']}, transformers {baseline['settings']['transformers']})"
    assert not rises, f"counts rose more than 5% over tests/perf_baseline.json {versions}:\n" + "\n".join(rises)


def test_the_cases_run_both_layouts_the_reference_and_the_old_log_prob_pass(collected: dict[str, Any]) -> None:
    layouts = {layout for case in collected["info"].values() for phase in case["layouts"].values() for layout in phase}
    assert {"packed", "shared"} <= layouts
    counts = collected["counts"]
    assert all(case["logprobs/reference_forwards"] > 0 for case in counts.values())
    # num_iterations=2: 2 batches x 2 optimizer steps x 1 packed pass
    assert CASES["varied"].num_iterations == 2 and counts["varied"]["update/forwards"] == 2 * 2 * 1
    assert counts["varied"]["sampling/real_tokens"] < counts["varied"]["sampling/tokens"], "ragged prompts: padding"


def test_a_decode_step_costs_fewer_ops_and_syncs_than_generates(collected: dict[str, Any]) -> None:
    # before: 214.5 ops a step against generate's 197 on prompts of one length (223.5 against 233 padded).
    # The shared-prefix case's decode trades about ten ops a layer a step for reading each prompt's cache once
    # for its K rows; it runs on a CPU only (a GPU's decode, where ops are launches, keeps the plain attention,
    # whose ops the other cases count): there, fewer syncs than generate's, and the ops it adds stay counted
    for name, counts in collected["counts"].items():
        generate = collected["reference"][name]
        for count in ("syncs_per_step",) if name == "shared-prefix" else COUNTS_PER_STEP:
            assert counts[f"decode/{count}"] < generate[f"decode/generate_{count}"], (name, count, counts, generate)


def test_the_shared_prefix_case_holds_each_prompt_once(
    collected: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert CASES["shared-prefix"].prompt_chars >= shared_prefix.MIN_PREFIX_TOKENS > CASES["long-prompt"].prompt_chars
    monkeypatch.setenv("RLOO_SHARED_PREFIX", "0")
    plain, _ = perf_counts.train_counts(CASES["shared-prefix"])
    shared = collected["counts"]["shared-prefix"]
    # the decode's cache holds each prompt once, not K times; its attention adds ops
    assert shared["sampling/peak_bytes"] < plain["sampling/peak_bytes"]
    assert shared["sampling/ops_per_decode_step"] > plain["sampling/ops_per_decode_step"]
    assert {k: v for k, v in shared.items() if k.startswith("update/")} == {
        k: v for k, v in plain.items() if k.startswith("update/")
    }


def test_the_kl_rewards_policy_side_is_the_old_log_prob_pass_where_that_runs(collected: dict[str, Any]) -> None:
    # num_iterations=2 runs the old log-prob pass anyway: the KL reward's policy side is its result, so beta > 0
    # adds the reference's forwards and none of the policy's (it already was: no forward to win back here)
    without_kl, _ = perf_counts.train_counts(dataclasses.replace(CASES["varied"], beta=0.0))
    with_kl = collected["counts"]["varied"]
    policy = with_kl["logprobs/forwards"] - with_kl["logprobs/reference_forwards"]
    assert with_kl["logprobs/reference_forwards"] > 0 and without_kl["logprobs/reference_forwards"] == 0
    assert policy == without_kl["logprobs/forwards"] > 0


def test_a_one_pass_steps_kl_reward_takes_its_policy_side_from_the_update(collected: dict[str, Any]) -> None:
    # issue 40: one optimizer step of one pass on the batch (the fixed and long-prompt cases): its forward gives
    # the KL's policy side, so phase 3 runs the reference's forwards only (before: as many of the policy's too)
    for name in ("fixed", "long-prompt"):
        counts = collected["counts"][name]
        assert counts["logprobs/forwards"] == counts["logprobs/reference_forwards"] > 0, name
        assert counts["update/rows"] == counts["logprobs/rows"], name  # every row trains: none skipped unseen


def rose(base: dict[str, float], now: dict[str, float], case: str) -> list[str]:
    """The counts of ``now`` that rose over the same counts of ``base`` (the guard's rule)."""
    rises, _ = perf_counts.compare({case: {k: v for k, v in base.items() if k in now}}, {case: now})
    return [rise.split(": ")[1] for rise in rises]


def test_the_guard_names_an_extra_forward_in_a_pass(collected: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    import rloo.training.passes as passes

    pass_logprobs = passes.completion_logprobs

    def with_a_forward_too_many(model: Any, *args: Any, **kwargs: Any) -> Any:
        pass_logprobs(model, *args, **kwargs)  # computed and thrown away
        return pass_logprobs(model, *args, **kwargs)

    monkeypatch.setattr(passes, "completion_logprobs", with_a_forward_too_many)
    counts, _ = perf_counts.train_counts(CASES["fixed"])
    named = rose(collected["counts"]["fixed"], counts, "fixed")
    assert {"logprobs/forwards", "update/forwards", "logprobs/flops", "update/flops"} <= set(named), named
    assert not any(name.startswith("sampling/") for name in named), named


def test_the_guard_names_a_host_sync_in_the_decode_loop(
    collected: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import rloo.generation.rollout as rollout

    sample = rollout.sample_next_token

    def with_a_host_read(*args: Any, **kwargs: Any) -> Any:
        token, logprob = sample(*args, **kwargs)
        float(logprob.sum())  # an .item() a step
        return token, logprob

    monkeypatch.setattr(rollout, "sample_next_token", with_a_host_read)
    decode = perf_counts.decode_counts(CASES["fixed"])["rloo"]
    counts = {f"decode/{key}": value for key, value in decode.items() if key != "ops"}
    assert rose(collected["counts"]["fixed"], counts, "fixed") == ["decode/syncs_per_step"]


def test_the_comparison_fails_on_a_rise_notes_a_fall_and_keeps_within_5_percent() -> None:
    base = {"a": {"forwards": 10, "syncs_per_step": 0.0, "ops": 100}}
    assert perf_counts.compare(base, {"a": {"forwards": 10, "syncs_per_step": 0.0, "ops": 105}}) == ([], [])
    rises, falls = perf_counts.compare(base, {"a": {"forwards": 11, "syncs_per_step": 0.125, "ops": 94}})
    assert rises == ["a: forwards: 10 -> 11", "a: syncs_per_step: 0 -> 0.125"] and falls == ["a: ops: 100 -> 94"]
    rises, _ = perf_counts.compare(base, {"a": {"forwards": 10, "ops": 100, "new": 1}, "b": {"x": 1}})
    assert rises == ["a: new: not in the baseline", "a: syncs_per_step: no longer counted", "b: x: not in the baseline"]
