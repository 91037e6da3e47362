"""Prompt loading, validation, rendering, tokenization, sampling and reward columns."""

from __future__ import annotations

import json
import re
from pathlib import Path

import datasets
import pytest
import torch
from tokenizers.processors import TemplateProcessing
from transformers import PreTrainedTokenizerFast

from rloo.data.loading import DatasetSource, load_prompt_dataset
from rloo.data.prompt_order import PromptSampler
from rloo.data.prompts import (
    TokenizedPrompts,
    encode_prompts,
    gather_columns,
    is_conversational,
    render_prompt,
    repeat_per_completion,
    tokenize_prompts,
)
from rloo.tiny import build_char_tokenizer
from tests.helpers.trl_port import ZEN_TEST, ZEN_TRAIN, zen_repository

ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+3=", "answer": "5"}]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]


@pytest.fixture(autouse=True)
def _private_datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # load_dataset("json") writes Arrow files to the cache; keep them out of the shared home.
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_char_tokenizer()


# ---------------------------------------------------------------------------- loading


def test_load_dataset_instance_is_returned_as_is() -> None:
    ds = datasets.Dataset.from_list(ROWS)
    assert load_prompt_dataset(ds) is ds


def test_load_list_of_dicts() -> None:
    ds = load_prompt_dataset(ROWS)
    assert ds["prompt"] == ["1+1=", "2+3="] and ds["answer"] == ["2", "5"]


def test_load_dataset_dict_takes_split() -> None:
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])})
    assert len(load_prompt_dataset(dd)) == 2
    assert len(load_prompt_dataset(dd, split="test")) == 1
    with pytest.raises(ValueError, match=r"split 'validation' not found; available splits: train, test"):
        load_prompt_dataset(dd, split="validation")


def test_load_json_file(tmp_path: Path) -> None:
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(ROWS))
    assert load_prompt_dataset(path)["answer"] == ["2", "5"]


def test_load_jsonl_file_given_as_str(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in ROWS))
    assert load_prompt_dataset(str(path))["prompt"] == ["1+1=", "2+3="]


def test_load_parquet_file(tmp_path: Path) -> None:
    path = tmp_path / "prompts.parquet"
    datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    assert load_prompt_dataset(path)["answer"] == ["2", "5"]


def test_load_conversational_jsonl_keeps_messages(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": CHAT, "answer": "hello"}) + "\n")
    ds = load_prompt_dataset(path)
    assert ds[0]["prompt"] == CHAT


def test_load_from_disk_dataset_and_dataset_dict(tmp_path: Path) -> None:
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    assert len(load_prompt_dataset(tmp_path / "ds")) == 2
    dd = datasets.DatasetDict({"eval": datasets.Dataset.from_list(ROWS[:1])})
    dd.save_to_disk(str(tmp_path / "dd"))
    assert len(load_prompt_dataset(tmp_path / "dd", split="eval")) == 1
    with pytest.raises(ValueError, match="available splits: eval"):
        load_prompt_dataset(tmp_path / "dd")


def test_load_a_dataset_repository_folder_by_its_configuration(tmp_path: Path) -> None:
    # before: refused as "not written by Dataset.save_to_disk" (TRL's CLI loads a hub dataset's clone)
    folder = zen_repository(tmp_path / "zen", ("standard_prompt_only", "conversational_prompt_only"))
    plain = load_prompt_dataset(folder, name="standard_prompt_only")
    assert plain["prompt"] == ZEN_TRAIN
    chat = load_prompt_dataset(folder, split="test", name="conversational_prompt_only")
    assert chat[0]["prompt"] == [{"role": "user", "content": ZEN_TEST[0]}]
    with pytest.raises(ValueError, match=r"zen' is a folder but not one written by Dataset.save_to_disk, and .*"):
        load_prompt_dataset(folder, name="standard_preference")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"cannot read it as a dataset repository with name=None, split='train'"):
        load_prompt_dataset(tmp_path / "empty")


@pytest.mark.parametrize("data", [42, {"prompt": ["a"]}, [1, 2], None])
def test_load_rejects_unsupported_types(data: object) -> None:
    with pytest.raises(ValueError, match=r"cannot load prompts from .*; give a datasets\.Dataset"):
        load_prompt_dataset(data)


def test_load_rejects_unknown_suffix_and_missing_path(tmp_path: Path) -> None:
    path = tmp_path / "prompts.csv"
    path.write_text("prompt\nhi\n")
    with pytest.raises(ValueError, match=r"cannot load prompts from a \.csv file; give .*\.parquet"):
        load_prompt_dataset(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_prompt_dataset(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------------------- validation


def test_empty_dataset_is_rejected() -> None:
    with pytest.raises(ValueError, match="the prompt dataset is empty"):
        load_prompt_dataset([])


def test_missing_prompt_column_lists_columns_and_suggests_rename() -> None:
    with pytest.raises(
        ValueError,
        match=r"dataset has no `prompt` column \(columns: question, answer\); "
        r"rename the prompt column to `prompt`",
    ):
        load_prompt_dataset([{"question": "q", "answer": "a"}])


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("", "the prompt is an empty string"),
        (None, "the prompt is a NoneType; expected a non-empty str or a non-empty list"),
        (7, "the prompt is a int; expected"),
        ([], "the prompt is an empty list of messages"),
        (["hi"], "message 0 is a str, expected a dict with `role` and `content`"),
        ([{"role": "user"}], "message 0 `content` is missing; expected a str"),
        ([{"role": 3, "content": "b"}], "message 0 `role` is a int; expected a str"),
        ([{"role": "user", "content": 3}], "message 0 `content` is a int; expected a str or a list of content parts"),
        ([{"role": "user", "content": [{"type": "text"}]}], "message 0 content part 0 is a text part without a str"),
        ([{"role": "user", "content": [{"type": "video"}]}], "message 0 content part 0 is {'type': 'video'}; expected"),
        ([{"role": "user", "content": []}], "message 0 `content` is an empty list of parts"),
    ],
)
def test_invalid_prompt_says_what_is_wrong(bad: object, problem: str) -> None:
    with pytest.raises(ValueError, match=rf"invalid prompt in row 0: {re.escape(problem)}"):
        load_prompt_dataset([{"prompt": bad}])


def test_validation_reports_first_bad_row_and_count() -> None:
    with pytest.raises(ValueError, match=r"row 1: the prompt is an empty string \(2 of 4 rows are invalid\)"):
        load_prompt_dataset([{"prompt": "a"}, {"prompt": ""}, {"prompt": "b"}, {"prompt": ""}])
    chats = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}, {"role": "assistant"}]]
    with pytest.raises(ValueError, match=r"row 1: message 1 `content` is missing.*\(1 of 2 rows"):
        load_prompt_dataset([{"prompt": chat} for chat in chats])


def test_is_conversational() -> None:
    assert is_conversational(CHAT)
    assert not is_conversational("hi")
    assert not is_conversational([])
    assert not is_conversational(["hi"])
    assert not is_conversational([{"role": "user"}])


# ---------------------------------------------------------------------------- rendering


def test_render_plain_text_is_unchanged(tokenizer: PreTrainedTokenizerFast) -> None:
    assert render_prompt("What is 2+2?", tokenizer) == "What is 2+2?"


def test_render_conversation_with_chat_template(tokenizer: PreTrainedTokenizerFast) -> None:
    assert render_prompt(CHAT, tokenizer) == "<system>Be brief.\n<user>Hi?\n<assistant>"


def test_render_without_chat_template_explains_the_fix() -> None:
    tok = build_char_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match=r"set `tokenizer\.chat_template` or use plain-text prompts"):
        render_prompt(CHAT, tok)


def test_render_rejects_invalid_prompt(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match=r"cannot render prompt .*`content` is missing"):
        render_prompt([{"role": "user"}], tokenizer)


# ---------------------------------------------------------------------------- tokenization


def _char_ids(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    vocab = tokenizer.get_vocab()
    return [vocab[ch] for ch in text]


def test_tokenize_honours_add_special_tokens() -> None:
    tok = build_char_tokenizer()
    # The char tokenizer adds nothing by default; give it a BOS post-processor like Llama's.
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)]
    )
    a, b, c = _char_ids(tok, "abc")
    bos = tok.bos_token_id
    with_bos = tokenize_prompts(["ab", "c"], tok, max_prompt_length=None)
    assert with_bos == TokenizedPrompts(ids=[[bos, a, b], [bos, c]], num_truncated=0)
    plain = tokenize_prompts(["ab", "c"], tok, None, add_special_tokens=False)
    assert plain == TokenizedPrompts(ids=[[a, b], [c]], num_truncated=0)
    # Left truncation drops the BOS first, as in TRL.
    assert tokenize_prompts(["ab"], tok, max_prompt_length=2).ids == [[a, b]]


def test_tokenize_truncates_from_the_left(tokenizer: PreTrainedTokenizerFast) -> None:
    out = tokenize_prompts(["abcdef", "xy", "pqrs"], tokenizer, max_prompt_length=3, add_special_tokens=False)
    assert out.ids == [_char_ids(tokenizer, text) for text in ("def", "xy", "qrs")]
    assert out.num_truncated == 2


def test_tokenize_rejects_empty_prompt_and_bad_length(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match=r"prompt 1 \(''\) tokenized to no tokens"):
        tokenize_prompts(["a", ""], tokenizer, None, add_special_tokens=False)
    with pytest.raises(ValueError, match="max_prompt_length must be >= 1 or None, got 0"):
        tokenize_prompts(["a"], tokenizer, 0)


# ---------------------------------------------------------------------------- sampling


def test_sampler_follows_randperm_per_epoch_and_spans_epochs() -> None:
    sampler = PromptSampler(num_rows=5, seed=3)
    epoch0 = torch.randperm(5, generator=torch.Generator().manual_seed(3)).tolist()
    epoch1 = torch.randperm(5, generator=torch.Generator().manual_seed(4)).tolist()
    assert sampler.next_indices(3) == epoch0[:3]
    assert (sampler.epoch, sampler.position, sampler.epochs_completed_float) == (0, 3, 0.6)
    assert sampler.next_indices(4) == epoch0[3:] + epoch1[:2]
    assert (sampler.epoch, sampler.position) == (1, 2)
    assert sampler.epochs_completed_float == pytest.approx(1.4)
    assert sampler.next_indices(3) == epoch1[2:]
    assert (sampler.epoch, sampler.position) == (2, 0)


def test_sampler_without_shuffle_and_large_draws() -> None:
    sampler = PromptSampler(num_rows=3, seed=0, shuffle=False)
    assert sampler.next_indices(7) == [0, 1, 2, 0, 1, 2, 0]
    assert sampler.next_indices(0) == []
    assert sampler.epoch == 2


def test_sampler_is_deterministic_and_every_epoch_is_a_permutation() -> None:
    a, b = PromptSampler(7, seed=11), PromptSampler(7, seed=11)
    draws = a.next_indices(21)
    assert draws == b.next_indices(21)
    for e in range(3):
        assert sorted(draws[7 * e : 7 * (e + 1)]) == list(range(7))
    assert draws[:7] != draws[7:14]  # a new order each epoch (fixed seed, so not flaky)


def test_sampler_resume_continues_exactly() -> None:
    sampler = PromptSampler(num_rows=10, seed=5)
    for _ in range(3):
        sampler.next_indices(4)
    state = sampler.state_dict()
    expected = [sampler.next_indices(4), sampler.next_indices(4)]
    resumed = PromptSampler(num_rows=10, seed=5)
    resumed.load_state_dict(state)
    assert [resumed.next_indices(4), resumed.next_indices(4)] == expected


def test_sampler_rejects_mismatched_state_and_bad_args() -> None:
    state = PromptSampler(10, seed=5).state_dict()
    with pytest.raises(ValueError, match="saved with num_rows=10 but this sampler has num_rows=9"):
        PromptSampler(9, seed=5).load_state_dict(state)
    with pytest.raises(ValueError, match="saved with seed=5 but this sampler has seed=6"):
        PromptSampler(10, seed=6).load_state_dict(state)
    with pytest.raises(ValueError, match="invalid sampler state"):
        PromptSampler(10, seed=5).load_state_dict({**state, "position": 10})
    with pytest.raises(ValueError, match="num_rows must be >= 1"):
        PromptSampler(0, seed=0)
    with pytest.raises(ValueError, match="n must be >= 0"):
        PromptSampler(3, seed=0).next_indices(-1)


# ---------------------------------------------------------------------------- reward columns


def test_gather_columns_then_repeat_each_row_consecutively() -> None:
    ds = datasets.Dataset.from_list([{"prompt": f"p{i}", "answer": str(i), "level": i * 10} for i in range(4)])
    out = gather_columns(ds, [3, 1])
    assert out == {"answer": ["3", "1"], "level": [30, 10]}
    assert repeat_per_completion(out["answer"], 3) == ["3", "3", "3", "1", "1", "1"]


def test_gather_columns_prompt_only_and_bad_num_generations() -> None:
    ds = datasets.Dataset.from_list([{"prompt": "p"}])
    assert gather_columns(ds, [0, 0]) == {}
    with pytest.raises(ValueError, match="num_generations must be >= 1, got 0"):
        repeat_per_completion(["a"], 0)


def test_encode_prompts_renders_chats_and_adds_no_special_tokens_to_them() -> None:
    tok = build_char_tokenizer()
    chat = encode_prompts([[{"role": "user", "content": "hi"}]], tok, None)
    assert tok.decode(chat.ids[0]) == "<user>hi\n<assistant>"
    text = encode_prompts(["abc", "abcdef"], tok, 4)
    assert [tok.decode(ids) for ids in text.ids] == ["abc", "cdef"] and text.num_truncated == 1


def test_a_path_that_is_neither_local_nor_on_the_hub_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # before: a mistyped dataset path went to the hub and surfaced its raw ConnectionError
    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Couldn't reach 'nosuch/data' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match=r"could not load the dataset 'nosuch/data': it is not a local file or folder"):
        load_prompt_dataset("nosuch/data")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"path": "x.jsonl", "limit": "abc"}, "`dataset.limit` expects an int >= 1 or null, got 'abc' (str)"),
        ({"path": "x.jsonl", "limit": 0}, "`dataset.limit` expects an int >= 1 or null, got 0 (int)"),
        ({"path": "x.jsonl", "as_chat": "yes"}, "`dataset.as_chat` expects true or false, got 'yes' (str)"),
        ({"path": "x.jsonl", "columns": ["question"]}, "`dataset.columns` expects a mapping of old: new column"),
        ({"path": 3}, "`dataset.path` expects a file, folder or hub id (str), got 3 (int)"),
    ],
)
def test_run_file_dataset_entries_are_type_checked(entry: dict[str, object], message: str) -> None:
    # before: `dataset.limit=abc` failed later with a raw TypeError traceback
    with pytest.raises(ValueError, match=re.escape(message)):
        DatasetSource.parse(entry, "dataset")


def test_a_split_a_single_file_or_saved_dataset_lacks_is_refused(tmp_path: Path) -> None:
    # before: `split: tset` on a file loaded the file as if no split were named, and trained on it
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in ROWS))
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    for source in (path, tmp_path / "ds"):
        assert len(load_prompt_dataset(source, split="train")) == 2  # the default names the one split
        with pytest.raises(ValueError, match=r"split 'tset' not found; available splits: train \(.* holds one split\)"):
            load_prompt_dataset(source, split="tset")
        with pytest.raises(ValueError, match="split 'tset' not found"):
            DatasetSource(path=str(source), split="tset").load()
    held = datasets.Dataset.from_list(ROWS, split=datasets.Split.TEST)
    held.save_to_disk(str(tmp_path / "held"))
    assert len(load_prompt_dataset(tmp_path / "held", split="test")) == 2  # a saved split answers to its name


def test_a_missing_prompt_column_names_the_rename_where_it_goes(tmp_path: Path) -> None:
    path = tmp_path / "questions.jsonl"
    path.write_text(json.dumps({"problem": "1+1=", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match=re.escape("'eval_dataset.columns={problem: prompt}' on rloo train's")):
        DatasetSource(path=str(path)).load("eval_dataset")
    # before: as_chat read the missing column and failed with a bare KeyError
    with pytest.raises(ValueError, match=re.escape("--column problem=prompt on the command line")):
        DatasetSource(path=str(path), as_chat=True).load("--column")
