"""config.yaml of a run built in Python names its model, data and rewards, so `rloo train` re-runs it (issue 43)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml
from transformers import AutoModelForCausalLM

from rloo import GRPOConfig, GRPOTrainer
from rloo.cli.run_file import build_trainer, load_run_file
from rloo.training.checkpointing.run_folder import config_yaml
from rloo.training.checkpointing.run_record import import_path, run_record
from tests.helpers.models import always_one, dataset, frac7, trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_python_api_run_writes_a_config_yaml_rloo_train_runs(tmp_path: Path, files: dict[str, Path]) -> None:
    """Before: config.yaml held the config alone; `rloo train` refused it ("the run file needs `model`")
    and the report could not name the model. A loaded model is named by its name_or_path."""
    model = AutoModelForCausalLM.from_pretrained(files["model"])
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=4, max_completion_length=4
    )
    args = args.replace(max_steps=1, report_to=[])
    GRPOTrainer(model, [frac7, "tests.helpers.models:always_one"], args, str(files["data"])).train()
    written = tmp_path / "run" / "config.yaml"
    assert not written.read_text().startswith("#")  # nothing was left out
    recorded = yaml.safe_load(written.read_text())
    assert recorded["model"] == str(files["model"])
    assert recorded["dataset"] == str(files["data"])
    assert recorded["reward_funcs"] == ["tests.helpers.models:frac7", "tests.helpers.models:always_one"]
    run = load_run_file(written, [f"output_dir={tmp_path / 'again'}"])  # as `rloo train RUN/config.yaml` reads it
    assert run.model == str(files["model"]) and run.dataset.path == str(files["data"])
    assert run.config.max_steps == 1 and run.config.num_generations == 2
    again = build_trainer(run)
    assert again.rewards.funcs == [frac7, always_one]
    assert again.rewards.names == ["frac7", "always_one"]


def test_what_has_no_name_is_said_at_the_top_and_its_key_left_out(tmp_path: Path) -> None:
    def local_reward(completions: list[str], **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    t = trainer(tmp_path, reward_funcs=[frac7, local_reward, lambda completions, **kw: [1.0] * len(completions)])
    text = config_yaml(t.args.to_dict(), t.run_config)
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert header[0] == "# Written by the Python API. Not recorded here (a run file has no name for them):"
    model, data, local, anonymous = header[1:]
    assert "a transformers.LlamaForCausalLM built in memory (no name_or_path)" in model
    assert "save_pretrained(FOLDER) and write model: FOLDER" in model
    assert data.startswith("# dataset: a list of 40 rows (columns: answer, prompt), given in memory")
    assert local.startswith("# reward_funcs[1]: test_") and ".<locals>.local_reward: it has no import path" in local
    assert ".<locals>.<lambda>: it has no import path (a lambda, a local function" in anonymous
    loaded = yaml.safe_load(text)
    assert "model" not in loaded and "dataset" not in loaded and "reward_funcs" not in loaded
    written = tmp_path / "config.yaml"
    written.write_text(text)
    with pytest.raises(ValueError, match=r"the run file needs `model`"):  # the comment above says what to write
        load_run_file(written)


def test_each_kind_of_argument_is_recorded_by_the_name_a_run_file_gives_it() -> None:
    from datasets import Dataset
    from peft import LoraConfig

    from rloo.rewards.builtins import accuracy_reward

    record = run_record(
        "Qwen/Qwen2.5-0.5B-Instruct",
        (["accuracy", {"name": "tests.helpers.models:frac7"}, accuracy_reward], None),
        (Dataset.from_list(dataset(3)), Path("eval.jsonl")),
        LoraConfig(r=4, target_modules=["v_proj", "q_proj"]),
        "tests.helpers.models:answer_metrics",
    )
    assert dict(record) == {
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "eval_dataset": "eval.jsonl",
        "reward_funcs": ["accuracy", {"name": "tests.helpers.models:frac7"}, "rloo.rewards.builtins:accuracy_reward"],
        "peft": {"r": 4, "target_modules": ["q_proj", "v_proj"]},
        "compute_metrics": "tests.helpers.models:answer_metrics",
    }
    assert record.notes == [
        "dataset: a datasets.Dataset of 3 rows (columns: prompt, answer), given in memory; save it (e.g. "
        "Dataset.to_json('prompts.jsonl')) and write dataset: prompts.jsonl, or a hub dataset id (add it to re-run "
        "this file with `rloo train`)"
    ]
    # TRL's older reward_model; an environment or rollout_func cannot be given to rloo train
    older = run_record("m", (None, "tests.helpers.models:frac7"), ("d.jsonl", None), None, None, (None, frac7, None))
    assert older["reward_funcs"] == ["tests.helpers.models:frac7"]
    assert older.notes == ["rollout_func: a function, which a run file cannot give: re-run this run from Python"]


def test_an_import_path_is_one_that_gives_the_same_function_back() -> None:
    assert import_path(frac7) == "tests.helpers.models:frac7"
    assert import_path(functools.partial(frac7)) is None
    assert import_path(lambda: 0) is None
    assert import_path(GRPOTrainer.__init__) == "rloo.training.grpo_trainer:GRPOTrainer.__init__"
    main_function = type(frac7)(frac7.__code__, {}, "frac7")
    main_function.__module__ = "__main__"
    assert import_path(main_function) is None


def test_a_stopped_run_offers_rloo_train_only_when_its_config_yaml_re_runs_it() -> None:
    from rloo.training.monitoring.signals import interrupted_message

    run = Path("runs/rloo-2")
    assert interrupted_message(3, run / "checkpoint-3", run, cli=True) == (
        "interrupted at step 3: checkpoint saved to runs/rloo-2/checkpoint-3. Resume with "
        "trainer.train(resume_from_checkpoint=True) or `rloo train runs/rloo-2/config.yaml --resume`."
    )
    assert interrupted_message(3, run / "checkpoint-3", run, cli=False) == (
        "interrupted at step 3: checkpoint saved to runs/rloo-2/checkpoint-3. Resume with "
        "trainer.train(resume_from_checkpoint=True)."
    )
