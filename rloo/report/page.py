"""A one-page HTML report of a run folder: plots, warnings, sample completions, config.

``build_report(run_dir)`` reads what :class:`rloo.training.trainer.RLOOTrainer` writes
(``metrics.jsonl``, ``completions.jsonl``, ``config.yaml``, and ``warnings.log`` when present)
and writes ``run_dir/report.html``: a single self-contained file (plots are base64 PNGs
embedded in the page, no external URLs, no JS libraries) that can be mailed or archived.

The only script is a few inline lines that record in ``body[data-images-ok]`` how many
plots decoded, so a headless browser can check the page. matplotlib (Agg, without pyplot)
loads inside the call, so ``import rloo`` stays light. The report can be built while a run
is still writing: an unreadable (half-written) line of a JSONL file is skipped and noted.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from rloo.report.diagnostics import Rows, diagnose, finite_series, is_finite, training_rows
from rloo.report.plots import render_plots

__all__ = ["build_report", "diagnose"]

SAMPLE_STEPS = 3  # completions of the last logged steps shown ...
SAMPLE_ROWS = 20  # ... at most this many: the best and the worst half
MAX_TEXT_CHARS = 400  # longer prompts and completions are cut with an ellipsis


def build_report(run_dir: str | Path, output: Path | None = None) -> Path:
    """Write the HTML report of ``run_dir`` to ``output`` (default ``run_dir/report.html``).

    Raises ``ValueError`` when ``metrics.jsonl`` is missing or holds no readable log.
    The file is written next to its destination and moved into place, so a reader never
    sees a half-written report. Returns the report's path.
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise ValueError(f"run folder {str(run)!r} does not exist or is not a folder; give a run's output_dir")
    output = Path(output) if output is not None else run / "report.html"
    rows, skipped = _read_jsonl(run / "metrics.jsonl")
    if not rows:
        raise ValueError(
            f"{run / 'metrics.jsonl'} is missing or empty: the run has not logged yet "
            "(metrics are written every logging_steps optimizer steps)"
            + (f"; {skipped} unreadable line(s) skipped" if skipped else "")
        )
    notes = [f"metrics.jsonl: skipped {skipped} unreadable line(s)"] if skipped else []
    page = _page(run, rows, notes)
    _write_atomically(output, page)
    return output


# ---------------------------------------------------------------------------- reading the run folder
def _read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects with a ``step`` in ``path``, and how many lines could not be used (none if no file)."""
    if not path.is_file():
        return [], 0
    rows, skipped = [], 0
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1
                continue
            if isinstance(row, dict) and is_finite(row.get("step")):
                rows.append(row)
            else:
                skipped += 1
    return rows, skipped


def _last_steps_completions(path: Path, num_steps: int) -> list[dict[str, Any]]:
    """Rows of ``completions.jsonl`` from its ``num_steps`` highest steps; streamed, so memory stays small."""
    if not path.is_file():
        return []
    by_step: dict[int, list[dict[str, Any]]] = {}
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            with contextlib.suppress(json.JSONDecodeError):
                row = json.loads(line)
                if not isinstance(row, dict) or not isinstance(row.get("step"), int | float):
                    continue
                by_step.setdefault(int(row["step"]), []).append(row)
                if len(by_step) > num_steps:
                    del by_step[min(by_step)]
    return [row for step in sorted(by_step) for row in by_step[step]]


def _read_warnings(path: Path) -> list[str]:
    if not path.is_file():
        return []
    return [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]


def _read_config(path: Path) -> dict[str, Any] | str:
    """The config as a mapping, or a sentence saying why there is none."""
    if not path.is_file():
        return "config.yaml not found in the run folder"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        return f"config.yaml could not be parsed: {err}"
    return config if isinstance(config, dict) else "config.yaml does not hold a mapping"


# ---------------------------------------------------------------------------- HTML
def _page(run: Path, rows: Rows, notes: list[str]) -> str:
    warnings = _read_warnings(run / "warnings.log")
    diagnostics = diagnose(rows)
    images, omitted = render_plots(rows)
    completions = _last_steps_completions(run / "completions.jsonl", SAMPLE_STEPS)
    body = "\n".join(
        [
            f'<header id="summary"><h1>rloo run report</h1>{_summary_table(run, rows)}</header>',
            _evaluation_section(rows),
            _warnings_section(warnings, diagnostics, notes),
            _plots_section(images, omitted),
            _samples_section(completions),
            _config_section(_read_config(run / "config.yaml")),
        ]
    )
    title = html.escape(f"rloo report: {run.resolve().name}")
    return _TEMPLATE.format(title=title, style=_STYLE, body=body, script=_SCRIPT)


def _summary_table(run: Path, rows: Rows) -> str:
    train = training_rows(rows)
    steps, rewards = finite_series(train, "reward")
    items = [
        ("run folder", str(run.resolve())),
        ("last logged step", _fmt(max(r["step"] for r in rows))),
        ("logged rows", str(len(rows))),
    ]
    if rewards:
        best = max(range(len(rewards)), key=rewards.__getitem__)
        items.append(("final reward", f"{_fmt(rewards[-1])} (step {_fmt(steps[-1])})"))
        items.append(("best reward", f"{_fmt(rewards[best])} (step {_fmt(steps[best])})"))
    eval_steps, eval_rewards = finite_series(rows, "eval_reward")
    if eval_rewards:
        items.append(("final eval reward", f"{_fmt(eval_rewards[-1])} (step {_fmt(eval_steps[-1])})"))
    items.append(("report written", datetime.now().strftime("%Y-%m-%d %H:%M:%S")))
    return _key_value_table(items, "summary")


def _evaluation_section(rows: Rows) -> str:
    """Every number of the last evaluation (the rows logged at its step: each eval set's, and the
    ``compute_metrics`` hook's ``eval_<key>``), or nothing in a run without one."""
    evaluations = [row for row in rows if any(str(key).startswith("eval_") for key in row)]
    if not evaluations:
        return ""
    step = evaluations[-1].get("step")
    last = {
        k: v for row in evaluations if row.get("step") == step for k, v in row.items() if str(k).startswith("eval_")
    }
    items = [(key, f"{value:.4g}" if is_finite(value) else str(value)) for key, value in sorted(last.items())]
    title = f"Last evaluation (step {_fmt(step)})"
    return f'<section id="evaluation"><h2>{title}</h2>{_key_value_table(items, "evaluation")}</section>'


def _warnings_section(warnings: list[str], diagnostics: list[str], notes: list[str]) -> str:
    items = [("warnings.log", text) for text in warnings] + [("diagnostic", text) for text in diagnostics + notes]
    if not items:
        return '<section id="warnings"><h2>Warnings</h2><p class="ok">No warnings.</p></section>'
    lis = "".join(f'<li><span class="tag">{html.escape(src)}</span> {html.escape(text)}</li>' for src, text in items)
    return f'<section id="warnings"><h2>Warnings ({len(items)})</h2><ul class="warnings">{lis}</ul></section>'


def _plots_section(images: list[tuple[str, str]], omitted: list[str]) -> str:
    figures = "".join(
        f'<figure><img alt="{html.escape(title)}" src="data:image/png;base64,{data}"></figure>'
        for title, data in images
    )
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in omitted)
    omitted_html = f'<p>Not plotted:</p><ul class="omitted">{notes}</ul>' if omitted else ""
    return f'<section id="plots"><h2>Metrics over steps</h2><div class="grid">{figures}</div>{omitted_html}</section>'


_SAMPLE_COLUMNS = ("step", "prompt", "completion", "reward", "advantage")


def _samples_section(completions: list[dict[str, Any]]) -> str:
    head = '<section id="samples"><h2>Sample completions</h2>'
    if not completions:
        return head + "<p>No completions.jsonl (or it is empty): set log_completions=True to record them.</p></section>"
    picked = _pick_samples(completions, SAMPLE_ROWS)
    steps = sorted({int(row["step"]) for row in completions})
    caption = f"The best and worst rewards of steps {', '.join(map(str, steps))} ({len(picked)} of {len(completions)})."
    # each reward function's own score after the combined reward; columns reward functions added with
    # log_extra after the standard ones
    functions = list(dict.fromkeys(k for row in picked if isinstance(row.get("rewards"), dict) for k in row["rewards"]))
    extra = list(dict.fromkeys(k for row in picked for k in row if k not in (*_SAMPLE_COLUMNS, "rewards")))
    cells = "".join(
        f"<tr><td>{int(row['step'])}</td><td>{_cell_text(row.get('prompt'))}</td>"
        f"<td>{_cell_text(row.get('completion'))}</td><td>{_fmt(row.get('reward'))}</td>"
        + "".join(f"<td>{_fmt((row.get('rewards') or {}).get(name))}</td>" for name in functions)
        + f"<td>{_fmt(row.get('advantage'))}</td>"
        + "".join(f"<td>{_cell_text(row.get(k))}</td>" for k in extra)
        + "</tr>"
        for row in picked
    )
    header = "<tr><th>step</th><th>prompt</th><th>completion</th><th>reward</th>"
    header += "".join(f"<th>{html.escape(name)}</th>" for name in functions) + "<th>advantage</th>"
    header += "".join(f"<th>{html.escape(k)}</th>" for k in extra) + "</tr>"
    return f'{head}<p>{caption}</p><table class="samples">{header}{cells}</table></section>'


def _pick_samples(rows: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` rows, the highest and the lowest rewards, best first; unscorable rows last."""
    scored = sorted((r for r in rows if is_finite(r.get("reward"))), key=lambda r: -float(r["reward"]))
    unscored = [r for r in rows if not is_finite(r.get("reward"))]
    if len(scored) <= limit:
        return (scored + unscored)[:limit]
    half = limit // 2
    return scored[: limit - half] + scored[-half:]


def _config_section(config: dict[str, Any] | str) -> str:
    head = '<section id="config"><h2>Config</h2>'
    if isinstance(config, str):
        return f"{head}<p>{html.escape(config)}</p></section>"
    items = [(str(key), value if isinstance(value, str) else json.dumps(value)) for key, value in config.items()]
    return head + _key_value_table(items, "config") + "</section>"


def _key_value_table(items: list[tuple[str, str]], css_class: str) -> str:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items)
    return f'<table class="{css_class}">{rows}</table>'


def _cell_text(value: Any) -> str:
    """A prompt or completion as escaped text: chat messages as ``role: content`` lines (an assistant's tool
    calls as ``-> name(arguments)``; a tool's answer greyed: context the model did not write), long text cut."""
    if isinstance(value, list):
        return "\n".join(_message_html(m) for m in value)
    return html.escape(_cut("" if value is None else str(value)))


def _message_html(message: Any) -> str:
    """One chat message of a prompt or a multi-turn episode, escaped."""
    if not isinstance(message, dict):
        return html.escape(_cut(str(message)))
    text = f"{message.get('role', '?')}: {message.get('content', '')}".rstrip(" ")
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        arguments = ", ".join(f"{k}={v!r}" for k, v in (function.get("arguments") or {}).items())
        text += f" -> {function.get('name', '?')}({arguments})"
    escaped = html.escape(_cut(text))
    return f'<span class="tool">{escaped}</span>' if message.get("role") == "tool" else escaped


def _cut(text: str) -> str:
    return text[: MAX_TEXT_CHARS - 1] + "…" if len(text) > MAX_TEXT_CHARS else text


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.4g}" if isinstance(value, int | float) else html.escape(str(value))


# ---------------------------------------------------------------------------- writing
def _write_atomically(path: Path, text: str) -> None:
    """Write to a temporary file in the same folder, then rename it over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temp, 0o644)  # mkstemp makes it private; a report is for sharing
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1280px;
       padding: 16px 24px; color: #1d2330; background: #fafbfc; }
h1 { font-size: 22px; margin: 8px 0 12px; } h2 { font-size: 17px; margin: 28px 0 8px;
     border-bottom: 1px solid #d8dde6; padding-bottom: 4px; }
table { border-collapse: collapse; background: #fff; }
th, td { border: 1px solid #d8dde6; padding: 4px 8px; text-align: left; vertical-align: top; }
table.summary th, table.config th { background: #f0f2f6; font-weight: 600; white-space: nowrap; }
table.config td { font-family: ui-monospace, Menlo, monospace; font-size: 12px; word-break: break-all; }
table.samples td { font-family: ui-monospace, Menlo, monospace; font-size: 12px; white-space: pre-wrap;
                   max-width: 520px; word-break: break-word; }
table.samples th { background: #f0f2f6; }
table.samples span.tool { color: #9aa0a6; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 12px; }
figure { margin: 0; background: #fff; border: 1px solid #d8dde6; border-radius: 6px; padding: 4px; }
figure img { width: 100%; height: auto; display: block; }
ul.warnings li { margin: 4px 0; } .tag { font-size: 11px; background: #fde7c8; color: #7a4100;
     border-radius: 4px; padding: 1px 6px; } .ok { color: #1e7b34; } ul.omitted { color: #5b6472; }
"""

# Counts the plots that decoded, for the headless-browser test; it changes nothing on the page.
_SCRIPT = """
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var ok = images.filter(function (img) { return img.complete && img.naturalWidth > 0; }).length;
  document.body.dataset.imagesOk = ok + "/" + images.length;
});
"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head><meta charset="utf-8"><title>{title}</title><style>{style}</style></head>
<body>
{body}
<script>{script}</script>
</body>
</html>
"""
