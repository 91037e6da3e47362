"""``rloo plan``: a run file's memory plan on a device, from the model's config.json alone (no weights)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from transformers import LlamaConfig

from rloo.cli.plan import plan_run
from rloo.cli.run_file import load_run_file
from rloo.training.setup.memory_plan import CUDA_OVERHEAD, GiB
from tests.helpers.cli import flat, invoke

PHASES = ("sampling", "log-probs", "training", "optimizer step")


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A folder holding only a tiny Llama's config.json."""
    folder = tmp_path / "model"
    LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ).save_pretrained(folder)
    assert [p.name for p in folder.iterdir()] == ["config.json"]
    return folder


def run_file(folder: Path, model: Path, **fields: Any) -> Path:
    """A run file; its dataset and reward functions are never loaded by ``rloo plan``."""
    values = {
        "model": str(model),
        "dataset": str(folder / "not-there.jsonl"),
        "reward_funcs": ["length"],
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_prompt_length": 128,
        "max_completion_length": 64,
        **fields,
    }
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_plan_on_an_h100_prints_the_phases_and_fits(tmp_path: Path, model_dir: Path) -> None:
    result = invoke("plan", run_file(tmp_path, model_dir), "--device", "h100")
    assert result.exit_code == 0, result.output
    output = flat(result.output)
    for phase in PHASES:
        assert phase in output
    assert "(peak)" in output and "KV cache" in output and "saved activations" in output
    assert "h100: 79.60 GiB" in output and "CUDA context" in output
    assert "fits," in output and "does not fit" not in output


def test_plan_reads_a_config_json_file_and_a_given_prompt_length(tmp_path: Path, model_dir: Path) -> None:
    path = run_file(tmp_path, model_dir / "config.json", max_prompt_length=None)
    result = invoke("plan", path, "--device", "cpu:64GiB", "--prompt-length", "64")
    assert result.exit_code == 0, result.output
    output = flat(result.output)
    assert "fits," in output and "CUDA context" not in output  # a CPU has no CUDA overhead


def test_plan_on_a_tiny_gpu_does_not_fit(tmp_path: Path, model_dir: Path) -> None:
    # 0.05 GiB is less than the CUDA context and allocator slack alone: no change to the run can fit it
    result = invoke("plan", run_file(tmp_path, model_dir), "--device", "0.05GiB")
    assert result.exit_code == 0, result.output
    assert "does not fit, and no single change here makes it fit" in flat(result.output)


def fix_lines(output: str) -> list[str]:
    lines = output.splitlines()
    start = next(n for n, line in enumerate(lines) if line.endswith("Each of these alone makes it fit:"))
    return [line.strip() for line in lines[start + 1 :] if line.startswith("  ")]


@pytest.mark.parametrize("cuda", [True, False])
def test_plan_that_does_not_fit_offers_fixes_that_fit(tmp_path: Path, model_dir: Path, cuda: bool) -> None:
    path = run_file(tmp_path, model_dir)
    _, _, memory = plan_run(load_run_file(path), None)
    size = 0.9 * memory.peak.total + (CUDA_OVERHEAD if cuda else 0.0)
    device = f"{size / GiB:.6f}GiB" if cuda else f"cpu:{size / GiB:.6f}GiB"
    result = invoke("plan", path, "--device", device)
    assert result.exit_code == 0, result.output
    assert "does not fit. Each of these alone makes it fit:" in flat(result.output)
    fixes = fix_lines(result.output)
    assert fixes, result.output
    # the first one, given as a run-file override, fits
    key, value = fixes[0].split(" (")[0].split(": ", 1)
    fixed = invoke("plan", path, f"{key}={value}", "--device", device)
    assert fixed.exit_code == 0, fixed.output
    assert "fits," in flat(fixed.output) and "does not fit" not in flat(fixed.output)


def test_plan_without_a_prompt_length_names_max_prompt_length(tmp_path: Path, model_dir: Path) -> None:
    result = invoke("plan", run_file(tmp_path, model_dir, max_prompt_length=None))
    assert result.exit_code == 2, result.output
    message = flat(result.stderr)
    assert "max_prompt_length" in message and "--prompt-length" in message


def test_plan_of_a_model_without_config_json_names_config_json(tmp_path: Path) -> None:
    empty = tmp_path / "weights-only"
    empty.mkdir()
    (empty / "model.safetensors").write_bytes(b"")
    result = invoke("plan", run_file(tmp_path, empty))
    assert result.exit_code == 2, result.output
    message = flat(result.stderr)
    assert "config.json" in message and str(empty) in message


def test_plan_of_an_unknown_device_names_the_choices(tmp_path: Path, model_dir: Path) -> None:
    result = invoke("plan", run_file(tmp_path, model_dir), "--device", "h1000")
    assert result.exit_code == 2, result.output
    message = flat(result.stderr)
    assert "h1000" in message and "h100, h200" in message and "cpu:<size>" in message


def test_plan_without_a_run_file_says_what_to_give() -> None:
    result = invoke("plan")
    assert result.exit_code == 2, result.output
    assert "give a run file" in flat(result.stderr)


def test_plan_takes_field_flags_and_its_own_options_in_either_spelling(tmp_path: Path, model_dir: Path) -> None:
    # the usage line advertises --field value; they were refused, and --prompt_length was not its option
    result = invoke(
        "plan", run_file(tmp_path, model_dir), "--beta", "0.1", "--num_generations", "8", "--prompt_length", "100"
    )
    assert result.exit_code == 0, result.output
    dashed = invoke(
        "plan", run_file(tmp_path, model_dir), "--beta", "0.1", "--num-generations", "8", "--prompt-length", "100"
    )
    assert flat(dashed.output) == flat(result.output)  # the same plan either way
    assert flat(result.output) != flat(invoke("plan", run_file(tmp_path, model_dir)).output)  # the flags count
