"""``rloo plan``: a run file's memory plan on a device, from the model's config.json alone (no weights)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from transformers import LlamaConfig

from rloo.cli.plan import load_plan_run, plan_run
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
    _, _, memory = plan_run(load_plan_run(str(path)), None, device="h100" if cuda else "cpu:1GiB")
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


def test_plan_needs_only_the_model_and_what_it_reads(tmp_path: Path, model_dir: Path) -> None:
    # it demanded `dataset` and `reward_funcs`, which it never reads, and suggested --dataset_name
    only = tmp_path / "only-model.yaml"
    only.write_text(yaml.safe_dump({"model": str(model_dir), "max_prompt_length": 128}))
    result = invoke("plan", only, "--device", "h100")
    assert result.exit_code == 0, result.output
    flags = invoke("plan", "--model_name_or_path", model_dir, "--max_prompt_length", "128", "--device", "h100")
    assert flags.exit_code == 0, flags.output
    assert flat(flags.output) == flat(result.output)


def test_plan_without_a_model_names_the_key_and_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "no-model.yaml"
    path.write_text(yaml.safe_dump({"max_prompt_length": 128, "num_generations": 4}))
    result = invoke("plan", path)
    assert result.exit_code == 2, result.output
    message = flat(result.stderr)
    assert "`model`" in message and "--model_name_or_path" in message and "dataset" not in message


def model_config_json(model_dir: Path) -> Path:
    """The model's config.json as a hub model holds it: with its dtype (a TRL flag's name too)."""
    path = model_dir / "config.json"
    values = json.loads(path.read_text())
    path.write_text(json.dumps({**values, "torch_dtype": "bfloat16"}))
    return path


def test_plan_of_a_model_config_json_plans_for_that_model(tmp_path: Path, model_dir: Path) -> None:
    # a model's config.json (model_type, architectures, torch_dtype) was refused as "a TRL config"
    config = model_config_json(model_dir)
    given = invoke("plan", config, "--max_prompt_length", "128", "--device", "h100")
    assert given.exit_code == 0, given.output
    as_run = tmp_path / "run-of-it.yaml"
    as_run.write_text(yaml.safe_dump({"model": str(config), "max_prompt_length": 128}))
    assert flat(given.output) == flat(invoke("plan", as_run, "--device", "h100").output)
    folder = invoke("plan", model_dir, "max_prompt_length=128", "--device", "h100")  # its folder too
    assert folder.exit_code == 0, folder.output
    assert "TRL config" not in flat(given.output + folder.output)


def test_train_given_a_model_config_json_says_what_to_pass(model_dir: Path) -> None:
    result = invoke("train", model_config_json(model_dir))
    assert result.exit_code == 2, result.output
    message = flat(result.stderr)
    assert "TRL config" not in message and "config.json" in message and "--model_name_or_path" in message


def assumptions(output: str) -> str:
    """The block ``rloo plan`` prints before its table."""
    lines = output.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("Assumed"))
    end = next(n for n, line in enumerate(lines) if "Predicted peak memory" in line)
    assert start < end
    return flat("\n".join(lines[start:end]))


def test_plan_prints_the_dtype_batch_lengths_and_processes_it_assumed(tmp_path: Path, model_dir: Path) -> None:
    result = invoke("plan", run_file(tmp_path, model_dir), "--device", "h100", "--processes", "2")
    assert result.exit_code == 0, result.output
    block = assumptions(result.output)
    assert "dtype: float32 weights, bf16 autocast (bf16 unset: on, as on any GPU that has it" in block
    assert "batch: 8 completions per pass (per_device_train_batch_size), 8 per generation batch" in block
    assert "2 prompts x num_generations 4" in block
    assert "lengths: prompt 128 tokens (max_prompt_length), completion 64 tokens (max_completion_length)" in block
    assert "processes: 2" in block
    cpu = assumptions(invoke("plan", run_file(tmp_path, model_dir), "--device", "cpu:64GiB").output)
    assert "dtype: float32 throughout (bf16 unset: off on a CPU)" in cpu
    off = assumptions(invoke("plan", run_file(tmp_path, model_dir), "bf16=false", "--prompt-length", "100").output)
    assert "dtype: float32 throughout (bf16=false)" in off and "prompt 100 tokens (--prompt-length)" in off
    half = run_file(tmp_path, model_dir, model_init_kwargs={"dtype": "bfloat16"})
    assert "dtype: bfloat16 weights and compute (model_init_kwargs.dtype)" in assumptions(invoke("plan", half).output)
