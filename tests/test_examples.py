"""Every shipped run file validates (nothing is loaded: no network needed), TRL's RLOO example script runs
with its import changed (offline, on a tiny stand-in), and every offline example script (``examples/rloo_*.py``)
runs as a newcomer runs it and writes its run folder; an example that needs the network says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from rloo.cli.run_file import build_peft_config, load_run_file
from rloo.rewards.resolve import resolve_reward

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.yaml"))
SCRIPTS = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))
# the scripts a newcomer runs offline, each on a tiny model it builds, with --gpu for its GPU-sized twin
OFFLINE = [path for path in SCRIPTS if path.name.startswith("rloo_")]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_run_file_validates(path: Path) -> None:
    spec = load_run_file(path)
    assert spec.config.completions_per_generation % spec.config.num_generations == 0
    for reward in spec.reward_funcs:
        assert callable(resolve_reward(reward))
    if spec.peft is not None:
        build_peft_config(spec.peft)


def test_there_is_an_example() -> None:
    assert EXAMPLES


def _hub_cache_with_tiny_qwen3(cache: Path) -> None:
    """A local hub cache holding a tiny random Qwen3 under the id TRL's example loads."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rloo.tiny import build_char_tokenizer

    commit = "0" * 40
    repo = cache / "models--Qwen--Qwen3-0.6B"
    snapshot = repo / "snapshots" / commit
    tokenizer = build_char_tokenizer("0123456789+=?\\{}<>/ abcdefghijklmnopqrstuvwxyz.,")
    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        Qwen3ForCausalLM(config).save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)


@pytest.mark.system
def test_trls_rloo_example_runs_with_the_import_changed(tmp_path: Path) -> None:
    """TRL's examples/scripts/rloo.py, imports swapped and vLLM arguments removed, runs as written
    (offline: a tiny model under its hub id, NuminaMath-shaped rows, a recording hub client)."""
    import json
    import os
    import subprocess
    import sys

    from tests.helpers.processes import child_env

    _hub_cache_with_tiny_qwen3(tmp_path / "hub")
    env = {**child_env(), "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-m", "tests.helpers.trl_example", str(tmp_path)],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": os.pathsep.join([str(repo), env.get("PYTHONPATH", "")])},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    run = tmp_path / "Qwen3-0.6B-RLOO"
    assert (run / "adapter_model.safetensors").exists() and (run / "metrics.jsonl").exists()
    pushed = json.loads((tmp_path / "pushed.json").read_text())
    assert pushed["repo_id"] == "Qwen3-0.6B-RLOO" and "README.md" in pushed["files"]


def test_every_example_runs_offline_or_says_it_needs_the_network() -> None:
    assert len(OFFLINE) >= 3, "examples/rloo_*.py: the offline examples (plain, LoRA, tools)"
    for path in [*SCRIPTS, *EXAMPLES]:
        text = path.read_text()
        if path in OFFLINE:
            assert "offline" in text and "--gpu" in text, f"{path.name}: say it runs offline and name its --gpu twin"
            assert "has not been run by the tests" in text, f"{path.name}: say the GPU version is not run by the tests"
        else:
            assert "NEEDS THE NETWORK" in text, f"{path.name} is no offline example: label it NEEDS THE NETWORK"


@pytest.mark.parametrize("path", OFFLINE, ids=[p.name for p in OFFLINE])
def test_an_offline_examples_gpu_settings_are_a_valid_config(path: Path) -> None:
    """The GPU twin cannot run here (no GPU, no network), but its settings must make a valid config."""
    import runpy

    from rloo import RLOOConfig

    script = runpy.run_path(str(path))  # defines, does not run (the __main__ guard)
    for settings in (script["TINY"], script["GPU"]):
        config = RLOOConfig(output_dir="unused", **settings)
        assert config.completions_per_generation % config.num_generations == 0


@pytest.mark.system
@pytest.mark.parametrize("path", OFFLINE, ids=[p.name for p in OFFLINE])
def test_an_offline_example_runs_and_writes_its_run_folder(tmp_path: Path, path: Path) -> None:
    """``python examples/<script> --max-steps 3`` from another folder, as a newcomer runs it, with the hub and
    datasets offline: it trains and its run folder holds the config, the metrics, the report and the model."""
    import json
    import subprocess
    import sys

    from tests.helpers.processes import child_env

    env = child_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    run = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, str(path), "--max-steps", "3", "--output-dir", str(run)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    for name in ("config.yaml", "metrics.jsonl", "report.html", "final"):
        assert (run / name).exists(), f"{path.name} wrote no {name}: {sorted(p.name for p in run.iterdir())}"
    steps = [json.loads(line).get("step") for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(step for step in steps if step is not None) == 3
