"""The HTML run report: sections, plots, escaping, omitted metrics, diagnostics, errors, atomic write."""

from __future__ import annotations

import base64
import html
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rloo.report.diagnostics import diagnose
from rloo.report.page import build_report
from tests.helpers.runs import NASTY, NUM_PLOTS, completions, healthy_metrics, make_run

IMG = re.compile(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)">')


@pytest.fixture(scope="module")
def full_report(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The report of the healthy synthetic run, built once for the module (plots take time)."""
    run = make_run(tmp_path_factory.mktemp("run"))
    path = build_report(run)
    assert path == run / "report.html"
    return path.read_text()


def _minimal_run(tmp_path: Path, metrics: list[dict[str, Any]]) -> Path:
    run = make_run(tmp_path / "run", metrics=metrics)
    return build_report(run)


def test_report_has_every_section(full_report: str) -> None:
    for section in ("summary", "warnings", "plots", "samples", "config"):
        assert f'id="{section}"' in full_report
    assert "<title>rloo report: run" in full_report
    assert "last logged step</th><td>20</td>" in full_report
    assert "final reward</th><td>0.8 (step 20)" in full_report
    assert "best reward</th><td>0.8 (step 20)" in full_report
    assert "final eval reward</th><td>0.7 (step 20)" in full_report
    assert "Not plotted" not in full_report


def test_the_last_evaluation_shows_every_number_compute_metrics_keys_too(tmp_path: Path) -> None:
    """The eval rows of the last evaluation step (two eval sets logged apart, a compute_metrics key) in one table;
    an earlier evaluation's numbers are not there, and a run without evaluation has no such section."""
    train = [{"step": s, "reward": 0.5, "loss": 0.1} for s in (1, 2, 3, 4)]
    evals = [
        {"step": 2, "eval_reward": 0.25, "eval_accuracy": 0.125},
        {"step": 4, "eval_reward": 0.5, "eval_accuracy": 0.375},
        {"step": 4, "eval_hard_reward": 0.0625},
    ]
    text = _minimal_run(tmp_path / "a", train + evals).read_text()
    section = text.split('<section id="evaluation">')[1].split("</section>")[0]
    assert "Last evaluation (step 4)" in section
    assert "<th>eval_accuracy</th><td>0.375</td>" in section and "<th>eval_hard_reward</th><td>0.0625</td>" in section
    assert "<th>eval_reward</th><td>0.5</td>" in section and "0.125" not in section
    assert 'id="evaluation"' not in _minimal_run(tmp_path / "b", train).read_text()


def test_every_plot_is_an_embedded_png(full_report: str) -> None:
    images = IMG.findall(full_report)
    assert full_report.count("<img") == len(images) == NUM_PLOTS
    assert all(base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n") for data in images)
    # self-contained: nothing is fetched from anywhere
    assert "http://" not in full_report and "https://" not in full_report and "<link" not in full_report


def test_html_special_characters_are_escaped(full_report: str) -> None:
    assert NASTY not in full_report
    assert html.escape(NASTY) in full_report
    assert "a &lt; b &amp; c" in full_report  # config value
    assert "reward function &lt;fmt&gt; raised on 2 completions" in full_report  # warnings.log
    assert full_report.count("<script>") == 1  # only the image check


def test_samples_are_the_best_and_worst_of_the_last_three_steps(full_report: str) -> None:
    samples = full_report.split('<section id="samples">')[1].split("</section>")[0]
    assert samples.count("<tr>") == 1 + 20  # header + rows
    assert "steps 5, 10, 15" in samples
    assert "answer 0-" not in samples  # an older step
    assert "answer 5-0<" in samples and "answer 15-15<" in samples  # worst and best
    assert "answer 10-" not in samples  # the middle rewards
    assert "user: question 15-15" in samples  # chat prompts as role: content
    assert "x" * 399 + "…" in samples and "x" * 400 not in samples  # long text cut


def test_config_is_a_table(full_report: str) -> None:
    config = full_report.split('<section id="config">')[1]
    assert "<th>learning_rate</th><td>1e-06</td>" in config
    assert "<th>reward_weights</th><td>[1.0, 0.5]</td>" in config


def test_absent_metrics_are_noted_not_plotted(tmp_path: Path) -> None:
    rows = [{"step": float(s), "reward": 0.1 * s, "reward_std": 0.2} for s in range(1, 6)]
    text = _minimal_run(tmp_path, rows).read_text()
    assert text.count("<img") == 1
    assert "Not plotted:" in text
    assert "KL to the reference: no kl logged (it is computed only when beta &gt; 0)" in text
    assert "Reward per function (mean ± std): no rewards/&lt;name&gt;/mean logged" in text
    assert "Eval reward (mean ± std): no eval_reward logged" in text


def test_missing_or_empty_metrics_raise(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"metrics\.jsonl is missing or empty: the run has not logged yet"):
        build_report(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="has not logged yet"):
        build_report(tmp_path)
    assert not (tmp_path / "report.html").exists()


def test_half_written_line_is_skipped_and_noted(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", metrics=[{"step": 1.0, "reward": 0.5}], completion_rows=[], warnings=[])
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 2.0, "rew')
    text = build_report(run).read_text()
    assert "metrics.jsonl: skipped 1 unreadable line(s)" in text
    assert "set log_completions=True" in text  # empty completions.jsonl


def test_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"step": 1.0, "reward": 0.5}]
    path = _minimal_run(tmp_path, rows)
    assert sorted(p.name for p in path.parent.iterdir() if "report" in p.name) == ["report.html"]
    assert path.stat().st_mode & 0o777 == 0o644
    before = path.read_text()

    def failing_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("rloo.report.page.os.replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        build_report(path.parent)
    assert path.read_text() == before  # the old report is intact ...
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []  # ... and no temp file is left


def test_output_path(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", metrics=[{"step": 1.0, "reward": 0.5}])
    out = build_report(run, tmp_path / "elsewhere" / "r.html")
    assert out == tmp_path / "elsewhere" / "r.html" and out.is_file()
    assert not (run / "report.html").exists()


def test_diagnostics_show_in_warnings(tmp_path: Path) -> None:
    rows = [{"step": float(s), "reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0} for s in range(1, 9)]
    text = _minimal_run(tmp_path, rows).read_text()
    warnings = text.split('<section id="warnings">')[1].split("</section>")[0]
    assert "Warnings (3)" in warnings  # warnings.log + two diagnostics
    assert "most groups have identical rewards" in warnings and "reward_std collapsed to 0" in warnings


# ---------------------------------------------------------------------------- diagnostics
def test_healthy_run_raises_no_diagnostic() -> None:
    assert diagnose(healthy_metrics()) == []


def _with(key: str, values: list[float]) -> list[dict[str, Any]]:
    """Healthy metrics with ``key`` replaced by ``values`` over the 20 steps."""
    rows = [row for row in healthy_metrics() if "eval_reward" not in row]
    return [{**row, key: value} for row, value in zip(rows, values, strict=True)]


def _steps(early: float, late: float) -> list[float]:
    return [early] * 15 + [late] * 5


@pytest.mark.parametrize(
    ("key", "values", "expected"),
    [
        ("frac_reward_zero_std", _steps(0.1, 0.8), "most groups have identical rewards"),
        ("completions/clipped_ratio", _steps(0.05, 0.9), "most completions hit max_completion_length"),
        ("kl", _steps(0.0, 1.5), "KL is growing"),  # past the absolute limit
        ("kl", [0.06, *_steps(0.1, 0.7)[1:]], "KL is growing"),  # over 10x its first value
        ("reward_std", _steps(0.3, 0.0), "reward_std collapsed to 0"),
        ("completions/mean_length", _steps(30.0, 1.0), "empty outputs"),
        ("loss", _steps(0.1, math.nan), "NaN/inf loss or grad_norm at step(s) 16, 17, 18, 19, 20"),
        ("grad_norm", [math.inf] + [1.0] * 19, "NaN/inf loss or grad_norm at step(s) 1. Fix:"),
    ],
)
def test_diagnostic_fires(key: str, values: list[float], expected: str) -> None:
    messages = diagnose(_with(key, values))
    assert len(messages) == 1 and expected in messages[0], messages


@pytest.mark.parametrize(
    ("key", "values"),
    [
        ("frac_reward_zero_std", _steps(0.9, 0.3)),  # recovered: only the last quarter counts
        ("kl", _steps(0.0, 0.4)),  # from ~0 the floor keeps a modest KL quiet
        ("completions/clipped_ratio", _steps(0.5, 0.5)),  # exactly the threshold
    ],
)
def test_diagnostic_stays_quiet(key: str, values: list[float]) -> None:
    assert diagnose(_with(key, values)) == []


def test_window_of_nan_losses_is_a_row_without_loss() -> None:
    # the trainer's window mean drops NaN, so an all-NaN window logs no "loss" at all
    rows = [row for row in healthy_metrics() if "eval_reward" not in row]
    del rows[7]["loss"]
    (message,) = diagnose(rows)
    assert message.startswith("NaN/inf loss or grad_norm at step(s) 8. Fix: lower learning_rate")


def test_eval_rows_are_not_training_rows() -> None:
    rows = [*healthy_metrics(), {"step": 21.0, "eval_reward": 0.0, "eval_reward_std": 0.0}]
    assert diagnose(rows) == []


def test_completions_written_by_the_trainer_format(tmp_path: Path) -> None:
    # unscorable completions have reward None; they sort after the scored ones
    rows = [
        *completions([3], per_step=2),
        {"step": 3, "prompt": "p", "completion": "?", "reward": None, "advantage": 0},
    ]
    run = make_run(tmp_path / "run", metrics=[{"step": 3.0, "reward": 0.5}], completion_rows=rows)
    samples = build_report(run).read_text().split('<section id="samples">')[1]
    assert samples.index("answer 3-1") < samples.index("answer 3-0") < samples.index("<td>?</td><td>–</td>")


def test_each_reward_functions_score_is_a_column_of_the_samples(tmp_path: Path) -> None:
    rows = [
        {"step": 3, "prompt": "p", "completion": "a", "reward": 1.5, "rewards": {"acc": 1.0, "fmt": 0.5}},
        {"step": 3, "prompt": "p", "completion": "b", "reward": 0.5, "rewards": {"acc": None, "fmt": 0.5}},
    ]
    run = make_run(tmp_path / "run", metrics=[{"step": 3.0, "reward": 1.0}], completion_rows=rows)
    samples = build_report(run).read_text().split('<section id="samples">')[1]
    assert "<th>reward</th><th>acc</th><th>fmt</th><th>advantage</th>" in samples
    assert "<td>1.5</td><td>1</td><td>0.5</td><td>–</td>" in samples  # no advantage given: –
    assert "<td>0.5</td><td>–</td><td>0.5</td>" in samples and "{" not in samples.split("</table>")[0]


@pytest.mark.system
def test_import_stays_light() -> None:
    code = "import sys, rloo.report.page; assert 'matplotlib' not in sys.modules, 'matplotlib imported eagerly'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gradient_variance_is_drawn_when_logged_and_left_out_silently_when_not(tmp_path: Path) -> None:
    rows = [{"step": float(s), "reward": 0.1 * s, "reward_std": 0.2} for s in range(1, 6)]
    for row in rows[1::2]:  # measured every 2 steps
        row.update({"grad_var/used": 0.5, "grad_var/none": 2.0, "grad_var/rloo": 0.5, "grad_var/grpo": 9.0})
        row["grad_var/reduction_vs_none"] = 0.75
    text = _minimal_run(tmp_path / "on", rows).read_text()
    assert text.count("<img") == 3
    assert 'alt="Gradient variance per estimator (log_grad_variance)"' in text
    assert 'alt="Variance reduction vs no baseline: 1 - Var[used] / Var[none]"' in text
    off = _minimal_run(tmp_path / "off", [{"step": 1.0, "reward": 0.5}]).read_text()
    assert "log_grad_variance" not in off and "Learning signal" not in off  # opt-in: no note either


def test_the_end_of_run_summary_is_no_missing_loss() -> None:
    """A finished run's last row is transformers' summary (train_loss, no loss): no NaN/inf alarm."""
    rows = [row for row in healthy_metrics() if "eval_reward" not in row]
    summary = {"step": rows[-1]["step"], "train_loss": 0.01, "train_runtime": 12.0, "train_steps_per_second": 1.6}
    assert diagnose([*rows, summary]) == []


def test_an_episode_shows_its_tool_calls_and_greys_the_tool_answers(tmp_path: Path) -> None:
    call = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}
    episode = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "multiply", "content": "12 <b>"},
        {"role": "assistant", "content": "12"},
    ]
    rows = [{"step": 1, "prompt": [{"role": "user", "content": "3*4?"}], "completion": episode, "reward": 1.0}]
    page = build_report(make_run(tmp_path / "run", completion_rows=rows)).read_text()
    assert "assistant: -&gt; multiply(a=3, b=4)" in page
    assert '<span class="tool">tool: 12 &lt;b&gt;</span>' in page  # escaped, greyed
    assert "assistant: 12" in page
