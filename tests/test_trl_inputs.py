"""Inputs a TRL user passes: model_init_kwargs with torch dtypes, trust_remote_code, generation and
template settings, already-adapted PEFT models (offline, CPU, tiny models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rloo import RLOOConfig, RLOOTrainer
from rloo.training.run_folder import config_yaml
from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


# ----------------------------------------------------------------- model_init_kwargs
@pytest.mark.parametrize("dtype", [torch.bfloat16, "bfloat16", "torch.bfloat16"])
def test_a_torch_dtype_in_model_init_kwargs_is_recorded_by_name(tmp_path: Path, dtype: Any) -> None:
    args = config(tmp_path, model_init_kwargs={"dtype": dtype})
    assert args.model_init_kwargs == {"dtype": "bfloat16"}
    written = yaml.safe_load(config_yaml(args.to_dict(), None))  # crashed with a torch.dtype before
    assert written["model_init_kwargs"] == {"dtype": "bfloat16"}
    assert RLOOConfig.from_dict(written) == args


def test_transformers_4s_torch_dtype_key_becomes_dtype(tmp_path: Path) -> None:
    assert config(tmp_path, model_init_kwargs={"torch_dtype": torch.float16}).model_init_kwargs == {"dtype": "float16"}
    same = {"torch_dtype": torch.float16, "dtype": "float16"}
    assert config(tmp_path, model_init_kwargs=same).model_init_kwargs == {"dtype": "float16"}


@pytest.mark.parametrize(
    ("kwargs", "fix"),
    [
        ({"dtype": "int8"}, "dtype must be a torch dtype or one of"),
        ({"dtype": torch.int8}, "dtype must be a torch dtype or one of"),
        ({"torch_dtype": "float16", "dtype": "bfloat16"}, "give the dtype once, as dtype"),
        ({"device_map": object()}, "device_map=<object"),
        ({"trust_remote_code": True}, "set trust_remote_code once, as the config field"),
    ],
)
def test_bad_model_init_kwargs_name_the_field_and_the_fix(tmp_path: Path, kwargs: dict[str, Any], fix: str) -> None:
    with pytest.raises(ValueError, match=r"RLOOConfig.model_init_kwargs=.* is invalid: ") as info:
        config(tmp_path, model_init_kwargs=kwargs)
    assert fix in str(info.value)


def test_trust_remote_code_given_twice_with_one_value_is_fine(tmp_path: Path) -> None:
    args = config(tmp_path, trust_remote_code=True, model_init_kwargs={"trust_remote_code": True})
    assert args.from_pretrained_kwargs["trust_remote_code"] is True


@pytest.fixture(scope="module")
def bf16_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model saved in bfloat16 (as hub checkpoints usually are), with its tokenizer."""
    folder = tmp_path_factory.mktemp("bf16-model")
    tokenizer = make_tokenizer()
    make_model(tokenizer).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _loaded_dtypes(tmp_path: Path, folder: Path, **overrides: Any) -> set[torch.dtype]:
    trainer = RLOOTrainer(str(folder), frac7, args=config(tmp_path, beta=0.1, **overrides), train_dataset=dataset())
    assert trainer.ref_model is not None
    return {p.dtype for p in trainer.unwrapped_model.parameters()} | {p.dtype for p in trainer.ref_model.parameters()}


def test_weights_load_in_float32_unless_a_dtype_is_asked_for(tmp_path: Path, bf16_folder: Path) -> None:
    assert _loaded_dtypes(tmp_path / "a", bf16_folder) == {torch.float32}
    assert _loaded_dtypes(tmp_path / "c", bf16_folder, model_init_kwargs={"dtype": "auto"}) == {torch.bfloat16}
    assert _loaded_dtypes(tmp_path / "b", bf16_folder, model_init_kwargs={"dtype": torch.bfloat16}) == {torch.bfloat16}
