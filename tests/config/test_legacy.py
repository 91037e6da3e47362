"""TRL users' settings: older TRL field names, fp16, and transformers' ``optim`` names (offline, CPU)."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import bitsandbytes as bnb
import pytest
import torch
import yaml
from transformers.optimization import Adafactor
from transformers.training_args import OptimizerNames

from rloo.cli.run_file import load_run_file
from rloo.config import RLOOConfig
from rloo.config.optimizers import OPTIMIZERS
from rloo.config.trl.legacy import REFUSED, RENAMED
from rloo.training.setup import optimization
from rloo.training.setup.models import bf16_supported, resolve_mixed_precision
from rloo.training.setup.optimization import build_optimizer
from tests.helpers.cli import invoke
from tests.helpers.models import params, trainer

pytestmark = pytest.mark.usefixtures("one_thread")

# an older name, a value it may take, and the value today's field then holds
OLDER: list[tuple[str, Any]] = [
    ("rloo_k", 4),
    ("kl_coef", 0.1),
    ("cliprange", 0.3),
    ("num_ppo_epochs", 2),
    ("response_length", 64),
    ("exp_name", "my-run"),
    ("use_transformers_paged", True),
]


def test_every_renamed_field_is_tested_and_maps_to_a_field() -> None:
    assert sorted(RENAMED) == sorted(old for old, _ in OLDER)
    fields = RLOOConfig.field_names()
    assert set(RENAMED.values()) <= set(fields)
    assert not (set(RENAMED) | set(REFUSED)) & set(fields)


@pytest.mark.parametrize(("old", "value"), OLDER)
def test_an_older_name_sets_todays_field_with_one_warning_at_the_callers_line(old: str, value: Any) -> None:
    new = RENAMED[old]
    with pytest.warns(FutureWarning) as caught:
        config = RLOOConfig(**{old: value})
    assert len(caught) == 1
    assert str(caught[0].message) == (
        f"RLOOConfig({old}=...) is TRL's older name for {new}; write {new}={value!r} (config.yaml records {new})"
    )
    assert caught[0].filename == __file__
    assert getattr(config, new) == value
    assert config == RLOOConfig(**{new: value})
    assert old not in config.to_dict()


@pytest.mark.parametrize(("old", "value"), OLDER)
def test_both_names_with_different_values_are_an_error_naming_both(old: str, value: Any) -> None:
    new = RENAMED[old]
    with pytest.raises(ValueError) as info:
        RLOOConfig(**{old: value, new: value * 2})
    assert str(info.value) == (
        f"RLOOConfig got {old}={value!r} and {new}={value * 2!r}: {old} is TRL's older name for {new}; give only {new}"
    )
    with pytest.warns(FutureWarning):  # the same value twice is one setting
        assert getattr(RLOOConfig(**{old: value, new: value}), new) == value


@pytest.mark.parametrize("old", sorted(REFUSED))
def test_older_names_whose_meaning_changed_are_refused_with_the_fix(old: str) -> None:
    with pytest.raises(ValueError) as info:
        RLOOConfig(**{old: 1})
    assert str(info.value) == f"RLOOConfig({old}=...) is an older TRL name rloo does not accept: {REFUSED[old]}"


def test_the_resolved_config_and_replace_use_todays_names() -> None:
    with pytest.warns(FutureWarning):
        config = RLOOConfig(kl_coef=0.02, rloo_k=4)
    written = yaml.safe_load(yaml.safe_dump(config.to_dict()))
    assert (written["beta"], written["num_generations"]) == (0.02, 4)
    assert not {"kl_coef", "rloo_k"} & written.keys()
    with pytest.warns(FutureWarning, match="older name for beta"):
        changed = config.replace(kl_coef=0.3)  # not a clash with the beta=0.02 it already holds
    assert (changed.beta, changed.num_generations) == (0.3, 4)


def test_a_run_file_with_older_names_trains_and_records_todays(tmp_path: Path, files: dict[str, Path]) -> None:
    run = {
        "model": str(files["model"]),
        "dataset": {"path": str(files["data"])},
        "reward_funcs": ["accuracy"],
        "kl_coef": "1e-2",  # YAML reads 1e-2 as a string: checked as beta, a float
        "rloo_k": 2,
        "per_device_train_batch_size": 4,
        "response_length": 4,
        "max_steps": 1,
        "save_steps": 1,
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    with pytest.warns(FutureWarning, match="older name for beta"):
        result = invoke("train", path)
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (written["beta"], written["num_generations"], written["max_completion_length"]) == (0.01, 2, 4)
    assert not {"kl_coef", "rloo_k", "response_length"} & written.keys()


def test_run_files_check_older_names_like_todays(tmp_path: Path, files: dict[str, Path]) -> None:
    base = {"model": str(files["model"]), "dataset": str(files["data"]), "reward_funcs": ["accuracy"]}
    path = tmp_path / "run.yaml"
    for extra, message in [
        ({"kl_coef": "high"}, "`kl_coef` expects float or null, got 'high' (str)"),
        (
            {"total_episodes": 1000},
            f"total_episodes=...) is an older TRL name rloo does not accept: {REFUSED['total_episodes']}",
        ),
        ({"kl_coeff": 0.1}, "unknown key `kl_coeff`"),
    ]:
        path.write_text(yaml.safe_dump({**base, **extra}))
        with pytest.raises(ValueError) as info:
            load_run_file(path)
        assert message in str(info.value)


def test_the_seed_tutorial_config_builds_with_its_8bit_optimizer(tmp_path: Path) -> None:
    # ../shared/seeds/001: the code a tutorial reader copies, with rloo's import
    with pytest.warns(FutureWarning, match="older name for beta"):
        config = RLOOConfig(
            output_dir=str(tmp_path / "rloo_output"),
            per_device_train_batch_size=1,
            gradient_accumulation_steps=4,
            max_steps=100,
            learning_rate=1e-5,
            fp16=not bf16_supported(),
            bf16=bf16_supported(),
            optim="adamw_8bit",
            num_generations=4,
            max_completion_length=128,
            kl_coef=0.05,
        )
    assert (config.beta, config.optim, config.fp16) == (0.05, "adamw_8bit", not bf16_supported())
    optimizer, _ = build_optimizer(torch.nn.Linear(2, 2), config, 100)  # on this CPU too (bitsandbytes >= 0.50)
    assert type(optimizer) is bnb.optim.AdamW and optimizer.args.optim_bits == 8


# ---------------------------------------------------------------------------- fp16
def test_fp16_without_cuda_falls_back_to_fp32_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for bf16 in (None, False):
        with pytest.warns(UserWarning) as caught:
            assert resolve_mixed_precision(bf16, fp16=True) == "no"
        assert [str(w.message) for w in caught] == [
            "fp16=True needs a CUDA GPU and there is none: training in fp32 instead"
        ]


def test_mixed_precision_mapping_on_a_cuda_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)  # a pre-Ampere GPU
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_mixed_precision(None, fp16=True) == "fp16"  # autocast + accelerate's GradScaler
        assert resolve_mixed_precision(False, fp16=True) == "fp16"
        assert resolve_mixed_precision(None) == "no"
        assert resolve_mixed_precision(True) == "bf16"
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
        assert resolve_mixed_precision(None) == "bf16"
        assert resolve_mixed_precision(False) == "no"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback is for machines without CUDA")
def test_fp16_config_trains_on_cpu_in_fp32(tmp_path: Path) -> None:
    t = trainer(tmp_path, fp16=True)
    before = params(t.unwrapped_model)
    t.train()
    assert t.accelerator.mixed_precision == "no"
    after = params(t.unwrapped_model)
    assert t.state.global_step == 2
    assert all(v.dtype == torch.float32 and bool(v.isfinite().all()) for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the fallback is for machines without CUDA")
def test_the_trainer_warns_once_about_the_fp16_fallback(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(tmp_path, fp16=True, max_steps=1).train()
    assert sum("fp16=True needs a CUDA GPU" in str(w.message) for w in caught) == 1


# ---------------------------------------------------------------------------- optim
EXPECTED_CLASS = {
    "adamw_torch": torch.optim.AdamW,
    "adamw_torch_fused": torch.optim.AdamW,
    "adafactor": Adafactor,
    "sgd": torch.optim.SGD,
    "adagrad": torch.optim.Adagrad,
    "rmsprop": torch.optim.RMSprop,
}


def test_every_optim_is_a_transformers_name_and_has_a_test() -> None:
    assert set(OPTIMIZERS) <= {name.value for name in OptimizerNames}
    assert set(OPTIMIZERS) == set(EXPECTED_CLASS) | {"adamw_8bit", "paged_adamw_8bit"}


@pytest.mark.parametrize("optim", sorted(EXPECTED_CLASS))
def test_each_optim_builds_its_class_with_the_configs_settings(optim: str) -> None:
    config = RLOOConfig(optim=optim, learning_rate=3e-4, weight_decay=0.01, adam_beta1=0.8)
    optimizer, _ = build_optimizer(torch.nn.Linear(3, 2), config, max_steps=10)
    assert type(optimizer) is EXPECTED_CLASS[optim]
    group = optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"]) == (3e-4, 0.01)
    if optim.startswith("adamw"):
        assert (group["betas"], group["eps"], bool(group["fused"])) == ((0.8, 0.999), 1e-8, optim.endswith("fused"))
    if optim == "adafactor":  # transformers' factory: the learning rate is ours, not Adafactor's relative step
        assert (group["relative_step"], group["scale_parameter"]) == (False, False)


def test_the_default_optimizer_is_the_adamw_rloo_always_built() -> None:
    config = RLOOConfig(learning_rate=1e-3, weight_decay=0.1, adam_beta1=0.85, adam_beta2=0.99, adam_epsilon=1e-6)
    models = [torch.nn.Linear(4, 3) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    built, _ = build_optimizer(models[0], config, max_steps=10)
    plain = torch.optim.AdamW(models[1].parameters(), lr=1e-3, betas=(0.85, 0.99), eps=1e-6, weight_decay=0.1)
    assert built.defaults == plain.defaults
    for step in range(3):
        grads = torch.randn(4, 3, generator=torch.Generator().manual_seed(step)).T
        for model, optimizer in zip(models, (built, plain), strict=True):
            model.weight.grad, model.bias.grad = grads.clone(), grads[:, 0].clone()
            optimizer.step()
    assert torch.equal(models[0].weight, models[1].weight) and torch.equal(models[0].bias, models[1].bias)


@pytest.mark.parametrize("optim", ["adamw_torch", "adafactor", "sgd"])
def test_two_training_steps_with_each_optim(tmp_path: Path, optim: str) -> None:
    t = trainer(tmp_path, optim=optim, save_steps=2)
    before = params(t.unwrapped_model)
    t.train()
    after = params(t.unwrapped_model)
    assert type(t.optimizer.optimizer) is EXPECTED_CLASS[optim]
    assert t.state.global_step == 2 and (tmp_path / "run" / "checkpoint-2").is_dir()  # its state was saved
    assert all(bool(v.isfinite().all()) for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_adafactor_resumes_exactly(tmp_path: Path) -> None:
    straight = trainer(tmp_path / "straight", optim="adafactor", max_steps=4, save_steps=2)
    straight.train()
    resumed = trainer(tmp_path / "resumed", optim="adafactor", max_steps=4, save_steps=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "straight" / "run" / "checkpoint-2"))
    assert resumed.state.global_step == 4 and type(resumed.optimizer.optimizer) is Adafactor
    a, b = params(straight.unwrapped_model), params(resumed.unwrapped_model)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("optim", ["adamw_8bit", "paged_adamw_8bit"])
@pytest.mark.parametrize(
    ("version", "has_gpu", "says"),
    [
        (None, True, "needs the bitsandbytes package, which is not installed: pip install 'bitsandbytes>=0.50.0'"),
        ("0.49.2", False, "without a CUDA GPU needs bitsandbytes >= 0.50.0: the installed bitsandbytes 0.49.2 runs"),
        ("0.49.2", True, None),
        ("0.50.0", False, None),
    ],
)
def test_8bit_optim_names_the_bitsandbytes_it_needs(
    monkeypatch: pytest.MonkeyPatch, optim: str, version: str | None, has_gpu: bool, says: str | None
) -> None:
    monkeypatch.setattr(optimization, "bitsandbytes_version", lambda: version)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: has_gpu)
    RLOOConfig(optim=optim)  # a valid config: the machine, not the setting, may lack something
    if says is None:
        optimization.check_optimizer_available(optim)
        return
    with pytest.raises(ValueError) as info:
        optimization.check_optimizer_available(optim)
    assert str(info.value).startswith(f"RLOOConfig.optim={optim!r} ") and says in str(info.value)
    assert "optim='adamw_torch'" in str(info.value)


def test_the_older_reward_model_keyword_is_reward_funcs(tmp_path: Path) -> None:
    from rloo import RLOOTrainer
    from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer

    tok = make_tokenizer()
    with pytest.warns(FutureWarning, match="reward_model=...\\) is TRL's older name for reward_funcs"):
        run = RLOOTrainer(
            make_model(tok), reward_model=frac7, args=config(tmp_path), train_dataset=dataset(), processing_class=tok
        )
    assert run.reward_funcs == [frac7]
    with pytest.raises(ValueError, match="got reward_funcs and reward_model"):
        RLOOTrainer(
            make_model(tok),
            frac7,
            reward_model=frac7,
            args=config(tmp_path),
            train_dataset=dataset(),
            processing_class=tok,
        )
    with pytest.raises(ValueError, match="needs reward_funcs"):
        RLOOTrainer(make_model(tok), args=config(tmp_path), train_dataset=dataset(), processing_class=tok)


# ---------------------------------------------------------------------------- logging and evaluation fields
def test_logging_first_step_logs_step_one(tmp_path: Path) -> None:
    from tests.helpers.models import trainer

    first = trainer(tmp_path, logging_steps=3, max_steps=3, logging_first_step=True)
    first.train()
    assert [row["step"] for row in first.state.log_history if "reward" in row] == [1.0, 3.0]
    plain = trainer(tmp_path / "plain", logging_steps=3, max_steps=3)
    plain.train()
    assert [row["step"] for row in plain.state.log_history if "reward" in row] == [3.0]


def test_num_generations_eval_sets_the_completions_per_eval_prompt(tmp_path: Path) -> None:
    from rloo import RLOOTrainer
    from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer

    batches: list[int] = []

    def counting(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        batches.append(len(completion_ids))
        return frac7(completion_ids)

    tok = make_tokenizer()
    args = config(tmp_path, num_generations=4, per_device_train_batch_size=8, num_generations_eval=1)
    run = RLOOTrainer(
        make_model(tok), counting, args, train_dataset=dataset(8), eval_dataset=dataset(3), processing_class=tok
    )
    metrics = run.evaluate()
    assert batches == [2, 1]  # 2 prompts per eval batch (the training batch's), 1 completion each
    assert metrics["eval_unscorable"] == 0.0


# ---------------------------------------------------------------------------- eval_strategy, save_strategy, run_name
def _strategy_run(tmp_path: Path, **overrides: Any) -> Any:
    from rloo import RLOOTrainer
    from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer

    tokenizer = make_tokenizer()
    args = config(tmp_path, **overrides)
    # 6 prompts, 2 a step: an epoch ends every 3 steps
    return RLOOTrainer(
        make_model(tokenizer),
        frac7,
        args=args,
        train_dataset=dataset(6),
        eval_dataset=dataset(2),
        processing_class=tokenizer,
    )


def test_epoch_strategies_evaluate_and_checkpoint_after_each_pass(tmp_path: Path) -> None:
    run = _strategy_run(tmp_path, max_steps=7, eval_strategy="epoch", save_strategy="epoch")
    run.train()
    assert [row["step"] for row in run.state.log_history if "eval_reward" in row] == [3.0, 6.0]
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]


def test_no_strategies_never_evaluate_or_checkpoint(tmp_path: Path) -> None:
    run = _strategy_run(tmp_path, max_steps=4, eval_steps=1, eval_strategy="no", save_steps=1, save_strategy="no")
    run.train()
    assert not [row for row in run.state.log_history if "eval_reward" in row]
    assert not list((tmp_path / "run").glob("checkpoint-*")) and (tmp_path / "run" / "final").is_dir()


def test_steps_strategies_follow_the_step_counts(tmp_path: Path) -> None:
    run = _strategy_run(tmp_path, max_steps=4, eval_strategy="steps", eval_steps=2, save_steps=4)
    run.train()
    assert [row["step"] for row in run.state.log_history if "eval_reward" in row] == [2.0, 4.0]
    assert [p.name for p in (tmp_path / "run").glob("checkpoint-*")] == ["checkpoint-4"]
    assert RLOOConfig(eval_steps=5).evaluation_strategy == "steps" and RLOOConfig().evaluation_strategy == "no"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eval_strategy": "often"}, "RLOOConfig.eval_strategy='often' is invalid: choose one of"),
        ({"save_strategy": "best"}, "RLOOConfig.save_strategy='best' is invalid: choose one of"),
        ({"eval_strategy": "steps"}, "set eval_steps"),
    ],
)
def test_bad_strategies_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        RLOOConfig(**kwargs)


def test_an_epoch_evaluation_without_an_eval_dataset_is_refused(tmp_path: Path) -> None:
    from rloo import RLOOTrainer
    from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer

    tokenizer = make_tokenizer()
    with pytest.raises(ValueError, match=re.escape("RLOOConfig.eval_strategy='epoch' needs an eval_dataset")):
        RLOOTrainer(
            make_model(tokenizer),
            frac7,
            args=config(tmp_path, eval_strategy="epoch"),
            train_dataset=dataset(),
            processing_class=tokenizer,
        )


def test_run_name_is_printed_at_start_up(tmp_path: Path, capsys: Any) -> None:
    run = _strategy_run(tmp_path, max_steps=1, run_name="my-experiment")
    run.train()
    assert "run my-experiment:" in capsys.readouterr().err
    plain = _strategy_run(tmp_path / "b", max_steps=1)
    plain.train()
    assert "run run:" in capsys.readouterr().err  # output_dir's folder name


# ---------------------------------------------------------------------------- load_best_model_at_end
def test_load_best_model_at_end_restores_the_best_evaluated_weights(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from tests.helpers.models import params

    rewards = iter([0.2, 0.9, 0.5])  # the eval metric at steps 1, 2, 3: step 2 is the best
    run = _strategy_run(tmp_path, max_steps=3, eval_steps=1, load_best_model_at_end=True)
    original = run.evaluate
    snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def scripted(*args: Any, **kwargs: Any) -> dict[str, float]:
        logs = original(*args, **kwargs)
        snapshots[run.state.global_step] = params(run.unwrapped_model)
        return {**logs, "eval_reward": next(rewards)}

    run.evaluate = scripted  # type: ignore[method-assign]
    run.train()
    assert run.state.best_metric == 0.9 and run.state.best_global_step == 2
    final = load_file(str(tmp_path / "run" / "final" / "model.safetensors"))
    for name, value in snapshots[2].items():
        torch.testing.assert_close(params(run.unwrapped_model)[name], value, rtol=0, atol=0)
        if name in final:
            torch.testing.assert_close(final[name], value, rtol=0, atol=0)
    assert any(not torch.equal(snapshots[2][k], snapshots[3][k]) for k in snapshots[2])  # step 3 moved on
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if "best" in p.name) == ["best"]


def test_greater_is_better_false_keeps_the_lowest(tmp_path: Path) -> None:
    from rloo.training.checkpointing.best_model import BestModel, metric_name

    args = RLOOConfig(
        eval_steps=1, load_best_model_at_end=True, metric_for_best_model="loss_like", greater_is_better=False
    )
    assert metric_name(args) == "eval_loss_like"
    best = BestModel(args=args, output_dir=tmp_path)
    written: list[Path] = []

    def write(path: Path) -> None:
        path.mkdir()
        written.append(path)

    assert best.observe(None, {"eval_loss_like": 2.0}, write, lambda work: work()) == 2.0
    assert best.observe(2.0, {"eval_loss_like": 3.0}, write, lambda work: work()) is None
    assert best.observe(2.0, {"eval_loss_like": 1.0}, write, lambda work: work()) == 1.0
    assert len(written) == 2 and (tmp_path / "best").is_dir() and not (tmp_path / "tmp-best").exists()
    with pytest.raises(ValueError, match="metric_for_best_model reads 'eval_loss_like'"):
        best.observe(1.0, {"eval_reward": 1.0}, write, lambda work: work())
    with pytest.raises(ValueError, match="load_best_model_at_end=True is invalid: it needs evaluations"):
        RLOOConfig(load_best_model_at_end=True)


@pytest.mark.parametrize(
    ("optim", "optim_args", "expected"),
    [
        ("sgd", "momentum=0.9,nesterov=true", {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
        (
            "sgd",
            "momentum=0.5, dampening=0.1, weight_decay=0.2",
            {"momentum": 0.5, "dampening": 0.1, "weight_decay": 0.2},
        ),
        ("adagrad", "lr_decay=0.01,eps=1e-6", {"lr_decay": 0.01, "eps": 1e-6}),
        ("rmsprop", "alpha=0.9,centered=1,momentum=0.3", {"alpha": 0.9, "centered": True, "momentum": 0.3}),
    ],
)
def test_optim_args_reach_the_optimizer_as_transformers_reads_them(
    optim: str, optim_args: str, expected: dict[str, Any]
) -> None:
    config = RLOOConfig(optim=optim, optim_args=optim_args, learning_rate=1e-3, weight_decay=0.01)
    optimizer, _ = build_optimizer(torch.nn.Linear(3, 2), config, max_steps=10)
    group = optimizer.param_groups[0]
    assert {key: group[key] for key in expected} == expected
    assert group["lr"] == 1e-3


@pytest.mark.parametrize(
    ("optim", "optim_args", "message"),
    [
        ("adamw_torch", "eps=1e-6", "optim='adamw_torch' takes no optim_args"),
        ("sgd", "momentun=0.9", "sgd reads ['momentum', 'dampening', 'weight_decay', 'nesterov'], not 'momentun'"),
        ("sgd", "momentum", "'momentum' is not key=value"),
        ("sgd", "momentum=fast", "momentum is a number, got 'fast'"),
        ("rmsprop", "centered=maybe", "centered is true or false, got 'maybe'"),
    ],
)
def test_bad_optim_args_are_refused_naming_the_field(optim: str, optim_args: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"RLOOConfig.optim_args={optim_args!r} is invalid")) as error:
        RLOOConfig(optim=optim, optim_args=optim_args)
    assert message in str(error.value)
