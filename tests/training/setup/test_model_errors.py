"""Model-loading failures that would reach the user as another library's message: each is a
``ValueError`` raised when the trainer is built, naming the folder or file and the fix (offline,
CPU, tiny models)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rloo import RLOOTrainer
from rloo.tiny import build_char_tokenizer, build_tiny_llama, save_tiny_model
from tests.helpers.cli import flat, invoke
from tests.helpers.launch import write_run_file
from tests.helpers.models import CHARS, config, dataset, frac7, make_model, make_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def model_without_tokenizer(folder: Path) -> Path:
    """A folder save_pretrained wrote for the model only: config.json and weights, no tokenizer files."""
    save_tiny_model(folder, chars=CHARS)
    for name in TOKENIZER_FILES:
        (folder / name).unlink(missing_ok=True)
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    return folder


def truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def test_model_folder_without_tokenizer_files_names_the_folder_and_fix(tmp_path: Path) -> None:
    folder = model_without_tokenizer(tmp_path / "model")
    with pytest.raises(ValueError) as err:
        RLOOTrainer(model=str(folder), reward_funcs=frac7, args=config(tmp_path), train_dataset=dataset())
    message = str(err.value)
    assert str(folder) in message and "no tokenizer files" in message, message
    assert "processing_class" in message and "save" in message, message
    assert "sentencepiece" not in message.lower() and "tiktoken" not in message.lower(), message


def test_model_folder_without_tokenizer_files_trains_with_a_processing_class(tmp_path: Path) -> None:
    folder = model_without_tokenizer(tmp_path / "model")
    trainer = RLOOTrainer(
        model=str(folder),
        reward_funcs=frac7,
        args=config(tmp_path),
        train_dataset=dataset(),
        processing_class=build_char_tokenizer(CHARS),
    )
    assert trainer.processing_class.eos_token == "</s>"


def test_tokenizer_larger_than_the_embedding_table_is_refused_at_build(tmp_path: Path) -> None:
    tok = make_tokenizer()
    model = build_tiny_llama(len(tok) - 3, tokenizer=tok)
    with pytest.raises(ValueError) as err:
        RLOOTrainer(
            model=model, reward_funcs=frac7, args=config(tmp_path), train_dataset=dataset(), processing_class=tok
        )
    message = str(err.value)
    assert str(len(tok)) in message and str(len(tok) - 3) in message, message
    assert "resize_token_embeddings(len(tokenizer))" in message and "own tokenizer" in message, message


def test_tokenizer_smaller_than_the_embedding_table_is_normal(tmp_path: Path) -> None:
    tok = make_tokenizer()
    model = build_tiny_llama(len(tok) + 11, tokenizer=tok)  # a padded vocabulary
    trainer = RLOOTrainer(
        model=model, reward_funcs=frac7, args=config(tmp_path), train_dataset=dataset(), processing_class=tok
    )
    assert trainer.processing_class is tok


def test_tokenizer_larger_than_the_embeddings_of_a_saved_folder(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    make_model(make_tokenizer()).save_pretrained(folder)
    big = build_char_tokenizer(CHARS + "abcdef")
    big.save_pretrained(folder)  # the folder's tokenizer is not the model's
    with pytest.raises(ValueError, match=r"resize_token_embeddings\(len\(tokenizer\)\)"):
        RLOOTrainer(model=str(folder), reward_funcs=frac7, args=config(tmp_path), train_dataset=dataset())


def test_truncated_safetensors_names_the_file_and_says_it_is_damaged(tmp_path: Path) -> None:
    folder = save_tiny_model(tmp_path / "model", chars=CHARS)
    truncate(folder / "model.safetensors")
    with pytest.raises(ValueError) as err:
        RLOOTrainer(model=str(folder), reward_funcs=frac7, args=config(tmp_path), train_dataset=dataset())
    message = str(err.value)
    assert str(folder / "model.safetensors") in message and "damaged" in message, message
    assert "re-download" in message and "re-save" in message, message


def test_cli_model_folder_without_tokenizer_files_is_one_error_line(tmp_path: Path) -> None:
    model_without_tokenizer(tmp_path / "model")
    run_file = write_run_file(tmp_path, tmp_path / "run", max_steps=1)
    result = invoke("train", run_file)
    message = flat(result.stderr)
    assert result.exit_code == 2, (result.exit_code, message, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert "error:" in message and "no tokenizer files" in message and str(tmp_path / "model") in message, message
