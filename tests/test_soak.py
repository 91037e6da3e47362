"""A long run that does not drift (issue 42), short: ``benchmarks/soak.py`` for 150 steps of a tiny model. Open
files, threads and child processes stay the same after the warm-up, checkpoints rotate to ``save_total_limit``
and keep their size, each step adds the same bytes to the logs, resident memory stays within 10%. The
benchmark's thousands of steps (and a run with a rollout worker) are in BENCHMARKS.md."""

from __future__ import annotations

import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from soak import growth, soak, summary  # noqa: E402


def test_150_steps_leak_no_file_thread_or_process_and_write_the_same_bytes_each_step(tmp_path: Path) -> None:
    samples = soak(tmp_path / "run", steps=150, every=10, logging_steps=1)  # a row a step: the most it keeps
    assert [s.step for s in samples] == list(range(20, 151, 10))
    settled = samples[len(samples) // 5 :]
    for key in ("fds", "threads", "children"):
        values = {getattr(s, key) for s in settled}
        assert len(values) == 1, f"{key} changed after the warm-up: {[getattr(s, key) for s in samples]}"
    assert [s.checkpoint_count for s in samples] == [1] + [2] * (len(samples) - 1)  # save_total_limit=2
    sizes = [s.checkpoint_bytes for s in samples[1:]]
    assert max(sizes) - min(sizes) < 0.001 * min(sizes), sizes  # a checkpoint's size does not grow (JSON digits vary)
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-140", "checkpoint-150"]
    for key in ("log_bytes_per_step", "trainer_state_bytes_per_step"):
        assert abs(growth(samples, key)) < 0.1, (key, [getattr(s, key) for s in samples])
    assert growth(samples, "rss_mb") < 0.1, [s.rss_mb for s in samples]
    assert summary(samples)["steps"] == 150
    # a checkpoint every 10 steps, so in every sample: its write timed apart from the steps around it
    assert all(s.save_seconds > 0 and s.step_seconds_between_saves < s.step_seconds for s in samples)
    assert all(s.cpu_seconds_per_step > 0 for s in samples)
