"""End-to-end runs of RLOOTrainer on tiny random-init Llama models (offline, CPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rloo import RLOOTrainer
from rloo.tiny import build_char_tokenizer, build_tiny_llama, save_tiny_model
from tests.helpers.models import (
    CHARS,
    config,
    dataset,
    frac7,
    last_train_log,
    make_model,
    make_tokenizer,
    params,
    tiny_reward_model,
    trainer,
)

TRL_METRICS = [
    "reward",
    "reward_std",
    "rewards/frac7/mean",
    "rewards/frac7/std",
    "kl",
    "entropy",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
    "step_time",
    "advantages/mean",
    "advantages/std",
    "frac_reward_zero_std",
    "loss",
    "grad_norm",
    "learning_rate",
    "num_tokens",
    "timing/rollout",
    "timing/generate",
    "timing/score",
    "timing/logprobs",
    "timing/advantages",
    "timing/diagnostics",
    "timing/update",
    "timing/step",
    "policy_version",
    "tokens_per_second",
]


def test_one_step_changes_parameters_and_logs_every_metric(tmp_path: Path) -> None:
    t = trainer(tmp_path, max_steps=1, beta=0.05)
    before = params(t.unwrapped_model)
    t.train()
    after = params(t.unwrapped_model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    logged = last_train_log(t)
    missing = [m for m in TRL_METRICS if m not in logged]
    assert not missing, missing
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["step"] == 1
    assert (tmp_path / "run" / "config.yaml").is_file()
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_rloo_learns_a_trivial_task(tmp_path: Path) -> None:
    """Reward = share of '7' tokens; starts near 1/17 and must rise clearly."""
    t = trainer(tmp_path, max_steps=20, per_device_train_batch_size=32, logging_steps=5, beta=0.0)
    t.train()
    rewards = [h["reward"] for h in t.state.log_history if "reward" in h]
    assert rewards[0] < 0.2
    assert rewards[-1] > 0.4, rewards


def test_beta_zero_loads_no_reference(tmp_path: Path) -> None:
    assert trainer(tmp_path, beta=0.0).ref_model is None
    t = trainer(tmp_path, beta=0.1)
    assert t.ref_model is not None
    assert all(not p.requires_grad for p in t.ref_model.parameters())


def test_same_seed_gives_identical_parameters(tmp_path: Path) -> None:
    runs = []
    for name in ("a", "b"):
        t = trainer(tmp_path / name, max_steps=3, beta=0.05)
        t.train()
        runs.append(params(t.unwrapped_model))
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])


def test_num_iterations_two_uses_old_logprobs_and_clipping(tmp_path: Path) -> None:
    t = trainer(tmp_path, max_steps=4, num_iterations=2, learning_rate=5e-2, epsilon=0.05)
    seen: list[Any] = []
    original = t._optimizer_steps

    def spy(batch: Any) -> Any:
        seen.append(batch.old_logprobs)
        return original(batch)

    t._optimizer_steps = spy  # type: ignore[method-assign]
    t.train()
    assert seen and all(old is not None for old in seen)
    clipped = [h["clip_ratio/region_mean"] for h in t.state.log_history if "reward" in h]
    # the first pass over a batch has ratio 1; the second one moves and gets clipped
    assert max(clipped) > 0


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_policy_equal_to_reference_has_kl_exactly_zero(
    tmp_path: Path, bf16: bool, estimator: str, fresh_accelerate_state: Any
) -> None:
    # issue 25: the KL's policy side came from the sampler's one-token decode, its reference side from a
    # batched forward: 1e-15 per token in float32 at step 0 (on a GPU in bf16, far more; with k2/k3 a
    # positive, length-proportional penalty). Both sides now come from the same passes.
    run = trainer(tmp_path, beta=0.1, kl_estimator=estimator, learning_rate=1e-30, max_steps=3, bf16=bf16)
    run.train()
    assert [row["kl"] for row in run.state.log_history if "kl" in row] == [0.0] * 3


def test_a_reused_batchs_first_step_is_on_policy_whatever_the_stored_old_logprobs(tmp_path: Path) -> None:
    # issue 25: the stored old log-probs come from a differently shaped pass; in bf16 on a GPU their
    # per-token noise, summed by the sequence-level ratio, could clip the first (on-policy) step. Here
    # they are offset by +0.05 per token (about exp(-0.3) for 6 tokens, far outside epsilon 0.05):
    # before, the first step clipped; now it takes the training pass's own log-probs (ratio 1), reports
    # the stored ones' gap, and the batch's later steps compare with the first step's log-probs.
    t = trainer(tmp_path, max_steps=1, num_iterations=2, epsilon=0.05, logging_steps=1)
    original = t.experience.logprobs

    def noisy(rollout: Any, **kwargs: Any) -> Any:
        stored = original(rollout, **kwargs)
        stored.old.add_(0.05)
        return stored

    t.experience.logprobs = noisy  # type: ignore[method-assign]
    t.train()
    first = last_train_log(t)
    assert first["clip_ratio/region_mean"] == 0.0
    assert first["first_step/abs_log_ratio"] == pytest.approx(0.05, abs=1e-4)


def test_the_first_step_hands_its_fresh_old_logprobs_on_and_leaves_the_frozen_batch_alone(tmp_path: Path) -> None:
    # issue 41: the first on-policy step wrote its log-probs into the frozen TrainBatch in place; now it
    # returns a batch carrying them, which the batch's later steps train on
    t = trainer(tmp_path, max_steps=2, num_iterations=2)
    original_logprobs, original_step = t.experience.logprobs, t.updater.step
    seen: list[tuple[bool, Any, Any, Any, Any]] = []

    def noisy(rollout: Any, **kwargs: Any) -> Any:
        stored = original_logprobs(rollout, **kwargs)
        stored.old.add_(0.05)
        return stored

    def spy(batch: Any, rows: Any, step: int, first: bool = False, on_completed: Any = None) -> Any:
        given = batch.old_logprobs.clone()
        outcome = original_step(batch, rows, step, first, on_completed)
        seen.append((first, given, batch.old_logprobs, outcome.batch.old_logprobs, batch.rollout.completion_mask))
        return outcome

    t.experience.logprobs = noisy  # type: ignore[method-assign]
    t.updater.step = spy  # type: ignore[method-assign]
    t.train()
    (first, given, after, returned, mask), (later, handed, *_) = seen
    assert first and not later
    assert torch.equal(after, given)  # the batch given is left as it was
    gap = ((given - returned) * mask).sum(dim=1) / mask.sum(dim=1)  # per row: 0.05 where trained, else 0
    fresh = gap > 0.025
    assert fresh.any() and torch.allclose(gap[fresh], torch.tensor(0.05), atol=1e-5)  # its own log-probs
    assert torch.equal(returned[~fresh], given[~fresh])  # rows the step did not train keep the stored ones
    assert torch.equal(handed, returned)  # the later step compares with the first step's


def test_conversational_prompts_and_extra_columns_reach_reward(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []

    def spy_reward(prompts: list[Any], completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
        calls.append({"prompts": prompts, "completions": completions, "answer": answer, **kwargs})
        return [float(len(c[0]["content"])) for c in completions]

    data = [{"prompt": [{"role": "user", "content": f"{a}+{a}="}], "answer": str(2 * a)} for a in range(8)]
    t = trainer(tmp_path, reward_funcs=spy_reward, data=data, max_steps=1)
    t.train()
    call = calls[0]
    assert call["completions"][0][0]["role"] == "assistant"
    assert isinstance(call["prompts"][0], list)
    # the 4 completions of a prompt are consecutive and carry that prompt's answer
    for i in range(0, 8, 4):
        assert len(set(call["answer"][i : i + 4])) == 1
        assert call["answer"][i] == str(2 * int(call["prompts"][i][0]["content"][0]))
    assert "trainer_state" in call and "completion_ids" in call


def test_none_rewards_are_ignored(tmp_path: Path) -> None:
    def half_none(completion_ids: list[list[int]], **kwargs: Any) -> list[float | None]:
        return [None if i % 4 == 0 else 1.0 for i in range(len(completion_ids))]

    t = trainer(tmp_path, reward_funcs=[half_none, frac7], reward_weights=[1.0, 0.0], max_steps=1)
    t.train()
    logs = last_train_log(t)
    assert logs["rewards/half_none/mean"] == 1.0
    assert logs["rewards/unscorable"] == 0.0  # frac7 still applies to every row

    def all_none(completion_ids: list[list[int]], **kwargs: Any) -> list[float | None]:
        return [None if i % 4 == 0 else float(i % 3) for i in range(len(completion_ids))]

    t = trainer(tmp_path / "b", reward_funcs=all_none, max_steps=1)
    t.train()
    assert last_train_log(t)["rewards/unscorable"] == 2.0


def test_model_and_tokenizer_from_local_folder_without_pad_token(tmp_path: Path) -> None:
    folder = save_tiny_model(tmp_path / "model", chars=CHARS)
    tok = build_char_tokenizer(CHARS, with_pad=False)
    tok.save_pretrained(folder)
    t = RLOOTrainer(model=str(folder), reward_funcs=frac7, args=config(tmp_path, max_steps=1), train_dataset=dataset())
    assert t.processing_class.pad_token == t.processing_class.eos_token
    assert t.processing_class.decode(t.processing_class("12+3=")["input_ids"]) == "12+3="
    t.train()


def test_reward_model_as_reward(tmp_path: Path) -> None:

    tok = make_tokenizer()
    tiny_reward_model(tok).save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    t = trainer(tmp_path, reward_funcs=[str(tmp_path / "rm")], max_steps=1)
    t.train()
    assert "rewards/rm/mean" in last_train_log(t)


def test_lora_trains_only_adapters_and_reference_is_the_base(tmp_path: Path) -> None:
    from peft import LoraConfig

    tok = make_tokenizer()
    base = make_model(tok)
    base_copy = make_model(tok)
    t = RLOOTrainer(
        model=base,
        reward_funcs=frac7,
        args=config(tmp_path, max_steps=2, beta=0.1, gradient_checkpointing=True),
        train_dataset=dataset(),
        processing_class=tok,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    assert t.ref_model is None
    before = params(t.unwrapped_model)
    t.train()
    after = params(t.unwrapped_model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_" in k for k in changed)
    # with adapters disabled the policy computes exactly the base model's logits
    ids = torch.tensor([tok("1+2=")["input_ids"]])
    with t.unwrapped_model.disable_adapter():
        ref_logits = t.unwrapped_model(input_ids=ids).logits
    assert torch.allclose(ref_logits, base_copy(input_ids=ids).logits, atol=1e-6)
    t.save_model(str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "adapter" / "model.safetensors").exists()


@pytest.mark.parametrize(
    ("overrides", "first_checkpoint"),
    [({}, 3), ({"num_iterations": 2}, 4), ({"steps_per_generation": 2}, 4)],
    ids=["one-step-per-batch", "num_iterations-2", "steps_per_generation-2"],
)
def test_resume_continues_exactly(tmp_path: Path, overrides: dict[str, int], first_checkpoint: int) -> None:
    # before: with two optimizer steps per generation batch, checkpoint-3 fell inside a batch and
    # a resume from it lost the rest of that batch; checkpoints now wait for the batch boundary
    straight = trainer(tmp_path / "straight", max_steps=6, save_steps=3, beta=0.05, **overrides)
    straight.train()
    checkpoint = tmp_path / "straight" / "run" / f"checkpoint-{first_checkpoint}"
    assert checkpoint.is_dir()

    resumed = trainer(tmp_path / "resumed", max_steps=6, save_steps=3, beta=0.05, **overrides)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    a, b = params(straight.unwrapped_model), params(resumed.unwrapped_model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.state.global_step == 6


def test_existing_run_folder_is_not_overwritten(tmp_path: Path) -> None:
    trainer(tmp_path, max_steps=2, save_steps=1).train()
    # what to do: resume, another folder, or none (each run a fresh runs/rloo-N), or replace it
    fixes = r"resume_from_checkpoint=True .*choose a new output_dir \(or leave it unset: each run then gets a fresh"
    with pytest.raises(ValueError, match=rf"already holds an earlier run .*{fixes} runs/rloo-N\), or set overwrite"):
        trainer(tmp_path, max_steps=2).train()
    resumed = trainer(tmp_path, max_steps=3, save_steps=1)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 3


def test_save_total_limit_keeps_newest_checkpoints(tmp_path: Path) -> None:
    trainer(tmp_path, max_steps=4, save_steps=1, save_total_limit=2).train()
    names = sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("checkpoint"))
    assert names == ["checkpoint-3", "checkpoint-4"]
    assert not any(p.name.startswith("tmp-") for p in (tmp_path / "run").iterdir())


def test_long_prompts_are_truncated_from_the_left_and_counted(tmp_path: Path) -> None:
    data = [{"prompt": "1" * 30 + f"{a}="} for a in range(8)]
    t = trainer(tmp_path, data=data, max_prompt_length=5, max_steps=1)
    t.train()
    assert last_train_log(t)["prompts/truncated"] == 2.0


def test_mask_truncated_completions_removes_their_loss(tmp_path: Path) -> None:
    t = trainer(tmp_path, max_completion_length=3, mask_truncated_completions=True, max_steps=2)
    batches: list[Any] = []
    original = t._optimizer_steps

    def spy(batch: Any) -> Any:
        batches.append(batch)
        return original(batch)

    t._optimizer_steps = spy  # type: ignore[method-assign]
    t.train()
    truncated = torch.cat([b.rollout.truncated for b in batches])
    loss_mask = torch.cat([b.loss_mask for b in batches])
    completion_mask = torch.cat([b.rollout.completion_mask for b in batches])
    assert truncated.any() and (~truncated).any()
    assert loss_mask[truncated].sum() == 0
    assert torch.equal(loss_mask[~truncated], completion_mask[~truncated])


def test_invalid_reward_weights_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="reward_weights has 2 entries but there are 1"):
        trainer(tmp_path, reward_weights=[1.0, 2.0])


def test_missing_dataset_is_a_clear_error(tmp_path: Path) -> None:
    tok = make_tokenizer()
    with pytest.raises(ValueError, match="train_dataset is required"):
        RLOOTrainer(model=make_model(tok), reward_funcs=frac7, args=config(tmp_path), processing_class=tok)


def test_evaluate_reports_eval_reward(tmp_path: Path) -> None:
    tok = make_tokenizer()
    t = RLOOTrainer(
        model=make_model(tok),
        reward_funcs=frac7,
        args=config(tmp_path, max_steps=2, eval_steps=2),
        train_dataset=dataset(),
        eval_dataset=dataset(4),
        processing_class=tok,
    )
    t.train()
    assert any("eval_reward" in h for h in t.state.log_history)


def test_evaluate_leaves_the_run_unchanged(tmp_path: Path) -> None:
    # before: evaluate() advanced state.num_groups_seen (and so every later group id) although
    # it says evaluating does not change the run
    def build(folder: str) -> RLOOTrainer:
        tok = make_tokenizer()
        args = config(tmp_path / folder, max_steps=2, weight_decay=0.0)
        return RLOOTrainer(make_model(tok), frac7, args, dataset(), dataset(6), processing_class=tok)

    plain, evaluated = build("plain"), build("evaluated")
    before = evaluated.state.to_dict()
    first = evaluated.evaluate()
    assert evaluated.state.to_dict() == before
    assert evaluated.evaluate() == first  # its own generator: the same numbers every time
    expected = {"eval_loss", "eval_reward", "eval_reward_std", "eval_unscorable"}
    expected |= {"eval_rewards/frac7/mean", "eval_rewards/frac7/std"}
    assert set(first) == expected | {f"eval_pass@{k}" for k in range(1, 5)}  # K = 4 samples per eval prompt
    plain.train()
    evaluated.train()
    assert evaluated.state.num_groups_seen == plain.state.num_groups_seen
    for name, value in params(plain.unwrapped_model).items():
        torch.testing.assert_close(params(evaluated.unwrapped_model)[name], value, rtol=0, atol=0)


def test_kl_in_the_loss_and_entropy_bonus_train(tmp_path: Path) -> None:
    t = trainer(tmp_path, preset="grpo", beta=0.1, entropy_coef=0.01, max_steps=2)
    assert t.spec.kl_placement == "loss" and t.spec.ratio_level == "token"
    t.train()
    logs = last_train_log(t)
    assert logs["kl"] >= 0.0  # k3 is non-negative
    assert torch.isfinite(torch.tensor(logs["loss"]))


def test_entropy_bonus_changes_the_update(tmp_path: Path) -> None:
    results = []
    for coef in (0.0, 0.5):
        t = trainer(tmp_path / str(coef), entropy_coef=coef, max_steps=1, beta=0.0)
        t.train()
        results.append(params(t.unwrapped_model))
    assert any(not torch.equal(results[0][k], results[1][k]) for k in results[0])


def test_callbacks_see_steps_logs_and_saves(tmp_path: Path) -> None:
    events: list[str] = []

    class Recorder:
        def on_train_begin(self, trainer: Any) -> None:
            events.append("begin")

        def on_step_end(self, trainer: Any) -> None:
            events.append(f"step{trainer.state.global_step}")

        def on_log(self, trainer: Any, logs: dict[str, float]) -> None:
            events.append("log")

        def on_save(self, trainer: Any, path: Path) -> None:
            events.append(f"save:{Path(path).name}")

        def on_train_end(self, trainer: Any) -> None:
            events.append("end")

    tok = make_tokenizer()
    RLOOTrainer(
        model=make_model(tok),
        reward_funcs=frac7,
        args=config(tmp_path, max_steps=2, save_steps=2),
        train_dataset=dataset(),
        processing_class=tok,
        callbacks=[Recorder()],
    ).train()
    assert events == ["begin", "step1", "log", "step2", "log", "save:checkpoint-2", "log", "end"]  # log: summary


def test_a_finished_run_without_checkpoints_is_never_overwritten(tmp_path: Path) -> None:
    # before: a second run into the folder of a finished run that kept no checkpoint replaced
    # its final/ model and config.yaml (only metrics.jsonl was set aside)
    trainer(tmp_path, max_steps=1).train()  # no checkpoint: save_steps is 1000
    run = tmp_path / "run"
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    with pytest.raises(ValueError, match=r"earlier run \(final, config.yaml, metrics.jsonl.*overwrite_output_dir=True"):
        trainer(tmp_path, max_steps=1, learning_rate=0.5).train()
    assert {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()} == before


def test_overwrite_output_dir_replaces_a_run_and_keeps_its_logs(tmp_path: Path) -> None:
    trainer(tmp_path, max_steps=1).train()
    first = (tmp_path / "run" / "metrics.jsonl").read_text()
    trainer(tmp_path, max_steps=1, overwrite_output_dir=True).train()
    kept = list((tmp_path / "run").glob("metrics.before-*.jsonl"))
    assert len(kept) == 1 and kept[0].read_text() == first
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2  # step 1 and the summary


def test_prompts_past_the_models_positions_are_warned_about(tmp_path: Path) -> None:
    # before: prompts longer than max_position_embeddings trained with no warning
    tok = make_tokenizer()
    model = build_tiny_llama(len(tok), tokenizer=tok, max_positions=8)
    t = RLOOTrainer(model, frac7, config(tmp_path, max_steps=1), dataset(), processing_class=tok)
    t.train()
    log = (tmp_path / "run" / "warnings.log").read_text()
    assert "past the model's max_position_embeddings (8)" in log and "lower max_prompt_length" in log
    assert last_train_log(t)["prompts/max_length"] == 4.0  # "1+2=": 4 characters


def test_reward_error_policy_skip_keeps_training_and_counts(tmp_path: Path) -> None:
    def sometimes_broken(completions: list[Any], **kwargs: Any) -> list[float]:
        raise ConnectionError("judge unreachable")

    t = trainer(tmp_path, reward_funcs=[frac7, sometimes_broken], reward_error_policy="skip", max_steps=2)
    t.train()
    assert [row["rewards/sometimes_broken/failed"] for row in t.state.log_history if "reward" in row] == [8.0, 8.0]
    assert "`sometimes_broken` failed or timed out" in (tmp_path / "run" / "warnings.log").read_text()
    with pytest.raises(RuntimeError, match="`sometimes_broken` failed on a batch of 8 completions: ConnectionError"):
        trainer(tmp_path / "raise", reward_funcs=[frac7, sometimes_broken], max_steps=1).train()


TRL_RLOO_TRAINER_PARAMETERS = [  # TRL 1.16's RLOOTrainer.__init__, in order
    "model",
    "reward_funcs",
    "args",
    "train_dataset",
    "eval_dataset",
    "processing_class",
    "reward_processing_classes",
    "callbacks",
    "optimizers",
    "quantization_config",
    "peft_config",
]


def test_trl_trainer_arguments_in_trls_order_and_their_defaults_accepted(tmp_path: Path) -> None:
    import inspect

    parameters = list(inspect.signature(RLOOTrainer.__init__).parameters)[1:]
    assert parameters[: len(TRL_RLOO_TRAINER_PARAMETERS)] == TRL_RLOO_TRAINER_PARAMETERS
    tok = make_tokenizer()
    # TRL's script passes these, at their defaults
    t = RLOOTrainer(
        make_model(tok), frac7, config(tmp_path), dataset(), None, tok, None, None, (None, None), None, None
    )
    assert t.args.output_dir == str(tmp_path / "run")


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"optimizers": ("optimizer", None)}, r"optimizers=\.\.\.\) is not supported: rloo builds the optimizer"),
        # a loaded model cannot be quantized by the trainer (tests/training/setup/test_quantized.py: QLoRA)
        ({"quantization_config": "4bit"}, r"quantization_config=\.\.\.\) quantizes a model it loads"),
        ({"tools": "len"}, r"RLOOTrainer\(tools='len'\) is invalid: give a list of functions"),
        ({"rollout_func": len, "environment_factory": dict}, r"got rollout_func and tools/environment_factory"),
    ],
)
def test_trl_trainer_arguments_rloo_cannot_honour_are_refused_saying_why(
    tmp_path: Path, keywords: dict[str, Any], message: str
) -> None:
    tok = make_tokenizer()
    with pytest.raises(ValueError, match=message):
        RLOOTrainer(make_model(tok), frac7, config(tmp_path), dataset(), processing_class=tok, **keywords)
    assert not (tmp_path / "run").exists()


def test_the_training_loop_holds_the_sdpa_priority_of_its_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import contextlib

    import rloo.training.trainer as trainer_module

    entered: list[torch.device] = []

    def priority(device: torch.device) -> Any:
        entered.append(device)
        return contextlib.nullcontext()

    monkeypatch.setattr(trainer_module, "sdpa_priority", priority)
    t = trainer(tmp_path, max_steps=1)
    t.train()
    assert entered == [t.accelerator.device]


def test_a_lagged_unclipped_run_is_warned_at_start(tmp_path: Path) -> None:
    t = trainer(tmp_path, max_steps=1, max_staleness=1, clip_ratio=False)
    log = (tmp_path / "run" / "warnings.log").read_text()
    assert "max_staleness=1 with clip_ratio=False" in log
    assert t.args.algorithm.clip_ratio is False
