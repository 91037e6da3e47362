"""``from rloo import GRPOConfig, GRPOTrainer``: a GRPO script with its imports changed trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from rloo import GRPOConfig, GRPOTrainer, RLOOConfig
from tests.helpers.models import dataset, frac7, make_model, make_tokenizer, params


def test_grpotrainer_trains_grpo_by_default(tmp_path: Path) -> None:
    tok = make_tokenizer()
    model = make_model(tok)
    before = params(model)
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=6,
        learning_rate=1e-2,
        max_steps=2,
        loss_type="grpo",
        scale_rewards="batch",
    )
    trainer = GRPOTrainer(model=model, reward_funcs=frac7, args=args, train_dataset=dataset(), processing_class=tok)
    trainer.train()
    assert trainer.args.algorithm.advantage_estimator == "reinforce_pp_baseline"
    assert trainer.args.algorithm.loss_aggregation == "seq_mean_token_mean"
    assert any(not (before[name] == value).all() for name, value in params(trainer.model).items())
    assert "preset: trl_grpo" in (tmp_path / "run" / "config.yaml").read_text()


def test_grpotrainer_without_args_uses_grpoconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no output_dir: the run folder is made under the working directory
    tok = make_tokenizer()
    trainer = GRPOTrainer(make_model(tok), frac7, None, dataset(), processing_class=tok)
    assert isinstance(trainer.args, GRPOConfig) and trainer.args.preset == "trl_grpo"
    assert isinstance(trainer.args, RLOOConfig) and trainer.args.frozen


def test_async_grpo_takes_trls_arguments_in_trls_order_with_its_async_defaults(tmp_path: Path) -> None:
    # TRL 1.16's AsyncGRPOTrainer(model, reward_funcs, args, train_dataset, processing_class, callbacks, ...):
    # no eval_dataset, so its fifth argument is the tokenizer; AsyncGRPOConfig samples 4 steps behind (TRL's
    # max_staleness) in one rollout worker process
    from rloo import AsyncGRPOConfig, AsyncGRPOTrainer

    assert (AsyncGRPOConfig(output_dir=str(tmp_path)).max_staleness, AsyncGRPOConfig().rollout_workers) == (4, 1)
    tok = make_tokenizer()
    args = AsyncGRPOConfig(output_dir=str(tmp_path / "run"), num_generations=4, per_device_train_batch_size=8,
                           max_completion_length=6, max_steps=2, rollout_workers=0)  # fmt: skip
    trainer = AsyncGRPOTrainer(make_model(tok), frac7, args, dataset(), tok)
    assert trainer.processing_class is tok and trainer.args.max_staleness == 4
    assert trainer.args.algorithm.clip_ratio  # a lagged batch's ratio stays clipped
    trainer.train()  # in this process (rollout_workers=0: the worker's own process is the system tier's)
    assert trainer.state.global_step == 2
    with pytest.raises(ValueError, match=r"AsyncGRPOTrainer\(rollout_worker=\.\.\.\) is TRL's vLLM-side protocol"):
        AsyncGRPOTrainer(make_model(tok), frac7, args, dataset(), tok, rollout_worker=object())
