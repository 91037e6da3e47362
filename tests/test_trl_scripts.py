"""TRL's own scripts run on rloo with only their imports changed.

``trl/scripts/rloo.py`` is read from the installed TRL (a dev dependency, pinned in pyproject.toml;
its text is never copied into this repository), its imports of ``RLOOConfig``, ``RLOOTrainer`` and
the rewards are pointed at rloo, and it runs as TRL's users run it: flags through TRL's
``TrlParser``, a ``ModelConfig`` and LoRA through TRL's ``get_peft_config``, assignments to the
config after parsing, ``trainer.accelerator``, ``trainer.end()``.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rloo.tiny import save_tiny_model
from tests.helpers.processes import child_env
from tests.helpers.serving import vllm_server

OURS = {"RLOOConfig", "RLOOTrainer"}


def with_rloo_imports(source: str) -> str:
    """``source`` with ``RLOOConfig``/``RLOOTrainer`` imported from rloo and ``trl.rewards`` as
    ``rloo.rewards``; every other line as it was."""

    def split_import(match: re.Match[str]) -> str:
        indent, names = match.group(1), [name.strip() for name in match.group(2).split(",")]
        theirs, ours = [n for n in names if n not in OURS], [n for n in names if n in OURS]
        lines = [f"{indent}from trl import {', '.join(theirs)}"] if theirs else []
        return "\n".join([*lines, *([f"{indent}from rloo import {', '.join(ours)}"] if ours else [])])

    source = re.sub(r"^( *)from trl import ([\w, ]+)$", split_import, source, flags=re.MULTILINE)
    return source.replace("from trl.rewards import", "from rloo.rewards import")


def trl_script(name: str) -> str:
    spec = importlib.util.find_spec(f"trl.scripts.{name}")
    assert spec is not None and spec.origin is not None, f"TRL's {name} script is missing: is trl installed?"
    return Path(spec.origin).read_text()


def test_only_import_lines_change() -> None:
    original = trl_script("rloo")
    changed = with_rloo_imports(original)
    assert changed != original
    removed = set(original.splitlines()) - set(changed.splitlines())
    added = set(changed.splitlines()) - set(original.splitlines())
    assert all(line.strip().startswith(("from trl", "from rloo")) for line in removed | added), removed | added
    assert "from rloo import RLOOTrainer" in changed and "from rloo.rewards import" in changed


def write_inputs(tmp_path: Path) -> dict[str, Path]:
    """A tiny model folder, a dataset folder (train and test splits, as load_dataset reads one)
    and a module of reward functions the script loads by dotted path."""
    model = save_tiny_model(tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 8), ("test", 4)):
        rows = [{"prompt": f"{i} plus {i} is", "solution": str(2 * i)} for i in range(n)]
        (data / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "my_rewards.py").write_text(
        "def short(completions, **kwargs):\n    return [-len(c) / 10 for c in completions]\n"
    )
    return {"model": model, "data": data}


def run_script(tmp_path: Path, source: str, *flags: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(source)
    return subprocess.run(
        [sys.executable, str(script), *flags],
        cwd=tmp_path,  # TRL's script imports a dotted reward function from the working directory
        env=child_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.system
def test_trls_rloo_script_trains_with_lora_and_evaluation(tmp_path: Path) -> None:
    inputs, out = write_inputs(tmp_path), tmp_path / "out"
    result = run_script(
        tmp_path,
        with_rloo_imports(trl_script("rloo")),
        *("--model_name_or_path", str(inputs["model"]), "--dataset_name", str(inputs["data"])),
        *("--reward_funcs", "think_format_reward", "my_rewards.short", "--reward_weights", "1.0", "0.5"),
        *("--output_dir", str(out), "--max_steps", "2", "--learning_rate", "1e-3", "--report_to", "none"),
        *("--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "6"),
        *("--eval_steps", "2", "--per_device_eval_batch_size", "4"),
        *("--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj"),
        "--model_init_kwargs",
        '{"low_cpu_mem_usage": true}',
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "Training completed." in result.stdout and f"Model saved to {out}." in result.stdout
    assert (out / "adapter_config.json").is_file()  # LoRA from TRL's get_peft_config, saved by save_model
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    # the assignment after parsing (training_args.model_init_kwargs = ...) reached config.yaml, merged
    assert recorded["model_init_kwargs"]["low_cpu_mem_usage"] is True
    assert recorded["model_init_kwargs"]["revision"] == "main"
    assert recorded["reward_weights"] == [1.0, 0.5]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("eval_reward" in row for row in logged)  # eval_steps without eval_strategy evaluates (rloo's rule)


@pytest.mark.system
def test_trls_rloo_script_trains_on_a_vllm_server(tmp_path: Path) -> None:
    """TRL's script with TRL's vLLM flags (server mode): its completions come from `rloo vllm-serve`."""
    inputs, out = write_inputs(tmp_path), tmp_path / "out"
    model = save_tiny_model(tmp_path / "model64", hidden_size=64, num_heads=2, max_positions=256)  # vLLM's CPU kernels
    with vllm_server(model) as url:
        result = run_script(
            tmp_path,
            with_rloo_imports(trl_script("rloo")),
            *("--model_name_or_path", str(model), "--dataset_name", str(inputs["data"])),
            *("--reward_funcs", "my_rewards.short", "--output_dir", str(out), "--max_steps", "2"),
            *("--per_device_train_batch_size", "4", "--num_generations", "2", "--max_completion_length", "6"),
            *("--report_to", "none", "--use_vllm", "--vllm_mode", "server", "--vllm_server_base_url", url),
        )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "Training completed." in result.stdout
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    assert recorded["use_vllm"] is True and recorded["vllm_server_base_url"] == url
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    gaps = [
        row["sampling/sampling_logp_difference/max"] for row in logged if "sampling/sampling_logp_difference/max" in row
    ]
    assert gaps and max(gaps) < 1e-3  # the server's samples, scored by the trainer at the same weights
