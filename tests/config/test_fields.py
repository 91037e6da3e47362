"""RLOOConfig's fields through transformers' HfArgumentParser, the parser TRL's TrlParser builds on:
every field becomes a flag, and the parsed config equals the one built with the same keywords."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from transformers import HfArgumentParser

from rloo import RLOOConfig
from rloo.config.fields import trl_name


@dataclasses.dataclass
class ScriptArguments:
    """A script's own arguments, parsed beside the config (TRL's scripts parse three such classes)."""

    dataset_name: str = dataclasses.field(default="trl-lib/tldr", metadata={"help": "the dataset"})


def test_hfargumentparser_parses_the_config_as_the_constructor_builds_it(tmp_path: Path) -> None:
    flags = ["--output_dir", str(tmp_path / "run"), "--learning_rate", "1e-5", "--beta", "0.05"]
    flags += ["--num_generations", "4", "--dataset_name", "local"]
    script, args = HfArgumentParser((ScriptArguments, RLOOConfig)).parse_args_into_dataclasses(flags)
    assert script.dataset_name == "local"
    expected = RLOOConfig(output_dir=str(tmp_path / "run"), learning_rate=1e-5, beta=0.05, num_generations=4)
    assert isinstance(args, RLOOConfig) and args.to_dict() == expected.to_dict()


def test_after_hfargumentparser_the_config_still_checks_its_types(tmp_path: Path) -> None:
    HfArgumentParser(RLOOConfig)  # rewrites the fields' types in place (Optional stripped)
    assert RLOOConfig(output_dir=str(tmp_path), reward_clip_range=None).reward_clip_range is None
    with pytest.raises(ValueError, match=r"num_generations='4' is invalid: expects int"):
        RLOOConfig(output_dir=str(tmp_path), num_generations="4")


def test_the_trl_counterparts_stay_out_of_argparse_metadata() -> None:
    declared = [f for f in dataclasses.fields(RLOOConfig) if f.init]
    assert all(set(f.metadata) == {"help"} for f in declared)
    names = {f.name: trl_name(f) for f in declared}
    assert names["learning_rate"] == "learning_rate" and names["preset"] is None
