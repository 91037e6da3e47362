"""Every shipped run file validates (nothing is loaded: no network needed), and TRL's RLOO example
script runs with its import changed (offline, on a tiny stand-in)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rloo.cli.run_file import build_peft_config, load_run_file
from rloo.rewards.resolve import resolve_reward

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.yaml"))


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
