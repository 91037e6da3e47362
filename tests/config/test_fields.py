"""RLOOConfig's fields through transformers' HfArgumentParser, the parser TRL's TrlParser builds on:
every field becomes a flag, and the parsed config equals the one built with the same keywords."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from pathlib import Path

import pytest
from transformers import HfArgumentParser

from rloo import RLOOConfig
from rloo.config.fields.declare import trl_name


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


def test_list_and_mapping_fields_parse_from_flags(tmp_path: Path) -> None:
    # before: `--reward_weights 1.0 0.5` was "invalid Sequence value" (argparse called Sequence('1.0')),
    # and a mapping field could not be given at all
    flags = ["--output_dir", str(tmp_path), "--reward_weights", "1.0", "0.5", "--report_to", "tensorboard"]
    flags += ["--reward_clip_range", "-2", "2", "--model_init_kwargs", '{"dtype": "bfloat16"}']
    flags += ["--generation_kwargs", '{"stop_strings": ["\\n\\n"]}', "--health_thresholds", '{"window": 3}']
    (args,) = HfArgumentParser(RLOOConfig).parse_args_into_dataclasses(flags)
    assert args.reward_weights == (1.0, 0.5) and args.report_to == ("tensorboard",)
    assert args.reward_clip_range == (-2.0, 2.0) and args.model_init_kwargs == {"dtype": "bfloat16"}
    assert args.stop_strings == ("\n\n",) and args.health_thresholds["window"] == 3
    (defaults,) = HfArgumentParser(RLOOConfig).parse_args_into_dataclasses(["--output_dir", str(tmp_path)])
    assert defaults.to_dict() == RLOOConfig(output_dir=str(tmp_path)).to_dict()  # a list field's default too


def test_a_mapping_field_given_a_string_must_hold_a_json_object(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"init_kwargs='dtype=bfloat16' is invalid: expects a mapping, or a JSON"):
        RLOOConfig(output_dir=str(tmp_path), model_init_kwargs="dtype=bfloat16")
    with pytest.raises(ValueError, match=r"not a JSON list"):
        RLOOConfig(output_dir=str(tmp_path), generation_kwargs="[1, 2]")


def test_trlparser_reads_a_trl_yaml_with_list_and_mapping_fields(tmp_path: Path) -> None:
    from trl import ModelConfig, ScriptArguments, TrlParser

    config = tmp_path / "recipe.yaml"
    config.write_text(
        "model_name_or_path: Qwen/Qwen3-0.6B\ndataset_name: trl-lib/DeepMath-103K\nlearning_rate: 1.0e-6\n"
        "reward_weights: [1.0, 0.2]\nreport_to: [tensorboard]\nmodel_init_kwargs: {dtype: bfloat16}\n"
        f"output_dir: {tmp_path / 'run'}\nnum_generations: 8\n"
    )
    parser = TrlParser((ScriptArguments, RLOOConfig, ModelConfig))
    script, args, model = parser.parse_args_and_config(["--config", str(config), "--num_generations", "4"])
    assert script.dataset_name == "trl-lib/DeepMath-103K" and model.model_name_or_path == "Qwen/Qwen3-0.6B"
    assert isinstance(args, RLOOConfig) and args.num_generations == 4  # a flag wins over the file, as in TRL
    assert args.learning_rate == 1e-6 and args.reward_weights == (1.0, 0.2) and args.report_to == ("tensorboard",)
    assert args.model_init_kwargs == {"dtype": "bfloat16"}


def test_every_field_group_is_in_the_config_and_its_checks_run() -> None:
    # a group is one module of rloo/config/fields: its dataclass among RLOOFields' bases, its check_* in
    # GROUP_CHECKS (so a new group that is not wired in fails here, not silently unchecked)
    from rloo.config import fields
    from rloo.config.fields import GROUP_CHECKS, RLOOFields

    for info in pkgutil.iter_modules(fields.__path__):
        if info.name == "declare":
            continue
        module = importlib.import_module(f"rloo.config.fields.{info.name}")
        groups = [v for v in vars(module).values() if dataclasses.is_dataclass(v) and v.__module__ == module.__name__]
        assert len(groups) == 1 and groups[0] in RLOOFields.__bases__, f"{info.name}: one group, in RLOOFields"
        checks = [f for name, f in vars(module).items() if name.startswith("check_") and callable(f)]
        assert all(check in GROUP_CHECKS for check in checks), f"{info.name}: its check_* must be in GROUP_CHECKS"
    declared = [f.name for f in dataclasses.fields(RLOOFields)]
    assert [f.name for f in dataclasses.fields(RLOOConfig) if f.init] == declared
