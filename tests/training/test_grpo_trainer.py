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
