"""The version is written once (``rloo.__version__``): pyproject reads it, ``rloo --version`` prints it, and the
newest CHANGELOG.md entry is about it."""

from __future__ import annotations

import re
import tomllib

import rloo
from tests.helpers.cli import invoke
from tests.helpers.paths import REPO


def test_pyproject_takes_its_version_from_the_package() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"], "pyproject.toml writes a version of its own: read rloo.__version__"
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "rloo.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", rloo.__version__)


def test_the_newest_changelog_entry_is_this_version() -> None:
    headings = re.findall(r"^## (\d+\.\d+\.\d+) - ", (REPO / "CHANGELOG.md").read_text(), flags=re.MULTILINE)
    assert headings, "CHANGELOG.md has no '## X.Y.Z - DATE' entry"
    assert headings[0] == rloo.__version__, (
        f"rloo.__version__ is {rloo.__version__} but CHANGELOG.md's newest entry is {headings[0]}: add an entry"
    )


def test_rloo_version_prints_the_packages_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"rloo {rloo.__version__}"
