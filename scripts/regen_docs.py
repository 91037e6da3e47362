"""Rewrite the generated parts of README.md: the config field table and the health thresholds.

Run after adding or changing a config field: ``.venv/bin/python scripts/regen_docs.py``
(tests/config/test_docs.py and tests/training/monitoring/test_health.py fail until the README matches).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def replace_between(text: str, start: str, end: str, body: str) -> str:
    i, j = text.index(start) + len(start), text.index(end)
    return text[:i] + body + text[j:]


def main() -> None:
    from rloo.config.health import thresholds_markdown

    readme = ROOT / "README.md"
    table = subprocess.run(
        [sys.executable, "-m", "rloo.config"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    text = readme.read_text()
    text = replace_between(text, "<!-- config-fields:start -->", "<!-- config-fields:end -->", f"\n{table}\n")
    text = replace_between(
        text, "<!-- health-thresholds:start -->\n", "\n<!-- health-thresholds:end -->", thresholds_markdown()
    )
    readme.write_text(text)


if __name__ == "__main__":
    main()
