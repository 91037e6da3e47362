"""Every field named as a field of the installed TRL's RLOOConfig (GRPOConfig, and GRPO's names rloo reads back)
has TRL's default, or is a listed deliberate difference with its reason (rloo/config/trl/defaults.py); the
migration docs' table is that list, TRL's defaults written out are accepted, and the differences in effect are
printed once at start-up."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

import pytest

from rloo import GRPOConfig, RLOOConfig
from rloo.config.fields.declare import default_value
from rloo.config.trl.defaults import DIFFERENCES, TRL_SPELLINGS, differences_markdown, start_up_note
from rloo.config.trl.grpo_names import GRPO_NAMES
from tests.helpers.paths import REPO

trl = pytest.importorskip("trl")  # the trl extra (make install); TRL's classes are what this compares with
PAIRS = [(RLOOConfig, trl.RLOOConfig), (GRPOConfig, trl.GRPOConfig)]
PAGE = REPO / "docs" / "migrating-from-trl.md"
START, END = "<!-- trl-defaults:start -->\n", "\n<!-- trl-defaults:end -->"


def trl_defaults(config_class: type) -> dict[str, Any]:
    """TRL's declared defaults (an enum as its value), by field name."""
    out = {}
    for f in dataclasses.fields(config_class):
        if f.init and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING):
            value = default_value(f)
            out[f.name] = value.value if isinstance(value, enum.Enum) else value
    return out


def shared_names(ours: type, theirs: type) -> list[str]:
    """The fields of ``theirs`` that ``ours`` has: fields, and GRPO's names read back from the resolved knobs."""
    return sorted((set(ours.field_names()) | set(GRPO_NAMES)) & set(trl_defaults(theirs)))


def is_trls(name: str, declared: Any, read_back: Any, theirs: Any) -> bool:
    """Whether rloo's default (as declared, or as a default config reads it back) is TRL's ``theirs``."""
    if isinstance(theirs, str):
        theirs = TRL_SPELLINGS.get(name, {}).get(theirs, theirs)
    for ours in (declared, read_back):
        if isinstance(ours, list | tuple) and isinstance(theirs, str):  # a single name is a one-item list
            ours = ours[0] if len(ours) == 1 else ours
        if ours == theirs and isinstance(ours, bool) == isinstance(theirs, bool):
            return True
    return False


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=["RLOOConfig", "GRPOConfig"])
def test_every_default_is_trls_or_a_listed_difference(ours: type, theirs: type) -> None:
    config, defaults = ours(), trl_defaults(theirs)
    declared = {f.name: default_value(f) for f in dataclasses.fields(ours) if f.init}
    names = shared_names(ours, theirs)
    assert len(names) > 80, names  # the comparison sees the fields (and GRPO's read-back names)
    differing = {name for name in names if not is_trls(name, declared.get(name), getattr(config, name), defaults[name])}
    listed = {difference.name for difference in DIFFERENCES}
    unlisted = {name: (getattr(config, name), defaults[name]) for name in sorted(differing - listed)}
    assert not unlisted, (
        f"defaults (rloo's, TRL {trl.__version__}'s) that differ with no reason: {unlisted}; take TRL's default, or "
        "list it with its reason in rloo/config/trl/defaults.py (and run scripts/regen_docs.py)"
    )
    for difference in DIFFERENCES:
        assert difference.name in names, f"{difference.name}: no field of TRL's {theirs.__name__}"
        assert defaults[difference.name] == difference.trl, (
            f"{difference.name}: TRL {trl.__version__}'s default is {defaults[difference.name]!r}, the list says "
            f"{difference.trl!r}"
        )


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=["RLOOConfig", "GRPOConfig"])
def test_trls_defaults_written_out_are_accepted(ours: type, theirs: type) -> None:
    """A TRL config that writes out every default (a saved TRL config, TrlParser's YAML) builds rloo's."""
    defaults = trl_defaults(theirs)
    values = {name: defaults[name] for name in shared_names(ours, theirs)}
    config = ours(**values)
    assert config.pad_to_multiple_of is None  # TRL's 'auto': no padding anywhere rloo runs


def test_the_migration_docs_table_is_the_list() -> None:
    text = PAGE.read_text()
    assert text.count(START) == 1 and text.count(END) == 1, f"{PAGE.name} needs one {START!r} ... {END!r} block"
    table = text.split(START, 1)[1].split(END, 1)[0]
    assert table == differences_markdown(RLOOConfig), (
        f"{PAGE.name}'s table of defaults is stale: regenerate it with `.venv/bin/python scripts/regen_docs.py`"
    )
    assert differences_markdown(GRPOConfig) == table  # GRPOConfig's differences are RLOOConfig's
    assert len(table.splitlines()) == len(DIFFERENCES) + 2


def test_the_start_up_note_names_the_differences_in_effect() -> None:
    note = start_up_note(RLOOConfig(), "no")
    assert note is not None and note.startswith("defaults that differ from TRL's in this run: ")
    for shown in (
        "bf16=None (fp32 here) (TRL: None)",
        "disable_dropout=True (TRL: False)",
        "gradient_checkpointing=False (TRL: True)",
        "num_train_epochs=1.0 (TRL: 3.0)",
        "optim='adamw_torch' (TRL: 'adamw_torch_fused')",
    ):
        assert shown in note
    assert "per_device_eval_batch_size" not in note  # no evaluation in this run
    assert "docs/migrating-from-trl.md" in note
    on_a_gpu = start_up_note(RLOOConfig(max_steps=10, eval_steps=5), "bf16")
    assert on_a_gpu is not None and "bf16" not in on_a_gpu and "num_train_epochs" not in on_a_gpu
    assert "per_device_eval_batch_size=None (TRL: 8)" in on_a_gpu
    as_trl = RLOOConfig(
        max_steps=10, disable_dropout=False, gradient_checkpointing=True, optim="adamw_torch_fused", bf16=False
    )
    assert start_up_note(as_trl, "no") is None  # every field set: nothing left at a default that differs


def test_the_trainer_prints_the_note_once_at_start_up(tmp_path: Path, capsys: Any) -> None:
    from rloo import RLOOTrainer
    from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer

    tokenizer = make_tokenizer()
    trainer = RLOOTrainer(
        make_model(tokenizer),
        frac7,
        args=config(tmp_path, max_steps=1, optim="adamw_torch_fused"),
        train_dataset=dataset(),
        processing_class=tokenizer,
    )
    trainer.train()
    printed = capsys.readouterr().err
    assert printed.count("defaults that differ from TRL's in this run:") == 1
    line = next(line for line in printed.splitlines() if line.startswith("defaults that differ"))
    assert "disable_dropout=True (TRL: False)" in line and "optim" not in line  # set to TRL's: not named
