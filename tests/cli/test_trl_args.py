"""TRL's command line on ``rloo train``: ``trl rloo ...`` flags, ``--config``, and ``--help`` listing
every field (CPU, tiny model)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from rloo.cli.trl_args import TRL_LORA_DEFAULTS, parse_tokens, trl_to_run
from rloo.config import RLOOConfig
from rloo.config.fields.declare import default_value
from rloo.tiny import save_tiny_model
from tests.helpers.cli import flat, invoke
from tests.helpers.processes import child_env
from tests.helpers.trl_port import zen_repository

pytestmark = pytest.mark.usefixtures("one_thread")


def test_flags_take_the_tokens_their_kind_says() -> None:
    tokens = [
        "run.yaml",
        "--learning_rate",
        "1e-5",
        "--use_peft",
        "--lora_target_modules",
        "q_proj",
        "v_proj",
        "--bf16",
        "false",
        "--output_dir=runs/x",
        "peft.r=8",
        "--generation_kwargs",
        '{"stop_strings": ["\\n\\n"]}',
        "--eval_steps",
        "None",
        "--run-name",
        "a: b",
    ]
    run_file, overrides, flags = parse_tokens(tokens)
    assert run_file == "run.yaml" and overrides == ["peft.r=8"]
    assert flags == {
        "learning_rate": "1e-5",  # YAML reads 1e-5 as text; the run file's type check makes it a float
        "use_peft": True,
        "lora_target_modules": ["q_proj", "v_proj"],
        "bf16": False,
        "output_dir": "runs/x",
        "generation_kwargs": {"stop_strings": ["\n\n"]},
        "eval_steps": None,
        "run_name": "a: b",  # text YAML would read as a mapping stays text
    }


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (["--lerning_rate", "1"], "unknown flag `--lerning_rate`; did you mean `learning_rate`?"),
        (["x.yaml", "--use_peft", "maybe"], "override 'maybe' must look like key=value"),
        (["--bf16=maybe"], "--bf16 takes true or false, got 'maybe'"),
        (["--learning_rate"], "--learning_rate needs a value"),
        (["--generation_kwargs", "[1]"], "--generation_kwargs takes a JSON object"),
        # a TRL setting rloo refuses gets TRL's reason, as in Python, not a bare "unknown flag"
        (["--hub_token", "x"], "`--hub_token` is a TRL setting rloo does not support"),
        (
            ["a.yaml", "b.yaml"],
            "override 'b.yaml' must look like key=value (e.g. learning_rate=1e-5); the run file is 'a.yaml'",
        ),
    ],
)
def test_bad_flags_are_named(tokens: list[str], message: str) -> None:
    with pytest.raises(ValueError) as error:
        parse_tokens(tokens)
    assert message in str(error.value)


def test_trl_script_and_model_flags_become_the_run_file() -> None:
    assert TRL_LORA_DEFAULTS == {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "task_type": "CAUSAL_LM"}
    run = trl_to_run(
        {
            "model_name_or_path": "Qwen/Qwen3-0.6B",
            "dataset_name": "trl-lib/DeepMath-103K",
            "dataset_config": "default",
            "eval_strategy": "steps",
            "dataset_test_split": "validation",
            "reward_model_name_or_path": "my/reward-model",
            "reward_funcs": ["accuracy_reward", "get_soft_overlong_punishment", "my_lib.rewards.custom", "format"],
            "dtype": "bfloat16",
            "attn_implementation": "sdpa",
            "model_revision": "main",
            "use_peft": True,
            "lora_r": 8,
            "lora_target_modules": ["q_proj"],
            "gradient_checkpointing_use_reentrant": False,
            "learning_rate": "1e-5",
        }
    )
    assert run == {
        "model": "Qwen/Qwen3-0.6B",
        "dataset": {"path": "trl-lib/DeepMath-103K", "name": "default", "split": "train"},
        "eval_dataset": {"path": "trl-lib/DeepMath-103K", "name": "default", "split": "validation"},
        "reward_funcs": [
            "my/reward-model",
            "accuracy",
            {"name": "soft_overlong_punishment", "max_completion_len": 1280, "soft_punish_cache": 256},
            "my_lib.rewards:custom",
            "format",
        ],
        "model_init_kwargs": {"revision": "main", "dtype": "bfloat16", "attn_implementation": "sdpa"},
        "peft": {
            "r": 8,
            "lora_alpha": 32,
            "lora_dropout": 0.05,
            "task_type": "CAUSAL_LM",
            "target_modules": ["q_proj"],
        },
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
        "eval_strategy": "steps",
        "learning_rate": "1e-5",
    }


def test_no_eval_set_unless_an_eval_strategy_asks_as_trls_script() -> None:
    assert "eval_dataset" not in trl_to_run({"dataset_name": "d", "eval_strategy": "no"})
    assert "eval_dataset" not in trl_to_run({"dataset_name": "d"})


def test_eval_steps_evaluates_on_the_test_split_as_eval_strategy_follows_it() -> None:
    # before: only an eval_strategy made the test split the eval set, so --dataset_test_split X
    # --eval_steps N failed with "RLOOConfig.eval_steps=N needs an eval_dataset"
    run = trl_to_run({"dataset_name": "d", "dataset_test_split": "validation", "eval_steps": 5})
    assert run["eval_dataset"] == {"path": "d", "name": None, "split": "validation"}
    assert "eval_dataset" not in trl_to_run({"dataset_name": "d", "eval_steps": 5, "eval_strategy": "no"})
    with pytest.warns(UserWarning, match="--dataset_test_split validation ignored: nothing asks for evaluation"):
        assert "eval_dataset" not in trl_to_run({"dataset_name": "d", "dataset_test_split": "validation"})


def test_the_test_split_with_eval_steps_is_evaluated_on(tmp_path: Path, files: dict[str, Path]) -> None:
    import datasets

    rows = [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(7)]
    splits = {"train": datasets.Dataset.from_list(rows[:4]), "held": datasets.Dataset.from_list(rows[4:])}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "sums"))
    result = invoke(
        "train",
        *("--model_name_or_path", files["model"], "--dataset_name", tmp_path / "sums", "--dataset_test_split", "held"),
        *("--eval_steps", "1", "--reward_funcs", "tests.helpers.models.always_one", "--output_dir", tmp_path / "run"),
        *("--max_steps", "1", "--num_generations", "2", "--per_device_train_batch_size", "4"),
        *("--max_completion_length", "2", "--logging_steps", "1"),
    )
    assert result.exit_code == 0, result.output
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["eval_reward"] for row in metrics if "eval_reward" in row] == [1.0]
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["eval_dataset"]["split"] == "held"


def test_a_trl_config_given_as_the_run_file_suggests_config(tmp_path: Path) -> None:
    # before: "the run file needs `model`", though the file names the model (as model_name_or_path)
    config = tmp_path / "trl.yaml"
    trl = {"model_name_or_path": "m", "dataset_name": "d", "reward_funcs": ["r"]}
    config.write_text(yaml.safe_dump(trl, sort_keys=False))
    result = invoke("train", config)
    assert result.exit_code == 2
    assert (
        f"'{config}' holds TRL's flags (model_name_or_path, dataset_name), not run-file keys: it is a TRL config; "
        f"give it with --config, as trl rloo takes it: rloo train --config {config}" in flat(result.stderr)
    )


def test_a_missing_prompt_column_names_the_override_that_maps_one(tmp_path: Path, files: dict[str, Path]) -> None:
    from rloo.cli.run_file import load_run_file

    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+1=", "answer": str(a + 1)}) + "\n" for a in range(2)))
    flags = ["--model_name_or_path", files["model"], "--dataset_name", data, "--reward_funcs", "accuracy_reward"]
    result = invoke("train", *flags, "--output_dir", tmp_path / "run")
    assert result.exit_code == 2
    message = flat(result.stderr)
    assert "dataset has no `prompt` column (columns: question, answer)" in message
    assert "'dataset.columns={question: prompt}' on rloo train's command line" in message
    assert "`columns: {question: prompt}` under `dataset:`" in message
    assert "dataset.rename_column('question', 'prompt') in Python" in message
    # the override it names works
    run = load_run_file(
        None, ["dataset.columns={question: prompt}"], {"model": "m", "dataset": str(data), "reward_funcs": ["accuracy"]}
    )
    assert run.dataset.load()["prompt"] == ["0+1=", "1+1="]


def test_lora_flags_without_use_peft_are_ignored_with_a_warning_as_in_trl() -> None:
    with pytest.warns(UserWarning, match="--lora_r, --lora_alpha ignored without --use_peft"):
        run = trl_to_run({"lora_r": 4, "lora_alpha": 8})
    assert "peft" not in run
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert trl_to_run({"use_peft": False}) == {}


def test_quantization_details_without_quantized_loading_are_ignored_with_a_warning() -> None:
    with pytest.warns(UserWarning, match="--bnb_4bit_quant_type ignored: they only apply to --load_in_4bit"):
        assert trl_to_run({"bnb_4bit_quant_type": "nf4", "use_bnb_nested_quant": False}) == {}


def test_trls_quantized_loading_flags_become_the_quantization_config() -> None:
    # TRL's get_quantization_config: 4 bits computed in the model's dtype, NF4 unless asked otherwise
    run = trl_to_run({"load_in_4bit": True, "use_bnb_nested_quant": True, "dtype": "bfloat16", "use_peft": True})
    assert run["model_init_kwargs"]["quantization_config"] == {
        "load_in_4bit": True,
        "bnb_4bit_compute_dtype": "bfloat16",
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_quant_storage": "bfloat16",
    }
    assert "peft" in run
    assert trl_to_run({"load_in_8bit": True})["model_init_kwargs"] == {"quantization_config": {"load_in_8bit": True}}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"load_in_4bit": True, "load_in_8bit": True}, "--load_in_4bit and --load_in_8bit: give one"),
        ({"datasets": ["a"]}, "--datasets: dataset mixtures are not supported"),
        ({"dataset_streaming": True}, "--dataset_streaming: rloo train reads its dataset into memory"),
        ({"model_name_or_path": "a", "model": "b"}, "--model_name_or_path and `model` give two different values"),
    ],
)
def test_what_rloo_cannot_do_is_refused_naming_the_flag(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        trl_to_run(flags)


def test_trls_documented_command_line_resolves_with_the_program_name_changed(tmp_path: Path) -> None:
    # the command TRL's RLOO docs show, with `trl rloo` -> `rloo train`; --print-config loads nothing
    result = invoke(
        "train",
        "--model_name_or_path",
        "Qwen/Qwen2-0.5B-Instruct",
        "--dataset_name",
        "trl-lib/DeepMath-103K",
        "--reward_funcs",
        "accuracy_reward",
        "--output_dir",
        str(tmp_path / "Qwen2-0.5B-RLOO"),
        "--learning_rate",
        "1e-6",
        "--num_generations",
        "8",
        "--per_device_train_batch_size",
        "8",
        "--print-config",
    )
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load(result.stdout)
    assert resolved["model"] == "Qwen/Qwen2-0.5B-Instruct"
    assert resolved["dataset"]["path"] == "trl-lib/DeepMath-103K" and resolved["dataset"]["split"] == "train"
    assert resolved["reward_funcs"] == ["accuracy"]
    assert (resolved["learning_rate"], resolved["num_generations"]) == (1e-6, 8)


def test_config_file_with_env_and_flags_that_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RLOO_TEST_VARIABLE", raising=False)
    config = tmp_path / "rloo.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "model_name_or_path": "some/model",
                "dataset_name": "some/data",
                "reward_funcs": ["think_format_reward"],
                "learning_rate": 3e-6,
                "num_generations": 4,
                "env": {"RLOO_TEST_VARIABLE": "set"},
            }
        )
    )
    result = invoke("train", "--config", config, "--learning_rate", "5e-6", "--print-config")
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load(result.stdout)
    assert (resolved["learning_rate"], resolved["num_generations"]) == (5e-6, 4)
    assert resolved["reward_funcs"] == ["think_format"]
    import os

    assert os.environ["RLOO_TEST_VARIABLE"] == "set"
    monkeypatch.delenv("RLOO_TEST_VARIABLE")


def test_a_run_file_flags_and_overrides_combine_in_that_order(tmp_path: Path, files: dict[str, Path]) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(
        yaml.safe_dump(
            {"model": str(files["model"]), "dataset": str(files["data"]), "reward_funcs": ["accuracy"], "seed": 1}
        )
    )
    result = invoke("train", run, "--seed", "2", "--max_steps", "3", "max_steps=4", "--print-config")
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load(result.stdout)
    assert (resolved["seed"], resolved["max_steps"]) == (2, 4)


def test_missing_pieces_name_the_trl_flag() -> None:
    result = invoke("train", "--dataset_name", "d", "--reward_funcs", "accuracy_reward")
    assert result.exit_code == 2
    assert "the run file needs `model` (on the command line: --model_name_or_path)" in flat(result.output)
    assert "give a run file" in flat(invoke("train").output)


def test_training_from_trl_flags_alone(tmp_path: Path, files: dict[str, Path]) -> None:
    out = tmp_path / "run"
    result = invoke(
        "train",
        "--model_name_or_path",
        files["model"],
        "--dataset_name",
        files["data"],
        "--reward_funcs",
        "tests.helpers.models.always_one",  # TRL's dotted import path
        "--output_dir",
        out,
        "--max_steps",
        "2",
        "--num_generations",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--max_completion_length",
        "4",
        "--logging_steps",
        "1",
        "--use_peft",
        "--lora_r",
        "4",
        "--lora_target_modules",
        "q_proj",
        "v_proj",
    )
    assert result.exit_code == 0, result.output
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in metrics if "reward" in row] == [1, 2]
    assert all(row["reward"] == 1.0 for row in metrics if "reward" in row)
    adapter = json.loads((out / "final" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    assert recorded["reward_funcs"] == ["tests.helpers.models:always_one"]


def test_train_help_lists_every_config_field_with_its_default() -> None:
    result = invoke("train", "--help")
    assert result.exit_code == 0
    text = flat(result.output)
    for field in dataclasses.fields(RLOOConfig):
        if field.init:
            assert f"--{field.name} (default {default_value(field)!r})" in text, field.name
    assert "--model_name_or_path" in text and "--use_peft" in text


def test_grpo_names_and_fields_rloo_lacks_as_flags(tmp_path: Path) -> None:
    # before: `--loss_type dapo` was "unknown flag ... did you mean `--lora_task_type`?"
    common = ["--model_name_or_path", "m", "--dataset_name", "d", "--reward_funcs", "think_format_reward"]
    result = invoke("train", *common, "--loss_type", "dapo", "--scale_rewards", "false", "--print-config")
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load(result.stdout)
    assert resolved["loss_aggregation"] == "token_mean" and resolved["advantage_estimator"] == "group_mean"
    result = invoke("train", *common, "--deepspeed", "ds.json")
    assert result.exit_code == 2
    assert "`--deepspeed` is a TRL setting rloo does not support" in flat(result.stderr)
    assert "FSDP2" in flat(result.stderr) and "did you mean" not in result.stderr


def test_a_config_file_that_is_not_a_yaml_mapping_names_the_line_or_the_shape(tmp_path: Path) -> None:
    # issue 41: --config reads through the run file's YAML reader (cli/files.py): a syntax error names its line
    # and column (it printed PyYAML's multi-line message), and a list is refused as a run file's is
    from rloo.cli.trl_args import read_config_file

    broken = tmp_path / "broken.yaml"
    broken.write_text("learning_rate: 1e-5\n  beta: [0.1\n")
    with pytest.raises(ValueError, match=r"--config '.*broken.yaml' is not valid YAML: line 2, column \d+: "):
        read_config_file(str(broken))
    listed = tmp_path / "list.yaml"
    listed.write_text("- learning_rate\n")
    with pytest.raises(ValueError, match=r"--config '.*list.yaml' must be a YAML mapping of flags to values"):
        read_config_file(str(listed))


def test_report_to_none_is_the_name_none() -> None:
    # before: `--report_to none` became [None] ("entry 0 is None"): `none` is no unset optional in a list
    assert parse_tokens(["--report_to", "none"])[2] == {"report_to": ["none"]}
    assert parse_tokens(["--lora_target_modules", "None", "q_proj"])[2] == {"lora_target_modules": ["None", "q_proj"]}


@pytest.mark.system
def test_trls_cli_test_command_trains_with_local_folders(tmp_path: Path, reward_model_dir: Path) -> None:
    # TRL's tests/test_cli.py::test_rloo with `trl rloo` -> `rloo train`, its hub ids -> local folders (a clone of
    # the zen dataset), bounded to one step of 2 rows, and a reward function beside the reward model
    policy = save_tiny_model(tmp_path / "tiny-Qwen2ForCausalLM-2.5")
    zen = zen_repository(tmp_path / "zen")
    out = tmp_path / "out"
    flags = ["--output_dir", out, "--model_name_or_path", policy, "--reward_model_name_or_path", reward_model_dir]
    flags += ["--dataset_name", zen, "--dataset_config", "standard_prompt_only", "--num_generations", "2"]
    flags += ["--max_completion_length", "32", "--report_to", "none", "--max_steps", "1"]
    flags += ["--per_device_train_batch_size", "2", "--reward_funcs", "think_format_reward"]
    result = subprocess.run(
        [sys.executable, "-m", "rloo", "train", *map(str, flags)],
        env=child_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    (logged,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"reward"' in line]
    assert logged["step"] == 1 and {"rewards/tiny-rm/mean", "rewards/think_format/mean"} <= set(logged)
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    assert (recorded["dataset"]["path"], recorded["dataset"]["name"]) == (str(zen), "standard_prompt_only")
    assert recorded["report_to"] == ["none"] and (out / "final" / "model.safetensors").is_file()
