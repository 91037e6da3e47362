"""The report in a real headless browser (Debian's chromium): it loads, every plot decodes, no JS error.

The report's inline script writes ``body[data-images-ok] = "<decoded>/<total>"`` on load;
``--dump-dom`` prints the DOM after the page (and that script) ran. Console errors reach
stderr with ``--enable-logging=stderr``. ``make browser`` installs chromium.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rloo.report.page import build_report
from tests.helpers.runs import NUM_PLOTS, make_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(
        CHROMIUM is None, reason="chromium is not installed: run `make browser` (apt-get install chromium)"
    ),
]


def _chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    command = [
        CHROMIUM,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",  # needed as root, e.g. in CI containers
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--run-all-compositor-stages-before-draw",
        "--virtual-time-budget=5000",
        *args,
        page.as_uri(),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


def _images_ok(dom: str) -> tuple[int, int]:
    match = re.search(r'data-images-ok="(\d+)/(\d+)"', dom)
    assert match is not None, "the report's load script did not run"
    return int(match.group(1)), int(match.group(2))


def test_report_renders_in_chromium(tmp_path: Path) -> None:
    report = build_report(make_run(tmp_path / "run"))
    result = _chromium(report, tmp_path / "profile", "--dump-dom")
    assert "<title>rloo report: run</title>" in result.stdout
    assert "Sample completions" in result.stdout
    assert _images_ok(result.stdout) == (NUM_PLOTS, NUM_PLOTS)
    assert "Uncaught" not in result.stderr

    screenshot = tmp_path / "report.png"
    _chromium(report, tmp_path / "profile", f"--screenshot={screenshot}", "--window-size=1280,2400")
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 50_000


def test_the_check_catches_a_broken_image_and_a_script_error(tmp_path: Path) -> None:
    # without this, a check that always passes would go unnoticed
    report = build_report(make_run(tmp_path / "run"))
    broken = tmp_path / "broken.html"
    text = report.read_text()
    text = text.replace("base64,iVBOR", "base64,AAAAA", 1)  # corrupt the first plot
    text = text.replace("<script>", "<script>notAFunction();</script><script>", 1)
    broken.write_text(text)
    result = _chromium(broken, tmp_path / "profile", "--dump-dom")
    assert _images_ok(result.stdout) == (NUM_PLOTS - 1, NUM_PLOTS)
    assert "Uncaught ReferenceError: notAFunction is not defined" in result.stderr
