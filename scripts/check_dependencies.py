"""Run the model-family and trainer tests against other versions of the machine-learning stack.

    python scripts/check_dependencies.py newest   # the newest releases on the package index
    python scripts/check_dependencies.py oldest   # pyproject.toml's lower bounds (requirements/oldest.txt)

Each installs into a venv of its own (``.venv-deps-<which>``, reused and brought up to date on the
next run), prints the versions it got next to the tested ones (``requirements/tested.txt``), runs
``tests/generation/test_model_families.py`` and ``tests/training/test_trainer.py`` there, and exits with pytest's code.
A new release that breaks rloo is found here, by us, before a user installs it
(``make test-newest``); ``make test-oldest`` keeps the lower bounds honest. Both need the package
index; neither runs in ``make test``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STACK = ("transformers", "accelerate", "peft", "datasets", "tokenizers", "safetensors", "huggingface-hub")
TESTS = ("tests/generation/test_model_families.py", "tests/training/test_trainer.py")


def read_pins(path: Path) -> dict[str, str]:
    """``name -> version`` of a requirements file's ``name==version`` lines (names normalized)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[normalize(name)] = version.strip()
    return pins


def normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def run(*command: str | Path) -> None:
    print("+", " ".join(str(part) for part in command), flush=True)
    subprocess.run([str(part) for part in command], check=True, cwd=ROOT)


def install(venv: Path, which: str) -> None:
    """The venv with the CPU torch pin (``TORCH_SPEC``), rloo and its dev extras, and the stack at
    ``which`` versions."""
    python = venv / "bin" / "python"
    if not python.exists():
        run(sys.executable, "-m", "venv", venv)
    pip = (python, "-m", "pip", "install", "-q")
    run(*pip, "--upgrade", "pip")
    run(*pip, os.environ.get("TORCH_SPEC", "torch==2.13.0"))
    if which == "oldest":
        run(*pip, "-e", ".[dev]", "-c", ROOT / "requirements" / "oldest.txt")
    else:
        run(*pip, "-e", ".[dev]")
        run(*pip, "--upgrade", *STACK)


def installed_versions(venv: Path) -> dict[str, str]:
    freeze = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "freeze", "--exclude-editable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {normalize(name): version for name, _, version in (line.partition("==") for line in freeze.splitlines())}


def report(installed: dict[str, str], tested: dict[str, str]) -> None:
    print(f"\n{'package':<16} {'here':<12} tested (requirements/tested.txt)")
    for name in STACK:
        here, then = installed.get(name, "-"), tested.get(name, "-")
        print(f"{name:<16} {here:<12} {then}{'' if here == then else '   <- differs'}")
    print(flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("which", choices=["newest", "oldest"])
    parser.add_argument("--venv", type=Path, help="default: .venv-deps-<which> in the repository")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()
    venv = args.venv or ROOT / f".venv-deps-{args.which}"
    install(venv, args.which)
    report(installed_versions(venv), read_pins(ROOT / "requirements" / "tested.txt"))
    command = [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", *TESTS, *args.pytest_args]
    return subprocess.run(command, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
