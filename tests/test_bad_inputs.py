"""User mistakes, through the Python API and the ``rloo`` command: each gives one clear error.

Every case checks the error's type (``ValueError`` and friends in Python; exit code 2 and one
``error:`` line on stderr from the CLI, never a traceback) and message text that names what
is wrong (the field, row, function, file or option) and says what to do about it. Nearly all
of them fail before any training step, on a tiny local model (offline, CPU).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import pytest
from typer.testing import Result

from rloo import RLOOConfig, RLOOTrainer
from tests.helpers.cli import DROP, flat, invoke, run_file
from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer, tiny_reward_model
from tests.helpers.sandbox import needs_bwrap

pytestmark = pytest.mark.usefixtures("one_thread")


def assert_usage_error(result: Result, *parts: str) -> str:
    """Exit code 2, one ``error:`` line holding every part, and no traceback; returns the stderr."""
    message = flat(result.stderr)
    assert result.exit_code == 2, (result.exit_code, message, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception  # not an escaped exception
    assert "Traceback" not in result.output
    assert "error:" in message, message
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
    return message


def build(tmp_path: Path, **changes: Any) -> RLOOTrainer:
    """An ``RLOOTrainer`` on a tiny model; ``changes`` replace its keyword arguments."""
    tok = make_tokenizer()
    kwargs: dict[str, Any] = {
        "model": make_model(tok),
        "reward_funcs": frac7,
        "args": config(tmp_path, num_generations=2, per_device_train_batch_size=2, max_completion_length=2),
        "train_dataset": dataset(8),
        "processing_class": tok,
    }
    kwargs.update(changes)
    return RLOOTrainer(**kwargs)


# ============================================================================ RLOOConfig
CONFIG_CASES: list[tuple[dict[str, Any], str, Any, list[str]]] = [
    (
        {"num_generations": 4, "per_device_train_batch_size": 8, "generation_batch_size": 12},
        "generation_batch_size",
        12,
        ["must be a multiple of per_device_train_batch_size (8)"],
    ),
    (
        {"generation_batch_size": 16, "steps_per_generation": 2},
        "generation_batch_size",
        16,
        ["set either generation_batch_size or steps_per_generation, not both"],
    ),
    (
        {"steps_per_generation": 3, "gradient_accumulation_steps": 2},
        "steps_per_generation",
        3,
        ["must be a multiple of gradient_accumulation_steps (2)"],
    ),
    ({"report_to": ["tensorbord"]}, "report_to", ["tensorbord"], ["each entry must be one of", "'tensorboard'"]),
    ({"lr_scheduler_type": "cosin"}, "lr_scheduler_type", "cosin", ["choose one of", "'cosine'"]),
    ({"preset": "grp"}, "preset", "grp", ["choose one of", "'grpo'"]),
    ({"kl_estimator": "k4"}, "kl_estimator", "k4", ["choose one of ['k1', 'k2', 'k3']"]),
    ({"advantage_estimator": "rlo"}, "advantage_estimator", "rlo", ["choose one of", "'rloo'"]),
    ({"loss_aggregation": "mean"}, "loss_aggregation", "mean", ["choose one of", "'token_mean'"]),
    ({"ratio_level": "seq"}, "ratio_level", "seq", ["choose one of ['sequence', 'token']"]),
    ({"temperature": 0}, "temperature", 0, ["must be > 0", "0.01 for near-greedy"]),
    ({"top_p": 1.5}, "top_p", 1.5, ["must be in (0, 1]"]),
    ({"num_generations": 1}, "num_generations", 1, ["needs at least 2 completions per prompt", "use 2 or more"]),
    ({"beta": float("nan")}, "beta", float("nan"), ["must be finite"]),
    ({"epsilon": 1.5}, "epsilon", 1.5, ["must be < 1"]),
    ({"reward_error_policy": "ignore"}, "reward_error_policy", "ignore", ["choose one of ['raise', 'skip']"]),
    ({"reward_timeout": 0}, "reward_timeout", 0, ["must be > 0 seconds, or None for no limit"]),
    ({"reward_clip_range": (1.0, -1.0)}, "reward_clip_range", (1.0, -1.0), ["give (min, max) with min <= max"]),
    ({"warmup_ratio": 1.0}, "warmup_ratio", 1.0, ["must be in [0, 1)"]),
    ({"max_steps": 0}, "max_steps", 0, ["must be >= 1, or -1 to train for num_train_epochs"]),
    ({"save_total_limit": 0}, "save_total_limit", 0, ["or None to keep every checkpoint"]),
    ({"learning_rate": -1e-5}, "learning_rate", -1e-5, ["must be > 0"]),
]


@pytest.mark.parametrize(("kwargs", "name", "value", "fix"), CONFIG_CASES, ids=[c[1] for c in CONFIG_CASES])
def test_config_value_error_names_field_value_and_fix(
    kwargs: dict[str, Any], name: str, value: Any, fix: list[str]
) -> None:
    with pytest.raises(ValueError) as info:
        RLOOConfig(**kwargs)
    message = str(info.value)
    assert message.startswith(f"RLOOConfig.{name}={value!r} is invalid: "), message
    for part in fix:
        assert part in message, message


def test_config_from_dict_with_a_typo_suggests_the_field() -> None:
    with pytest.raises(ValueError, match=r"^unknown RLOOConfig field `learnig_rate`; did you mean `learning_rate`\?"):
        RLOOConfig.from_dict({"learnig_rate": 1e-5})


def test_assigning_to_a_config_a_trainer_took_says_to_use_replace() -> None:
    args = RLOOConfig(num_generations=4)
    args.freeze()  # what RLOOTrainer does when it takes it
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"cannot set `num_generations`.*args\.replace\("):
        args.num_generations = 8
    with pytest.raises(ValueError, match=r"^RLOOConfig\.temperature=-1 is invalid: must be > 0"):
        args.replace(temperature=-1)  # the copy is validated like a new config


# ============================================================================ RLOOTrainer
def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def needs_solution(completions: list[Any], solution: list[str]) -> list[float]:
    """A tutorial-style reward that requires a `solution` column the dataset does not have."""
    return [float(c == s) for c, s in zip(completions, solution, strict=True)]


# (id, trainer keyword arguments given tmp_path, expected error type, message parts)
TRAINER_CASES: list[tuple[str, Callable[[Path], dict[str, Any]], type[Exception], list[str]]] = [
    (
        "reward-name-typo",
        lambda tmp: {"reward_funcs": "acuracy"},
        ValueError,
        ["unknown reward `acuracy`; did you mean `accuracy`?", "Built-in rewards: accuracy"],
    ),
    (
        "reward-not-callable",
        lambda tmp: {"reward_funcs": [frac7, 3]},
        ValueError,
        ["reward function 1 (3) is a int", "give a callable, a name"],
    ),
    (
        "reward-dict-without-name",
        lambda tmp: {"reward_funcs": {"weight": 2.0}},
        ValueError,
        ["reward spec {'weight': 2.0} has no 'name'", "Built-in rewards: accuracy"],
    ),
    (
        "reward-weights-count",
        lambda tmp: {"args": config(tmp, num_generations=2, reward_weights=[1.0, 2.0])},
        ValueError,
        ["reward_weights has 2 entries but there are 1 reward functions", "give one weight per function"],
    ),
    (
        "reward-model-without-tokenizer",
        lambda tmp: {"reward_funcs": [frac7, tiny_reward_model(make_tokenizer())]},
        ValueError,
        ["reward function 1 is a LlamaForSequenceClassification", "reward_processing_classes at position 1"],
    ),
    (
        "reward-processing-classes-count",
        lambda tmp: {"reward_processing_classes": [None, None]},
        ValueError,
        ["reward_processing_classes has 2 entries for 1 reward functions", "give one per reward function"],
    ),
    (
        "model-not-a-model",
        lambda tmp: {"model": 3},
        ValueError,
        ["model must be a path, a hub id, a PreTrainedModel or a peft PeftModel, got int"],
    ),
    (
        "model-instance-without-tokenizer",
        lambda tmp: {"processing_class": None},
        ValueError,
        ["the model instance has no name_or_path", "pass its tokenizer as processing_class"],
    ),
    (
        "no-train-dataset",
        lambda tmp: {"train_dataset": None},
        ValueError,
        ["train_dataset is required", "a list of dicts or a file path"],
    ),
    (
        "no-prompt-column",
        lambda tmp: {"train_dataset": [{"question": "1+1=", "answer": "2"}]},
        ValueError,
        ["dataset has no `prompt` column (columns: question, answer)", "rename the prompt column to `prompt`"],
    ),
    (
        "hf-dataset-without-prompt-column",
        lambda tmp: {"train_dataset": datasets.Dataset.from_list([{"text": "1+1="}])},
        ValueError,
        ["dataset has no `prompt` column (columns: text)", "rename the prompt column to `prompt`"],
    ),
    (
        "eval-dataset-without-prompt-column",
        lambda tmp: {"eval_dataset": [{"q": "1+1="}]},
        ValueError,
        ["dataset has no `prompt` column (columns: q)", "rename the prompt column to `prompt`"],
    ),
    (
        "int-prompts",
        lambda tmp: {"train_dataset": [{"prompt": 7}, {"prompt": 8}]},
        ValueError,
        ["invalid prompt in row 0: the prompt is a int", "expected a non-empty str or a non-empty list", "2 of 2 rows"],
    ),
    (
        "none-prompt-in-row-1",
        lambda tmp: {"train_dataset": [{"prompt": "1+1="}, {"prompt": None}]},
        ValueError,
        ["invalid prompt in row 1: the prompt is a NoneType; expected a non-empty str", "(1 of 2 rows are invalid)"],
    ),
    (
        "message-without-role",
        lambda tmp: {"train_dataset": [{"prompt": [{"content": "1+1="}]}]},
        ValueError,
        ["invalid prompt in row 0: message 0 `role` is missing; expected a str"],
    ),
    (
        "message-without-content",
        lambda tmp: {"train_dataset": [{"prompt": [{"role": "user"}]}]},
        ValueError,
        ["invalid prompt in row 0: message 0 `content` is missing; expected a str"],
    ),
    (
        "plain-strings-not-dicts",
        lambda tmp: {"train_dataset": ["1+1=", "2+2="]},
        ValueError,
        ["cannot load prompts from list", "give a datasets.Dataset", "a list of dicts"],
    ),
    (
        "columns-dict-not-rows",
        lambda tmp: {"train_dataset": {"prompt": ["1+1="]}},
        ValueError,
        ["cannot load prompts from dict", "a list of dicts"],
    ),
    (
        "unknown-file-suffix",
        lambda tmp: {"train_dataset": _write(tmp / "prompts.txt", "1+1=\n")},
        ValueError,
        ["cannot load prompts from a .txt file", "a path to a .json, .jsonl or .parquet file"],
    ),
    (
        "missing-dataset-file",
        lambda tmp: {"train_dataset": str(tmp / "nope.jsonl")},
        FileNotFoundError,
        ["prompt data path", "nope.jsonl' does not exist"],
    ),
    (
        "unknown-chat-role",
        lambda tmp: {"train_dataset": [{"prompt": [{"role": "usr", "content": "1+1="}]}]},
        ValueError,
        ["invalid prompt in row 0: message 0 has role 'usr': use one of system", "(did you mean `user`?)"],
    ),
    (
        "eval-steps-without-eval-dataset",
        lambda tmp: {"args": config(tmp, eval_steps=5)},
        ValueError,
        ["RLOOConfig.eval_steps=5 needs an eval_dataset", "or turn evaluation off"],
    ),
    (
        "reward-requires-a-missing-column",
        lambda tmp: {"reward_funcs": needs_solution},
        ValueError,
        [
            "reward function `needs_solution` requires argument(s) solution",
            "(columns: answer, prompt;",
            "give it a default",
        ],
    ),
    (
        "reward-with-positional-only-arguments",
        lambda tmp: {"reward_funcs": lambda completions, /, **kw: [0.0] * len(completions)},
        ValueError,
        ["takes completions positionally only (before `/`)", "drop the `/` from its signature"],
    ),
    (
        "missing-model-folder",
        lambda tmp: {"model": str(tmp / "no-model"), "processing_class": make_tokenizer()},
        ValueError,
        ["model folder", "no-model' does not exist", "a hub id such as"],
    ),
    (
        "model-folder-without-config",
        lambda tmp: {"model": str(tmp), "processing_class": make_tokenizer()},
        ValueError,
        ["has no config.json (nor a PEFT adapter_config.json)", "the folder save_pretrained wrote"],
    ),
    (
        "dataset-dict-without-train-split",
        lambda tmp: {"train_dataset": datasets.DatasetDict({"test": datasets.Dataset.from_list(dataset(4))})},
        ValueError,
        ["split 'train' not found; available splits: test"],
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "parts"), [c[1:] for c in TRAINER_CASES], ids=[c[0] for c in TRAINER_CASES]
)
def test_trainer_construction_error_names_the_input_and_the_fix(
    tmp_path: Path, kwargs: Callable[[Path], dict[str, Any]], error: type[Exception], parts: list[str]
) -> None:
    with pytest.raises(error) as info:
        build(tmp_path, **kwargs(tmp_path))
    for part in parts:
        assert part in str(info.value), str(info.value)
    assert not (tmp_path / "run").exists()  # nothing written before the inputs are checked


def test_resume_from_a_step_number_says_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        build(tmp_path).train(resume_from_checkpoint=5)  # type: ignore[arg-type]
    assert "resume_from_checkpoint=5 is invalid: give True" in str(info.value)
    assert "checkpoint-500" in str(info.value)


def test_resume_without_a_checkpoint_says_to_train_without_resuming(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        build(tmp_path).train(resume_from_checkpoint=True)
    message = str(info.value)
    assert "resume_from_checkpoint=True but" in message and "has no complete checkpoint-<step> folder" in message
    assert "train without resuming, or pass the checkpoint folder explicitly" in message


def test_resume_from_a_folder_that_is_no_checkpoint_lists_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        build(tmp_path).train(resume_from_checkpoint=str(tmp_path / "checkpoint-9"))
    message = str(info.value)
    assert "checkpoint-9' is not a complete checkpoint (missing trainer_state.json" in message
    assert "pick a checkpoint-<step> folder" in message


def test_conversational_prompts_without_a_chat_template(tmp_path: Path) -> None:
    tok = make_tokenizer()
    tok.chat_template = None
    chats = [{"prompt": [{"role": "user", "content": f"{a}+1="}]} for a in range(4)]
    with pytest.raises(ValueError) as info:
        build(tmp_path, model=make_model(tok), processing_class=tok, train_dataset=chats).train()
    message = str(info.value)
    assert "conversational prompts need a chat template, but the tokenizer has none" in message
    assert "set `tokenizer.chat_template` or use plain-text prompts" in message


# ============================================================================ reward functions
def reward_as_text(completions: list[Any], **kwargs: Any) -> Any:
    return "good"


def reward_as_dict(completions: list[Any], **kwargs: Any) -> Any:
    return {"score": 1.0}


def reward_forgets_return(completions: list[Any], **kwargs: Any) -> Any:
    return None  # computed the scores, then forgot to return them


def reward_of_strings(completions: list[Any], **kwargs: Any) -> Any:
    return ["1"] * len(completions)


REWARD_CASES: list[tuple[Callable[..., Any], type[Exception], list[str]]] = [
    (reward_as_text, ValueError, ["`reward_as_text` returned a str", "return a list with one float (or None) per"]),
    (reward_as_dict, ValueError, ["`reward_as_dict` returned a dict", "return a list with one float (or None) per"]),
    (
        reward_forgets_return,
        ValueError,
        ["`reward_forgets_return` returned a NoneType", "return a list with one float (or None) per completion"],
    ),
    (
        reward_of_strings,
        ValueError,
        ["`reward_of_strings` returned '1' (str) at row 0", "expected a real number, or None where it does not apply"],
    ),
]


@pytest.mark.parametrize(("func", "error", "parts"), REWARD_CASES, ids=[c[0].__name__ for c in REWARD_CASES])
def test_a_broken_reward_function_is_named_with_the_fix(
    tmp_path: Path, func: Callable[..., Any], error: type[Exception], parts: list[str]
) -> None:
    with pytest.raises(error) as info:
        build(tmp_path, reward_funcs=func).train()
    for part in parts:
        assert part in str(info.value), str(info.value)
    assert not list((tmp_path / "run").glob("checkpoint-*"))


def test_a_dataset_column_named_like_a_reward_argument(tmp_path: Path) -> None:
    rows = [{"prompt": f"{a}+1=", "completions": "x"} for a in range(4)]
    with pytest.raises(ValueError) as info:
        build(tmp_path, train_dataset=rows).train()
    message = str(info.value)
    assert "dataset column(s) completions clash with reward function arguments" in message
    assert "rename them" in message


# ============================================================================ rloo train
RUN_FILE_CASES: list[tuple[str, dict[str, Any], list[str], list[str]]] = [
    ("unknown-key", {"num_generation": 2}, [], ["unknown key `num_generation`; did you mean `num_generations`?"]),
    ("wrong-type", {"num_generations": "four"}, [], ["`num_generations` expects int, got 'four' (str)"]),
    ("bool-type", {"shuffle_dataset": "maybe"}, [], ["`shuffle_dataset` expects bool, got 'maybe' (str)"]),
    ("no-model", {"model": DROP}, [], ["the run file needs `model`"]),
    ("no-dataset", {"dataset": DROP}, [], ["the run file needs `dataset`"]),
    ("no-reward-funcs", {"reward_funcs": DROP}, [], ["the run file needs `reward_funcs`"]),
    ("model-not-a-string", {"model": 5}, [], ["`model` expects a path or hub id (str), got 5"]),
    ("output-dir-not-a-string", {"output_dir": 5}, [], ["`output_dir` expects str or null, got 5 (int)"]),
    ("nested-typo-override", {}, ["dataset.splt=test"], ["unknown key `dataset.splt`; did you mean `split`?"]),
    ("peft-typo-override", {"peft": {"r": 8}}, ["peft.rank=4"], ["unknown key `peft.rank`; did you mean `r`?"]),
    ("override-typo", {}, ["learnig_rate=1e-5"], ["unknown key `learnig_rate`; did you mean `learning_rate`?"]),
    ("override-wrong-type", {}, ["max_steps=abc"], ["`max_steps` expects int, got 'abc' (str)"]),
    ("override-without-equals", {}, ["learning_rate"], ["override 'learning_rate' must look like key=value"]),
    ("eval-dataset-typo", {"eval_datset": {"path": "x"}}, [], ["unknown key `eval_datset`; did you mean"]),
    (
        "dataset-not-a-mapping",
        {"dataset": 5},
        [],
        ["`dataset` must be a path/hub id or a mapping with keys ['path', 'name', 'split'"],
    ),
    (
        "dataset-without-path",
        {"dataset": {"split": "train"}},
        [],
        ["`dataset.path` is required: a local file/folder or a hub dataset id"],
    ),
    (
        "dataset-columns-a-list",
        {"dataset": {"path": "x", "columns": ["question"]}},
        [],
        ["`dataset.columns` expects a mapping of old: new column names, got ['question'] (list)"],
    ),
    (
        "dataset-as-chat-a-word",
        {"dataset": {"path": "x", "as_chat": "yes"}},
        [],
        ["`dataset.as_chat` expects true or false, got 'yes'"],
    ),
    ("dataset-limit-zero", {}, ["dataset.limit=0"], ["`dataset.limit` expects an int >= 1 or null, got 0"]),
    ("peft-not-a-mapping", {"peft": 8}, [], ["`peft` expects a mapping of peft.LoraConfig fields, got 8"]),
    (
        "reward-typo",
        {"reward_funcs": ["acuracy"]},
        [],
        ["unknown reward `acuracy`; did you mean `accuracy`?", "Built-in rewards: accuracy"],
    ),
    (
        "reward-bad-parameter",
        {"reward_funcs": [{"name": "length", "min_wrds": 1}]},
        [],
        ["reward 'length': bad parameters {'min_wrds': 1}", "it accepts: min_words, max_words"],
    ),
    (
        "config-value",
        {"lr_scheduler_type": "cosin"},
        [],
        ["RLOOConfig.lr_scheduler_type='cosin' is invalid: choose one of", "'cosine'"],
    ),
    (
        "two-kinds-of-weights",
        {"reward_funcs": [{"name": "accuracy", "weight": 2.0}], "reward_weights": [1.0]},
        [],
        ["either as `weight:` in reward_funcs or as `reward_weights`, not both"],
    ),
    (
        "compute-metrics-typo",
        {"compute_metrics": "tests.helpers.models:answer_metric"},
        [],
        ["compute_metrics 'tests.helpers.models:answer_metric': module 'tests.helpers.models' has no attribute"],
    ),
    (
        "compute-metrics-a-number",
        {"compute_metrics": 5},
        [],
        ["`compute_metrics` expects a 'package.module:function' string, got 5"],
    ),
    (
        "compute-metrics-a-reward-name",
        {},
        ["compute_metrics=accuracy"],
        ["compute_metrics 'accuracy' is not an import string: write 'package.module:function'"],
    ),
]


@pytest.mark.parametrize(
    ("values", "overrides", "parts"), [c[1:] for c in RUN_FILE_CASES], ids=[c[0] for c in RUN_FILE_CASES]
)
def test_run_file_mistake_exits_2_before_loading_anything(
    tmp_path: Path, files: dict[str, Path], values: dict[str, Any], overrides: list[str], parts: list[str]
) -> None:
    message = assert_usage_error(invoke("train", run_file(tmp_path, files, **values), *overrides), *parts)
    assert "Loading" not in message  # caught before a model is loaded
    assert not (tmp_path / "run").exists()


def test_reward_weight_count_mismatch_in_a_run_file(tmp_path: Path, files: dict[str, Path]) -> None:
    path = run_file(tmp_path, files, reward_weights=[1.0, 2.0])
    assert_usage_error(
        invoke("train", path),
        "reward_weights has 2 entries but there are 1 reward functions",
        "give one weight per function",
    )
    assert not list((tmp_path / "run").glob("checkpoint-*"))


def test_a_missing_run_file(tmp_path: Path) -> None:
    assert_usage_error(invoke("train", tmp_path / "nope.yaml"), "run file", "nope.yaml' not found")


def test_a_run_file_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- model\n- dataset\n")
    assert_usage_error(invoke("train", path), "list.yaml' must be a YAML mapping of keys to values")


def test_resume_with_no_checkpoint(tmp_path: Path, files: dict[str, Path]) -> None:
    message = assert_usage_error(
        invoke("train", run_file(tmp_path, files), "--resume"),
        "has no complete checkpoint-<step> folder",
        "train without resuming",
    )
    assert "resume_from_checkpoint=True" in message
    assert not (tmp_path / "run" / "final").exists()


def test_resume_from_a_missing_checkpoint(tmp_path: Path, files: dict[str, Path]) -> None:
    assert_usage_error(
        invoke("train", run_file(tmp_path, files), "--resume-from", "checkpoint-9"),
        "--resume-from 'checkpoint-9': no such checkpoint folder",
        "(looked in",
    )


def test_a_second_fresh_run_into_a_used_output_dir(tmp_path: Path, files: dict[str, Path]) -> None:
    path = run_file(tmp_path, files)
    first = invoke("train", path)
    assert first.exit_code == 0, flat(first.stderr)
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    message = assert_usage_error(
        invoke("train", path),
        "already holds an earlier run (checkpoint-1",
        "--resume",
        "choose a new output_dir",
        "overwrite_output_dir=True",
        "(nothing was changed)",
    )
    assert "Loading" not in message
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before


# ============================================================================ rloo eval
EVAL_CASES: list[tuple[str, list[str], list[str]]] = [
    ("batch-size-zero", ["--batch-size", "0"], ["--batch-size=0 is invalid: it must be >= 1"]),
    ("num-generations-zero", ["--num-generations", "0"], ["--num-generations=0 is invalid: it must be >= 1"]),
    (
        "max-completion-length-zero",
        ["--max-completion-length", "0"],
        ["--max-completion-length=0 is invalid: it must be >= 1"],
    ),
    ("negative-temperature", ["--temperature", "-1"], ["--temperature=-1.0 is invalid: it must be finite and >= 0"]),
    (
        "column-without-equals",
        ["--column", "question"],
        ["--column 'question' is invalid: write old=new, e.g. --column question=prompt"],
    ),
    (
        "column-not-in-dataset",
        ["--column", "question=prompt"],
        ["dataset columns ['question'] not found; the dataset has ['prompt', 'answer']"],
    ),
    (
        "unknown-reward",
        ["--reward", "acuracy"],
        ["unknown reward `acuracy`; did you mean `accuracy`?", "Built-in rewards"],
    ),
    (
        "reward-weight-count",
        ["--reward-weight", "1", "--reward-weight", "2"],
        ["got 2 --reward-weight values for 1 rewards; give one per reward"],
    ),
]


@pytest.mark.parametrize(("options", "parts"), [c[1:] for c in EVAL_CASES], ids=[c[0] for c in EVAL_CASES])
def test_eval_option_mistake_exits_2(files: dict[str, Path], options: list[str], parts: list[str]) -> None:
    base: list[str | Path] = ["eval", "--model", files["model"], "--dataset", files["data"], "--split", "train"]
    rewards = [] if "--reward" in options else ["--reward", "accuracy"]
    assert_usage_error(invoke(*base, *rewards, *options), *parts)


def test_eval_without_a_dataset_or_a_run_file(files: dict[str, Path]) -> None:
    result = invoke("eval", "--model", files["model"], "--reward", "accuracy")
    assert_usage_error(result, "give --dataset, or --run-file with a dataset")


def test_eval_without_a_reward(files: dict[str, Path]) -> None:
    assert_usage_error(
        invoke("eval", "--model", files["model"], "--dataset", files["data"]),
        "give --reward (once per reward function), or --run-file",
    )


def test_eval_with_a_mistyped_run_file(tmp_path: Path, files: dict[str, Path]) -> None:
    path = run_file(tmp_path, files, num_generation=2)
    assert_usage_error(
        invoke("eval", "--model", files["model"], "--run-file", path),
        "unknown key `num_generation`; did you mean `num_generations`?",
    )


def test_eval_with_a_missing_run_file(tmp_path: Path, files: dict[str, Path]) -> None:
    assert_usage_error(
        invoke("eval", "--model", files["model"], "--run-file", tmp_path / "gone.yaml"), "gone.yaml' not found"
    )


def test_eval_with_a_non_integer_option(files: dict[str, Path]) -> None:
    # click's own usage error: exit 2, the option named, what it expects
    result = invoke("eval", "--model", files["model"], "--reward", "accuracy", "--batch-size", "many")
    assert result.exit_code == 2
    message = flat(result.stderr)
    assert "Invalid value for '--batch-size'" in message and "valid integer" in message


# ---------------------------------------------------------------------------- found by this file, then fixed


def test_an_unknown_config_keyword_suggests_the_field() -> None:
    # before: Python's bare "unexpected keyword argument 'num_generation'"
    with pytest.raises(
        ValueError, match=r"unknown RLOOConfig field `num_generation`; did you mean `num_generations`\?"
    ):
        RLOOConfig(num_generation=4)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match=r"unknown RLOOConfig field `bta`; did you mean `beta`\?"):
        RLOOConfig().replace(bta=1.0)
    with pytest.raises(ValueError, match="from_dict takes a mapping of field names to values"):
        RLOOConfig.from_dict([1, 2])  # type: ignore[arg-type]


def test_trainer_args_that_are_not_a_config(tmp_path: Path) -> None:
    # before: AttributeError: 'dict' object has no attribute 'algorithm'
    with pytest.raises(
        ValueError, match=r"args must be an RLOOConfig, got a dict; build one with RLOOConfig\(\*\*values\)"
    ):
        RLOOTrainer(model=make_model(make_tokenizer()), reward_funcs=frac7, args={"num_generations": 4})  # type: ignore[arg-type]


def test_a_run_file_that_is_not_valid_yaml_names_line_and_column(tmp_path: Path) -> None:
    # before: exit 1 with PyYAML's multi-line ParserError
    path = tmp_path / "run.yaml"
    path.write_text("model: [unclosed\n")
    assert_usage_error(invoke("train", path), "is not valid YAML: line 2, column 1")
    assert_usage_error(invoke("train", path, "reward_weights=[1,"), "is not valid YAML")


def test_a_run_file_path_that_is_a_folder(tmp_path: Path) -> None:
    assert_usage_error(invoke("train", tmp_path), "is a folder; give the YAML file")


def test_a_reward_weight_that_is_not_a_number(tmp_path: Path, files: dict[str, Path]) -> None:
    # before: "could not convert string to float: 'high'", naming neither the field nor the fix
    path = run_file(tmp_path, files, reward_funcs=[{"name": "accuracy", "weight": "high"}])
    assert_usage_error(invoke("train", path), "`reward_funcs[0].weight` expects a number, got 'high'")


def test_a_report_of_a_folder_that_does_not_exist(tmp_path: Path) -> None:
    assert_usage_error(
        invoke("report", tmp_path / "nope"), "does not exist or is not a folder; give a run's output_dir"
    )


def test_demo_options_are_checked_before_the_warm_start() -> None:
    # before: --steps 0 ran the whole warm start, then failed with an exit 1 traceback
    assert_usage_error(invoke("demo", "--steps", "0"), "--steps=0 is invalid: it must be >= 1")
    assert_usage_error(invoke("demo", "--hidden-size", "30"), "--hidden-size=30 is invalid: it must be a multiple of 4")


def test_eval_limit_and_threshold_are_checked(files: dict[str, Path]) -> None:
    base = ("eval", "--model", files["model"], "--dataset", files["data"], "--reward", "accuracy")
    assert_usage_error(invoke(*base, "--limit", "0"), "--limit=0 is invalid: it must be >= 1")
    assert_usage_error(invoke(*base, "--success-threshold", "nan"), "--success-threshold=nan is invalid")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"num_generations": "4"}, "RLOOConfig.num_generations='4' is invalid: expects int, got a str"),
        ({"learning_rate": "1e-5"}, "RLOOConfig.learning_rate='1e-5' is invalid: expects float, got a str"),
        ({"bf16": "yes"}, "RLOOConfig.bf16='yes' is invalid: expects bool | None, got a str"),
        (
            {"model_init_kwargs": [1]},
            "RLOOConfig.model_init_kwargs=[1] is invalid: expects a mapping (or a JSON object in a string) | None",
        ),
    ],
)
def test_config_values_of_the_wrong_type(values: dict[str, Any], message: str) -> None:
    # before: num_generations="4" gave "'<' not supported between 'str' and 'int'"; bf16="yes" was accepted
    with pytest.raises(ValueError, match=re.escape(message)):
        RLOOConfig(**values)


def test_trainer_inputs_of_the_wrong_kind(tmp_path: Path) -> None:
    # before: AttributeErrors about 'base_model_name_or_path' and 'eos_token_id'
    tok = make_tokenizer()
    with pytest.raises(ValueError, match=r"peft_config must be a peft config such as peft.LoraConfig"):
        RLOOTrainer(make_model(tok), frac7, config(tmp_path), dataset(), processing_class=tok, peft_config={"r": 4})
    with pytest.raises(ValueError, match=r"processing_class must be a tokenizer, got a str"):
        RLOOTrainer(make_model(tok), frac7, config(tmp_path), dataset(), processing_class="nope")  # type: ignore[arg-type]


def test_prompt_files_and_rows_that_arrow_would_reject(tmp_path: Path) -> None:
    # before: raw ArrowTypeError / DatasetGenerationError / StopIteration naming no row or file
    with pytest.raises(ValueError, match=r"invalid prompt in row 1: the prompt is a int"):
        RLOOTrainer(make_model(make_tokenizer()), frac7, config(tmp_path), [{"prompt": "1+1="}, {"prompt": 5}])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(ValueError, match=r"could not read .*bad.jsonl' as jsonl .*check that it is a valid"):
        RLOOTrainer(make_model(make_tokenizer()), frac7, config(tmp_path), str(bad))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty.jsonl' is empty; give a file with one prompt per row"):
        RLOOTrainer(make_model(make_tokenizer()), frac7, config(tmp_path), str(empty))
    with pytest.raises(ValueError, match=r"is a folder but not one written by Dataset.save_to_disk"):
        RLOOTrainer(make_model(make_tokenizer()), frac7, config(tmp_path), str(tmp_path))


@needs_bwrap  # the reward is built only where it has a sandbox
def test_the_code_execution_reward_without_its_column_is_refused_at_construction(tmp_path: Path) -> None:
    from rloo.rewards.code_execution import code_execution_reward

    with pytest.raises(ValueError) as info:
        build(tmp_path, reward_funcs=code_execution_reward(column="tests"))
    assert "reward function `code_execution` requires argument(s) tests" in str(info.value)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------- before: another library's message


def test_config_values_torch_would_reject_name_the_field() -> None:
    # before: accepted, then failing inside torch (AdamW's "Invalid beta parameter") or at the first reward sum
    cases: list[tuple[dict[str, Any], str]] = [
        ({"reward_weights": ["a", 1.0]}, "RLOOConfig.reward_weights=['a', 1.0] is invalid: expects a list of numbers"),
        ({"reward_clip_range": ["a", 1.0]}, "RLOOConfig.reward_clip_range=('a', 1.0) is invalid: expects a [min, max]"),
        ({"adam_beta1": 1.0}, "RLOOConfig.adam_beta1=1.0 is invalid: must be in [0, 1)"),
        ({"adam_beta2": -0.5}, "RLOOConfig.adam_beta2=-0.5 is invalid: must be in [0, 1)"),
        ({"adam_epsilon": -1e-8}, "RLOOConfig.adam_epsilon=-1e-08 is invalid: must be >= 0"),
    ]
    for values, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            RLOOConfig(**values)


def test_a_run_file_with_adam_beta_out_of_range(tmp_path: Path, files: dict[str, Path]) -> None:
    message = assert_usage_error(
        invoke("train", run_file(tmp_path, files, adam_beta2=1.0)), "RLOOConfig.adam_beta2=1.0 is invalid"
    )
    assert "Loading" not in message


def test_a_dataset_file_that_is_not_utf8_names_the_file(tmp_path: Path, files: dict[str, Path]) -> None:
    # before: pyarrow's UnicodeDecodeError ("'utf-8' codec can't decode byte 0xe9"), the file not named
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes('{"prompt": "1+1="}\n{"prompt": "caf\xe9 2+2="}\n'.encode("latin-1"))
    with pytest.raises(ValueError) as info:
        build(tmp_path, train_dataset=str(latin1))
    message = str(info.value)
    assert f"prompt data file {str(latin1)!r} is not UTF-8" in message, message
    assert "line 2" in message and "save it as UTF-8" in message, message
    # UTF-16 (before: "JSON parse error: Invalid value"), as the eval set of a run file
    utf16 = tmp_path / "utf16.jsonl"
    utf16.write_bytes('{"prompt": "1+1="}\n'.encode("utf-16"))
    path = run_file(tmp_path, files, eval_dataset={"path": str(utf16)})
    assert_usage_error(invoke("train", path), f"prompt data file {str(utf16)!r} is not UTF-8", "save it as UTF-8")


CHAT = [{"role": "user", "content": "1+1="}]


def test_rows_mixing_text_and_conversational_prompts(tmp_path: Path) -> None:
    # before: pyarrow's "Expected bytes, got a 'list' object" naming no row, or (a JSONL file) accepted,
    # every prompt then templated as the first row's kind
    with pytest.raises(ValueError) as info:
        build(tmp_path, train_dataset=[{"prompt": "1+1="}, {"prompt": "2+2="}, {"prompt": CHAT}, {"prompt": CHAT}])
    message = str(info.value)
    assert "the `prompt` column mixes text and conversational prompts" in message, message
    assert "row 0 is text (a str) but row 2 is a conversation (a list of messages)" in message, message
    assert "(2 of 4 rows differ from row 0)" in message and "give every row the same kind" in message, message
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(f'{{"prompt": {json.dumps(CHAT)}}}\n{{"prompt": "1+1="}}\n')
    with pytest.raises(ValueError, match=r"row 0 is a conversation \(a list of messages\) but row 1 is text"):
        build(tmp_path, train_dataset=str(mixed))
    with pytest.raises(ValueError, match=r"the `prompt` column of eval_dataset mixes text and conversational"):
        build(tmp_path, eval_dataset=[{"prompt": "1+1="}, {"prompt": CHAT}])


def test_an_eval_dataset_without_a_prompt_column_is_named_as_the_eval_dataset(tmp_path: Path) -> None:
    # before: "dataset has no `prompt` column", as if the training set had none
    with pytest.raises(ValueError) as info:
        build(tmp_path, eval_dataset=[{"q": "1+1="}])
    message = str(info.value)
    assert message.startswith("eval_dataset has no `prompt` column (columns: q)"), message
    assert "eval_dataset.rename_column('q', 'prompt') in Python" in message, message
    with pytest.raises(ValueError, match=re.escape("eval_dataset['hard'] has no `prompt` column (columns: q)")):
        build(tmp_path, eval_dataset={"easy": dataset(2), "hard": [{"q": "1+1="}]})
    with pytest.raises(ValueError, match=re.escape("invalid prompt in row 1 of eval_dataset: the prompt is a int")):
        build(tmp_path, eval_dataset=[{"prompt": "1+1="}, {"prompt": 3}])
    with pytest.raises(ValueError, match=re.escape("eval_dataset has no `prompt` column (columns: q)")):
        build(tmp_path).evaluate(eval_dataset=[{"q": "1+1="}])


def test_a_run_file_that_is_not_utf8_names_the_file(tmp_path: Path, files: dict[str, Path]) -> None:
    # before: "'utf-8' codec can't decode byte 0xe9 in position ...", the file not named
    path = run_file(tmp_path, files)
    bad_line = len(path.read_bytes().splitlines()) + 1
    path.write_bytes(path.read_bytes() + "# caf\xe9\n".encode("latin-1"))
    message = assert_usage_error(invoke("train", path), f"run file {str(path)!r} is not UTF-8", "save it as UTF-8")
    assert f"line {bad_line}" in message, message


def test_a_stream_mixing_text_and_conversational_prompts(tmp_path: Path) -> None:
    # before: a streaming train set was trained on, each batch rendered as its first row's kind; a streaming
    # eval set failed with pyarrow's "Expected bytes, got a 'list' object"
    from rloo.data.prompt_order import StreamedRows

    def rows() -> Any:
        yield from ({"prompt": "1+1="}, {"prompt": "2+2="}, {"prompt": CHAT})

    stream = datasets.IterableDataset.from_generator(rows)
    with pytest.raises(ValueError, match=r"streaming train_dataset mixes text .* row 0 is text \(a str\) but row 2"):
        StreamedRows(stream, seed=0, shuffle=False).next_rows(3)
    with pytest.raises(ValueError, match=r"the `prompt` column of eval_dataset mixes text and conversational"):
        build(tmp_path).evaluate(eval_dataset=stream)


def test_a_trl_config_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "trl.yaml"
    config.write_bytes("model_name_or_path: caf\u00e9\n".encode("latin-1"))
    result = invoke("train", "--config", config)
    assert result.exit_code == 2 and str(config) in flat(result.stderr) and "--config" in flat(result.stderr)
