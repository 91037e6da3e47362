"""The package layout: folders by stage, a pure math folder, short modules, a light import."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rloo"
STAGES = ("algo", "config", "data", "generation", "forward", "rewards", "tools", "report", "training", "cli")
# the target is 400 lines (CONTRIBUTING); the test fails at 500, so nothing is packed to stay under it
MAX_LINES = 500
WARN_LINES = 450  # past it, a module says at its top why it stays whole


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (absolute imports; relative ones are ``.``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("." if node.level else str(node.module))
    return names


@pytest.mark.parametrize("module", sorted((PACKAGE / "algo").glob("*.py")), ids=lambda p: p.name)
def test_the_math_folder_imports_only_torch_the_standard_library_and_itself(module: Path) -> None:
    allowed_roots = {"torch", "__future__"} | set(sys.stdlib_module_names)
    for name in imported_modules(module):
        assert name.split(".")[0] in allowed_roots or name.startswith("rloo.algo"), (
            f"{module.name} imports {name}: rloo/algo holds pure torch math (tensors and scalars in, "
            "tensors out); move what needs it to the stage that uses it"
        )


def test_the_purity_check_can_fail(tmp_path: Path) -> None:
    impure = tmp_path / "impure.py"
    impure.write_text("import numpy\nfrom rloo.config import RLOOConfig\nfrom torch import nn\n")
    assert imported_modules(impure) == {"numpy", "rloo.config", "torch"}


def test_every_stage_is_a_documented_package() -> None:
    for stage in STAGES:
        init = PACKAGE / stage / "__init__.py"
        assert init.is_file(), f"rloo/{stage}/ needs an __init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"rloo/{stage}/__init__.py needs a docstring"


@pytest.mark.parametrize("module", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_500_lines(module: Path) -> None:
    lines = len(module.read_text().splitlines())
    assert lines <= MAX_LINES, f"{module.relative_to(PACKAGE)} has {lines} lines; split it by what it holds"


@pytest.mark.parametrize("module", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_past_450_lines_says_why(module: Path) -> None:
    lines = module.read_text().splitlines()
    reason = any(line.startswith("# size:") for line in lines[:60])
    assert len(lines) <= WARN_LINES or reason, (
        f"{module.relative_to(PACKAGE)} has {len(lines)} lines: split it by what it holds, or say why it stays "
        "whole in a '# size: ...' comment below its docstring"
    )


def test_contributing_shows_every_folder() -> None:
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    folders = sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__")
    for folder in folders:
        assert f"{folder.name}/" in text, f"CONTRIBUTING.md's layout misses rloo/{folder}/"


@pytest.mark.system
def test_import_rloo_stays_light() -> None:
    code = "import sys, rloo, rloo.cli; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_training_folder_shows_the_step_and_keeps_the_rest_in_subfolders() -> None:
    entries = [p for p in (PACKAGE / "training").iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 18, f"rloo/training/ has {len(entries)} entries: move what is kept around the step down"
    for folder in ("checkpointing", "monitoring", "parallel", "setup"):
        assert (PACKAGE / "training" / folder / "__init__.py").is_file()


def test_tests_mirror_the_package() -> None:
    tests = PACKAGE.parent / "tests"
    for folder in tests.rglob("*"):
        if not folder.is_dir() or folder.name in ("__pycache__", "helpers") or "helpers" in folder.parts:
            continue
        mirrored = PACKAGE / folder.relative_to(tests)
        assert mirrored.is_dir(), f"tests/{folder.relative_to(tests)}/ mirrors no folder of rloo/: name it after one"
    for stage in STAGES:
        assert (tests / stage).is_dir(), f"tests/{stage}/ is missing: rloo/{stage}'s tests live there"


# the stages of rloo, lowest first: a module may import its own stage and the ones below it, never one above
# (``rloo`` is the package's __init__, whose lazy exports reach the config and the trainer)
STAGE_ORDER: tuple[tuple[str, ...], ...] = (
    ("algo",),
    ("suggest", "offline", "op_counts", "tiny", "waiting"),  # leaves: they import nothing of rloo
    ("config",),
    ("report",),
    ("generation",),
    ("forward",),
    ("data",),
    ("rewards",),
    ("tools",),
    ("pipeline",),
    ("training",),
    ("cli",),
    ("__main__", "rloo"),
)
LEVEL = {stage: level for level, stages in enumerate(STAGE_ORDER) for stage in stages}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """Ids of the nodes under ``if TYPE_CHECKING:``: annotations only, never run."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(sub) for sub in ast.walk(node))
    return hidden


def _imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:  # relative: from the module's package, up level - 1
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join([*parts, *([node.module] if node.module else [])])
    yield from (f"{base}.{alias.name}" for alias in node.names)  # a module, or a name in ``base``


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the rloo modules it imports (at the top or inside functions; not under ``TYPE_CHECKING``),
    a package's imports of its own parents left out."""
    modules = {module_name(path, package): path for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        hidden = _type_checking_nodes(tree)
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in hidden:
                for name in _imported_names(node, module, path.name == "__init__.py"):
                    while name and name not in modules:  # ``from pkg import name``: the module, or pkg
                        name = name.rpartition(".")[0]
                    if name and name != module and not module.startswith(name + "."):
                        targets.add(name)
        graph[module] = targets
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def stage_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "rloo"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for each import from a lower stage to a higher one (:data:`STAGE_ORDER`)."""
    return [
        f"{module} -> {target}"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if LEVEL[stage_of(target)] > LEVEL[stage_of(module)]
    ]


def test_every_part_of_rloo_has_a_stage() -> None:
    unplaced = sorted({stage_of(module) for module in import_graph()} - set(LEVEL))
    assert not unplaced, f"rloo/{unplaced[0]} has no place in STAGE_ORDER (tests/test_layout.py): add it there"


def test_no_import_circle() -> None:
    circles = import_circles(import_graph())
    assert not circles, (
        f"import circle: {' <-> '.join(circles[0])}. Move what both need into a module below them (a "
        "function-level import hides a circle, it does not remove it)"
    )


def test_no_import_runs_against_the_stage_order() -> None:
    upward = upward_imports(import_graph())
    assert not upward, (
        f"{upward[0]} imports from a higher stage (STAGE_ORDER in tests/test_layout.py): move the imported "
        "piece down to the importer's stage or below"
    )


def test_the_graph_checks_can_fail(tmp_path: Path) -> None:
    package = tmp_path / "rloo"
    for name, text in {
        "__init__.py": "",
        "algo/__init__.py": "",
        "algo/math.py": "from rloo.training import loop\n",  # upward, and a circle with loop
        "training/__init__.py": "",
        "training/loop.py": "from ..algo import math\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from rloo.cli import app\n",
        "cli/__init__.py": "",
        "cli/app.py": "def run():\n    from rloo.training.loop import x\n",
    }.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    graph = import_graph(package)
    assert graph["rloo.algo.math"] == {"rloo.training.loop"}
    assert graph["rloo.training.loop"] == {"rloo.algo.math"}  # relative, and TYPE_CHECKING left out
    assert graph["rloo.cli.app"] == {"rloo.training.loop"}  # inside a function: counted
    assert import_circles(graph) == [["rloo.algo.math", "rloo.training.loop"]]
    assert upward_imports(graph) == ["rloo.algo.math -> rloo.training.loop"]
