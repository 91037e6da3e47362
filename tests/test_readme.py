"""The README and the docs pages (docs/*.md, the site `make docs` builds) keep their promises: every Python
example runs as written (on tiny local model folders in place of hub ids), every relative link and anchor
points at something that exists, every page is in the site's nav, the README's parts the pages include
exist, and the README stays a short page for a newcomer. The generated tables are checked where they are
generated (tests/config/test_docs.py, tests/training/monitoring/test_health.py), the demo's numbers by the
demo's test (tests/cli/test_commands.py)."""

from __future__ import annotations

import re
from pathlib import Path
from textwrap import dedent

import pytest
import yaml

from rloo.tiny import DEFAULT_CHARS, save_tiny_model

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 300

FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
SNIPPET = re.compile(r'^--8<-- "([^":]+):([\w-]+)"$', flags=re.M)


def python_blocks(page: Path = README) -> list[str]:
    return [dedent(block) for block in re.findall(r"^ *```python\n(.*?)^ *```", page.read_text(), flags=re.S | re.M)]


def the_block(marker: str) -> tuple[Path, str]:
    """The one Python example, over the README and the docs pages, that contains ``marker``."""
    (found,) = [(page, block) for page in PAGES for block in python_blocks(page) if marker in block]
    return found


def run_block(page: Path, block: str) -> dict[str, object]:
    namespace: dict[str, object] = {}
    exec(compile(block, str(page.relative_to(REPO)), "exec"), namespace)
    return namespace


def test_the_readme_is_a_short_page() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move reference material to docs/"


def test_quickstart_example_runs_and_runs_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run twice in a row, as a newcomer does: before, the second run was refused (a fixed output_dir that the
    first run filled). Each run gets a fresh folder; neither is touched by the other."""
    example = python_blocks()[0]
    assert len([line for line in example.splitlines() if line.strip()]) <= 15
    save_tiny_model(tmp_path / "my-model", chars=DEFAULT_CHARS)
    monkeypatch.chdir(tmp_path)
    first = run_block(README, example)["trainer"].output_dir  # type: ignore[attr-defined]
    written = (Path(first) / "config.yaml").read_text()
    second = run_block(README, example)["trainer"].output_dir  # type: ignore[attr-defined]
    assert (first, second) == (Path("runs/rloo"), Path("runs/rloo-2"))
    for run in (first, second):
        assert (tmp_path / run / "final" / "model.safetensors").is_file()
    assert (Path(first) / "config.yaml").read_text() == written


def test_the_coming_from_trl_import_runs() -> None:
    from rloo import RLOOConfig, RLOOTrainer

    namespace = run_block(*the_block("# was: from trl import"))
    assert namespace["RLOOConfig"] is RLOOConfig and namespace["RLOOTrainer"] is RLOOTrainer


def test_the_compute_metrics_example_logs_its_metric(tmp_path: Path) -> None:
    from tests.helpers.models import dataset, trainer

    namespace = run_block(*the_block("def compute_metrics"))
    run = trainer(tmp_path)
    run.compute_metrics = namespace["compute_metrics"]  # type: ignore[assignment]
    rows = dataset(3)
    metrics = run.evaluate(rows)
    assert 0.0 <= metrics["eval_exact_match"] <= 1.0
    # by hand on what it computes: the share of completions that are exactly their answer
    assert namespace["compute_metrics"](  # type: ignore[operator]
        type("EvalPrediction", (), {"completions": ["1", " 2", "0"], "columns": {"answer": ["1", "2", "3"]}})
    ) == {"exact_match": 2 / 3}


def test_the_tools_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/tools.md's example, with a tiny model folder (the tool chat template) for Qwen/Qwen3-0.6B. Its
    generation config names every token an EOS, so each episode is one token and the example's 512-token
    budget costs nothing; the tool loop itself is tested in tests/tools/."""
    from rloo.tiny import TOOL_CHARS, TOOL_CHAT_TEMPLATE, build_char_tokenizer, build_tiny_llama

    page, block = the_block("tools=[multiply]")
    assert block.count('"Qwen/Qwen3-0.6B"') == 1
    tokenizer = build_char_tokenizer(TOOL_CHARS)
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    model = build_tiny_llama(len(tokenizer), max_positions=1024, tokenizer=tokenizer)
    model.generation_config.eos_token_id = list(range(len(tokenizer)))
    model.save_pretrained(tmp_path / "qwen3")
    tokenizer.save_pretrained(tmp_path / "qwen3")
    monkeypatch.chdir(tmp_path)
    namespace = run_block(page, block.replace('"Qwen/Qwen3-0.6B"', repr(str(tmp_path / "qwen3"))))
    state = namespace["trainer"].state  # type: ignore[attr-defined]
    assert state.global_step == 1 and any("tools/call_frequency" in row for row in state.log_history)


def test_every_python_example_is_run_by_a_test() -> None:
    """A new example must get a test above: this lists the ones there are."""
    run = ['RLOOTrainer(model="./my-model"', "# was: from trl import", "def compute_metrics", "tools=[multiply]"]
    for page in PAGES:
        for block in python_blocks(page):
            compile(block, str(page), "exec")
            assert sum(marker in block for marker in run) == 1, f"{page.name}: an example no test runs:\n{block}"


def slug(heading: str) -> str:
    """A heading's anchor as mkdocs (Python-Markdown's toc) and GitHub make it, for the headings used here."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(match) for match in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_point_at_files_and_anchors_that_exist(page: Path) -> None:
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name} links to {target}: no such file"
        if page.parent == DOCS:  # the site holds docs/ only: a link out of it is broken there
            assert resolved.parent == DOCS and resolved.suffix == ".md", f"{page.name} links out of docs/: {target}"
        if anchor:
            assert anchor in anchors(resolved), f"{page.name} links to {target}: no such heading"


def test_every_page_is_in_the_site_nav() -> None:
    def listed(entries: object) -> list[str]:
        if isinstance(entries, str):
            return [entries]
        if isinstance(entries, list):
            return [page for entry in entries for page in listed(entry)]
        assert isinstance(entries, dict)
        return [page for value in entries.values() for page in listed(value)]

    site = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert sorted(listed(site["nav"])) == sorted(page.name for page in DOCS.glob("*.md"))


def test_the_readme_parts_the_pages_include_exist() -> None:
    included = [(page, match) for page in DOCS.glob("*.md") for match in SNIPPET.findall(page.read_text())]
    assert {name for _, (_, name) in included} == {"setup", "demo", "quickstart"}
    for page, (source, name) in included:
        text = (REPO / source).read_text()
        start, end = f"<!-- --8<-- [start:{name}] -->", f"<!-- --8<-- [end:{name}] -->"
        assert text.count(start) == 1 and text.count(end) == 1, f"{page.name} includes {source}:{name}: no markers"
        assert text.index(start) < text.index(end)
