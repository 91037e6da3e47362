"""The wheel a user builds from a clone (docs/installation.md: ``python -m build --wheel``) installs and runs
away from the checkout: it holds every file of the package, its version is ``rloo.__version__``, and ``import
rloo``, ``rloo --version`` and ``rloo --help`` work from it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import rloo
from tests.helpers.paths import REPO


def _package_files(root: Path) -> set[str]:
    """The files under ``root/rloo`` that a wheel must carry (compiled caches aside), relative to ``root``."""
    return {
        path.relative_to(root).as_posix()
        for path in (root / "rloo").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def _clean_env() -> dict[str, str]:
    """This environment without anything that would find the checkout's rloo instead of the installed wheel."""
    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.mark.system
def test_the_wheel_holds_the_package_and_runs_outside_the_checkout(tmp_path: Path) -> None:
    # a copy of what a clone has, so the build's own folders (build/, *.egg-info) stay out of the checkout
    source = tmp_path / "clone"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "rloo", source / "rloo", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = tmp_path / "dist"
    # --no-isolation: the build backend (setuptools) from .venv, no download; a user's plain
    # `python -m build --wheel` fetches the same backend into an isolated environment
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    (wheel,) = dist.glob("*.whl")
    assert wheel.name == f"rloo-{rloo.__version__}-py3-none-any.whl"

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"rloo-{rloo.__version__}.dist-info"
        metadata = archive.read(f"{info}/METADATA").decode()
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    missing = _package_files(source) - names
    assert not missing, f"files of the package the wheel leaves out (pyproject's package-data): {sorted(missing)}"
    assert f"Version: {rloo.__version__}" in metadata
    assert "rloo = rloo.cli:main" in entry_points
    assert any(name.startswith(f"{info}/") and name.endswith("LICENSE") for name in names)

    # a fresh environment that sees .venv's packages (torch, transformers, ...) but not the checkout: the wheel
    # goes in without dependencies, and .venv's site-packages is added after its own (a .pth line, which does
    # not run .venv's own .pth files, so the checkout's editable rloo stays out of sight)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    import sysconfig

    Path(purelib, "rloo_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, (installed.stdout + installed.stderr)[-4000:]

    away = tmp_path / "elsewhere"
    away.mkdir()
    run = {"cwd": away, "env": _clean_env(), "capture_output": True, "text": True, "timeout": 300}
    probe = "import rloo, importlib.metadata as m; print(rloo.__file__); print(m.version('rloo'))"
    imported = subprocess.run([str(python), "-c", probe], **run)
    assert imported.returncode == 0, imported.stderr[-4000:]
    where, version = imported.stdout.split()
    assert Path(where).resolve().is_relative_to(Path(purelib).resolve()), where
    assert version == rloo.__version__
    command = venv / "bin" / "rloo"
    shown = subprocess.run([str(command), "--version"], **run)
    assert shown.returncode == 0 and shown.stdout.strip() == f"rloo {rloo.__version__}", shown.stdout + shown.stderr
    helped = subprocess.run([str(command), "--help"], **run)
    assert helped.returncode == 0 and "train" in helped.stdout, helped.stdout + helped.stderr
    # the config and trainer import from the wheel (every stage of the package, with torch and transformers)
    trainer = subprocess.run([str(python), "-c", "from rloo import RLOOConfig, RLOOTrainer, GRPOTrainer"], **run)
    assert trainer.returncode == 0, trainer.stderr[-4000:]


def test_the_install_lines_name_this_versions_wheel_and_the_build_ci_runs() -> None:
    """docs/installation.md's lines are the ones the test above checks: the wheel's name at this version, the
    build command, and the offline build it runs."""
    page = (REPO / "docs" / "installation.md").read_text()
    assert "python -m build --wheel" in page and "python -m build --wheel --no-isolation" in page
    assert f"pip install dist/rloo-{rloo.__version__}-py3-none-any.whl" in page
    readme = (REPO / "README.md").read_text()
    assert "`pip install -e .` from this checkout, or a wheel built here" in readme
