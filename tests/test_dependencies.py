"""How dependencies are bounded, kept true: pyproject's lower bounds are what `make test-oldest`
installs, `make install` installs the versions CI ran, and nothing rloo does on the installed
transformers is deprecated there. The checks against other versions (`make test-newest`,
`make test-oldest`) install into venvs of their own and are marked ``deps``."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path
from typing import Any

import pytest
import transformers
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from peft import LoraConfig

from rloo import RLOOTrainer
from rloo.generation.rollout import generate_rollouts
from rloo.generation.sampling import SamplingParams
from tests.helpers.models import config, dataset, make_model, make_tokenizer, token_id_sum

ROOT = Path(__file__).resolve().parents[1]
REMOVAL = re.compile(r"deprecated|will be removed", re.IGNORECASE)


def requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = [Requirement(line) for line in project["dependencies"]]
    return {canonicalize_name(req.name): req for req in listed}


def pins(name: str) -> dict[str, str]:
    found = {}
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            package, version = line.split("==")
            found[canonicalize_name(package)] = version
    return found


def lower_bound(req: Requirement) -> str:
    (bound,) = [spec.version for spec in req.specifier if spec.operator == ">="]
    return bound


def test_oldest_pins_are_the_lower_bounds_of_the_stack() -> None:
    required, oldest = requirements(), pins("oldest.txt")
    assert set(oldest) <= set(required), "requirements/oldest.txt pins a package pyproject does not require"
    for name, version in oldest.items():
        assert lower_bound(required[name]) == version, (
            f"pyproject.toml requires {required[name]} but requirements/oldest.txt pins {name}=={version}: "
            "make test-oldest would test another version than the bound users get"
        )
    assert {"transformers", "accelerate", "peft", "datasets"} <= set(oldest)


def test_the_tested_versions_satisfy_pyproject_and_make_install_uses_them() -> None:
    tested = pins("tested.txt")
    for name, req in requirements().items():
        if name != "torch":  # TORCH_SPEC's, not the lock's
            assert name in tested and req.specifier.contains(tested[name]), (name, tested.get(name))
    makefile = (ROOT / "Makefile").read_text()
    assert "CONSTRAINTS ?= requirements/tested.txt" in makefile
    assert '-e ".[dev,trl]" $(if $(CONSTRAINTS),-c $(CONSTRAINTS))' in makefile


def test_the_lower_bound_is_no_newer_than_what_runs_here() -> None:
    bound = lower_bound(requirements()["transformers"])
    assert Requirement(f"transformers>={bound}").specifier.contains(transformers.__version__)


class Removals(logging.Handler):
    """Warnings and transformers log records that announce a deprecation or removal."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if REMOVAL.search(record.getMessage()):
            self.messages.append(record.getMessage())


def run_without_removals(action: Any) -> list[str]:
    handler, logger = Removals(), logging.getLogger("transformers")
    once = transformers.utils.logging.warning_once
    if hasattr(once, "cache_clear"):  # each message is logged once per process: show it to this test too
        once.cache_clear()
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            action()
    finally:
        logger.removeHandler(handler)
    return handler.messages + [str(w.message) for w in caught if REMOVAL.search(str(w.message))]


def test_lora_training_with_checkpointing_uses_no_deprecated_transformers_api(tmp_path: Path) -> None:
    tokenizer = make_tokenizer()
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0)
    args = config(tmp_path, max_steps=2, beta=0.1, gradient_checkpointing=True)
    trained: list[Any] = []

    def build_and_train() -> None:  # peft wraps the model in the constructor
        trainer = RLOOTrainer(
            model=make_model(tokenizer),
            reward_funcs=token_id_sum,
            args=args,
            train_dataset=dataset(8),
            processing_class=tokenizer,
            peft_config=lora,
        )
        trained.append(trainer.train())

    assert run_without_removals(build_and_train) == []
    assert trained[0].global_step == 2


def test_state_space_sampling_uses_no_deprecated_transformers_api() -> None:
    tokenizer = make_tokenizer()
    fields = {"hidden_size": 32, "num_hidden_layers": 2, "state_size": 8, "expand": 2, "conv_kernel": 4}
    model = transformers.MambaForCausalLM(transformers.MambaConfig(vocab_size=len(tokenizer), **fields)).eval()
    prompts = [tokenizer.encode("1+2="), tokenizer.encode("3=")]

    def sample() -> None:
        generate_rollouts(
            model,
            prompts,
            [0, 1],
            num_generations=2,
            max_new_tokens=4,
            params=SamplingParams(temperature=0.0),
            eos_token_ids=[tokenizer.eos_token_id],
            pad_token_id=tokenizer.pad_token_id,
        )

    assert run_without_removals(sample) == []


@pytest.mark.deps
@pytest.mark.parametrize("which", ["newest", "oldest"])
def test_family_and_trainer_tests_pass_on_other_versions(which: str) -> None:
    """`make test-newest` / `make test-oldest`: installs a venv of its own (minutes, needs the index)."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_dependencies.py"), which], cwd=ROOT)
    assert done.returncode == 0


def test_the_license_pyproject_names_is_in_the_repository() -> None:
    import tomllib

    root = Path(__file__).resolve().parents[1]
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["license"]
    text = (root / "LICENSE").read_text()
    assert declared == "Apache-2.0" and "Apache License" in text and "Version 2.0, January 2004" in text
