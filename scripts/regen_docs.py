"""Rewrite the generated parts of the docs pages: the config field table (docs/configuration.md), the
health monitors' thresholds (docs/reliability.md) and the defaults that differ from TRL's
(docs/migrating-from-trl.md), each between its markers.

Run after adding or changing a config field, a threshold or a difference from TRL's defaults:
``.venv/bin/python scripts/regen_docs.py`` (tests/config/test_docs.py, tests/training/monitoring/test_health.py
and tests/config/test_trl_defaults.py fail until the pages match).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT))


def replace_between(text: str, start: str, end: str, body: str) -> str:
    i, j = text.index(start) + len(start), text.index(end)
    return text[:i] + body + text[j:]


def rewrite(page: Path, start: str, end: str, body: str) -> None:
    page.write_text(replace_between(page.read_text(), start, end, body))


def main() -> None:
    from rloo.config import RLOOConfig
    from rloo.config.health import thresholds_markdown
    from rloo.config.trl.defaults import differences_markdown

    table = subprocess.run(
        [sys.executable, "-m", "rloo.config"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    rewrite(DOCS / "configuration.md", "<!-- config-fields:start -->", "<!-- config-fields:end -->", f"\n{table}\n")
    rewrite(
        DOCS / "reliability.md",
        "<!-- health-thresholds:start -->\n",
        "\n<!-- health-thresholds:end -->",
        thresholds_markdown(),
    )
    rewrite(
        DOCS / "migrating-from-trl.md",
        "<!-- trl-defaults:start -->\n",
        "\n<!-- trl-defaults:end -->",
        differences_markdown(RLOOConfig),
    )


if __name__ == "__main__":
    main()
