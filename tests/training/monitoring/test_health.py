"""Live health monitors: each rule on hand-made series, then each symptom provoked on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rloo import RLOOConfig, RLOOTrainer
from rloo.config.health import HEALTH_THRESHOLDS, default_health_thresholds, thresholds_markdown
from rloo.config.symptoms import SYMPTOMS
from rloo.report.diagnostics import diagnose
from rloo.report.page import build_report
from rloo.tiny import save_tiny_model
from rloo.training.monitoring.health import HealthMonitor, spike
from rloo.training.state import TrainerState
from tests.helpers.models import config, dataset, frac7, make_model, make_tokenizer, trainer
from tests.helpers.paths import REPO

pytestmark = pytest.mark.usefixtures("one_thread")


def monitor(**thresholds: float) -> HealthMonitor:
    return HealthMonitor({**default_health_thresholds(), "window": 2, **thresholds})


def fired(mon: HealthMonitor, series: list[dict[str, float]], memory: dict[str, Any] | None = None) -> list[tuple]:
    """``(step, monitor)`` of every alert over ``series`` (one metrics dict per step)."""
    memory = {} if memory is None else memory
    return [(step, a.name) for step, m in enumerate(series, 1) for a in mon.observe_step(memory, step, m)]


# ---------------------------------------------------------------------------- the rules
def test_spike_is_a_multiple_of_the_median_of_the_previous_window() -> None:
    assert spike([1.0, 2.0, 3.0, 2.0, 2.0], 10.0, 5.0) == pytest.approx(5.0)  # median 2
    assert spike([1.0, 2.0, 3.0, 2.0, 2.0], 9.0, 5.0) is None  # 4.5x: not a spike
    assert spike([2.0, 4.0, 60.0], 12.0, 5.0) is None  # 3x the median 4 (the mean, 22, would hide more)
    assert spike([0.0, 0.0, 0.0], 1.0, 5.0) is None  # no scale to compare with


def test_length_explosion_fires_once_when_the_recent_mean_doubles_and_rearms() -> None:
    lengths = [10, 10, 10, 10, 25, 25, 25, 10, 10, 30, 30]
    series = [{"completions/mean_length": float(x)} for x in lengths]
    # step 5: (10 + 25) / 2 = 17.5 < 20; step 6: 25 >= 2 x 10 -> fires, once; step 8: 17.5 clears;
    # step 10: (10 + 30) / 2 = 20 fires again
    assert fired(monitor(), series) == [(6, "length_explosion"), (10, "length_explosion")]


def test_ratio_monitors_wait_until_the_recent_window_leaves_the_baseline() -> None:
    series = [{"completions/mean_length": x} for x in (10.0, 40.0, 40.0)]
    assert fired(monitor(), series) == []  # 3 steps < 2 x window


def test_length_and_entropy_collapse() -> None:
    series = [{"completions/mean_length": x, "entropy": x / 4} for x in (8.0, 8.0, 8.0, 1.0, 1.0)]
    # step 5: mean length 1 <= 0.25 x 8; entropy 0.25 <= 0.1 x 2 is false (0.125x needed)
    assert fired(monitor(), series) == [(5, "length_collapse")]
    assert fired(monitor(entropy_collapse=0.2), series) == [(5, "length_collapse"), (5, "entropy_collapse")]


def test_kl_explosion_reads_the_recent_mean() -> None:
    series = [{"kl": x} for x in (0.1, 0.5, 2.0, 2.0)]
    assert fired(monitor(), series) == [(3, "kl_explosion")]  # (0.5 + 2) / 2 = 1.25 >= 1


def test_reward_collapse_reads_the_task_rewards_not_the_kl_penalized_ones() -> None:
    # the KL penalty breaks ties: frac_reward_zero_std reads 0 while every task reward is equal
    series = [{"frac_reward_zero_std": 0.0, "frac_task_reward_zero_std": 1.0}] * 3
    assert fired(monitor(), series) == [(2, "reward_collapse")]
    assert fired(monitor(), [{"frac_reward_zero_std": 1.0, "frac_task_reward_zero_std": 0.0}] * 3) == []


def test_a_threshold_of_zero_turns_a_monitor_off() -> None:
    series = [{"frac_task_reward_zero_std": 1.0, "kl": 5.0}] * 4
    assert fired(monitor(reward_collapse=0, kl_explosion=0), series) == []


def test_loss_spike_reads_the_gradient_norm() -> None:
    norms = [1.0, 1.2, 0.9, 1.1, 50.0, 1.0]
    series = [{"grad_norm": x, "loss": 1e-9 * (-1) ** i} for i, x in enumerate(norms)]
    assert fired(monitor(), series) == [(5, "loss_spike")]


# (grad_norm, frac_task_reward_zero_std) of steps 11-24 of a normal 30-step LoRA run (lora-share_of_sevens-s1
# of benchmarks/health_calibration.py): where no group's task rewards differed (1.0), the gradient is the KL
# penalty's alone
NORMAL_LORA = [
    (0.075, 0.5), (0.00031, 1.0), (0.00032, 1.0), (0.055, 0.5), (0.044, 0.5), (0.040, 0.5), (0.060, 0.0),
    (0.00054, 1.0), (0.00033, 1.0), (0.00026, 1.0), (0.047, 0.5), (0.098, 0.5), (0.00025, 1.0), (0.039, 0.5),
]  # fmt: skip


def spikes(mon: HealthMonitor, series: list[dict[str, float]]) -> list[int]:
    return [step for step, name in fired(mon, series) if name == "loss_spike"]


def test_loss_spike_ignores_steps_without_a_task_reward_signal() -> None:
    """The median of the previous window held steps with the KL penalty's gradient alone (~1e-3 of a
    normal one), so the next normal step read as an 85-130x "spike": 2 false alarms in this run,
    12 in the 51 normal runs of benchmarks/health_calibration.py (issue 24). A real spike still
    fires, after a signal-free stretch too."""
    series = [{"grad_norm": norm, "frac_task_reward_zero_std": zero_std} for norm, zero_std in NORMAL_LORA]
    assert spikes(monitor(window=5), series) == []
    spiking = series + [{"grad_norm": 0.0003, "frac_task_reward_zero_std": 1.0}] * 8 + [{"grad_norm": 0.6}]
    assert spikes(monitor(window=5), spiking) == [len(spiking)]  # 12x the signal steps' median 0.05


def test_loss_spike_waits_for_a_window_of_steps_with_a_signal() -> None:
    quiet = [{"grad_norm": 1e-4, "frac_task_reward_zero_std": 1.0}] * 6
    series = [*quiet, {"grad_norm": 0.05, "frac_task_reward_zero_std": 0.0}, {"grad_norm": 0.9}]
    assert spikes(monitor(), series) == []  # one signal step: no reference yet (window 2)
    assert spikes(monitor(), [*series, {"grad_norm": 0.06}, {"grad_norm": 20.0}]) == [10]


def test_train_up_eval_down_compares_with_the_best_evaluation() -> None:
    mon, memory = monitor(), {}
    fired(mon, [{"reward": 0.2}] * 2, memory)
    assert mon.observe_eval(memory, 2, 0.5) == []  # the best so far (train reward 0.2 then)
    fired(mon, [{"reward": 0.3}] * 2, memory)
    assert mon.observe_eval(memory, 4, 0.48) == []  # fell 0.02 < 0.05
    fired(mon, [{"reward": 0.6}] * 2, memory)
    alerts = mon.observe_eval(memory, 6, 0.3)  # fell 0.2 from 0.5 while train rose 0.4 from 0.2
    assert [a.name for a in alerts] == ["train_up_eval_down"]
    assert "fell from 0.5 to 0.3" in alerts[0].message and "rose from 0.2 to 0.6" in alerts[0].message
    assert alerts[0].metric == "health/train_up_eval_down"


def test_every_alert_names_the_threshold_and_the_fix() -> None:
    mon, memory = monitor(), {}
    (alert,) = [a for step in (1, 2) for a in mon.observe_step(memory, step, {"frac_task_reward_zero_std": 1.0})]
    assert "health_thresholds.reward_collapse=0.9" in alert.message and "Fix: check that the reward" in alert.message


def test_the_memory_is_json_so_a_resumed_run_monitors_as_the_uninterrupted_one() -> None:
    lengths = [10, 10, 10, 10, 25, 25, 25, 10, 10, 30, 30]
    series = [{"completions/mean_length": float(x), "grad_norm": float(x)} for x in lengths]
    whole = fired(monitor(), series)
    memory: dict[str, Any] = {}
    first = fired(monitor(), series[:5], memory)
    memory = json.loads(json.dumps(memory))  # what a checkpoint's trainer_state.json holds
    rest = [(step + 5, name) for step, name in fired(monitor(), series[5:], memory)]
    assert first + rest == whole and whole
    state = TrainerState(health=memory)
    assert TrainerState.from_dict(json.loads(json.dumps(state.to_dict()))).health == memory
    older = {k: v for k, v in state.to_dict().items() if k != "health"}  # a checkpoint from before monitors
    assert TrainerState.from_dict(older).health == {}


@given(st.floats(0.5, 100.0), st.floats(0.01, 5.0), st.integers(1, 6))
def test_steady_metrics_never_fire_a_ratio_or_spike_monitor(length: float, norm: float, window: int) -> None:
    series = [{"completions/mean_length": length, "entropy": length / 10, "grad_norm": norm}] * 20
    assert fired(monitor(window=window), series) == []


# ---------------------------------------------------------------------------- the config
@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ({"kl_explsion": 1.0}, "did you mean `kl_explosion`"),
        ({"window": 0}, "health_thresholds.window=0"),
        ({"window": 2.5}, "whole number of steps"),
        ({"kl_explosion": -1.0}, "health_thresholds.kl_explosion=-1.0"),
        ({"kl_explosion": float("nan")}, "finite number"),
        ({"loss_spike": "high"}, "health_thresholds.loss_spike='high'"),
        ("strict", "expects a mapping, or a JSON object in a string"),
    ],
)
def test_bad_thresholds_are_refused_naming_the_key(value: Any, needle: str) -> None:
    with pytest.raises(ValueError, match="health_thresholds") as info:
        RLOOConfig(health_thresholds=value)
    assert needle in str(info.value)


def test_thresholds_resolve_over_the_defaults_and_round_trip() -> None:
    args = RLOOConfig(health_thresholds={"kl_explosion": 0.5})
    assert dict(args.health_thresholds) == {**default_health_thresholds(), "kl_explosion": 0.5}
    assert RLOOConfig.from_dict(args.to_dict()).health_thresholds == args.health_thresholds
    assert all(f"`{key}`" in thresholds_markdown() for key in HEALTH_THRESHOLDS)


# ---------------------------------------------------------------------------- provoked on a tiny model
def lengths(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    return [float(len(ids)) for ids in completion_ids]


def negative_lengths(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    return [-float(len(ids)) for ids in completion_ids]


def signed_frac7(completion_ids: list[list[int]], sign: list[float], **kwargs: Any) -> list[float]:
    """``frac7`` for rows with sign +1, its negative for rows with sign -1."""
    return [s * r for s, r in zip(sign, frac7(completion_ids), strict=True)]


def scaled_after(calls: int, scale: float) -> Any:
    """``frac7``, multiplied by ``scale`` from its ``calls``-th call on."""
    seen = {"calls": 0}

    def scaled(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        seen["calls"] += 1
        return [r * (scale if seen["calls"] >= calls else 1.0) for r in frac7(completion_ids)]

    return scaled


def train_and_read(run: RLOOTrainer) -> tuple[list[dict[str, Any]], str]:
    run.train()
    out = Path(run.args.output_dir)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "train_runtime" not in row]  # the end-of-training summary
    warnings = (out / "warnings.log").read_text() if (out / "warnings.log").exists() else ""
    return rows, warnings


def flagged(rows: list[dict[str, Any]]) -> set[str]:
    return {key.removeprefix("health/") for row in rows for key in row if key.startswith("health/")}


FAST = {"learning_rate": 5e-2, "max_steps": 12}


def assert_provoked(name: str, rows: list[dict[str, Any]], warnings: str, capsys: Any) -> None:
    assert name in flagged(rows), (name, flagged(rows))
    line = next(line for line in warnings.splitlines() if f"health: {name.replace('_', ' ')}" in line)
    assert "Fix:" in line and f"health_thresholds.{name}" in line
    assert f"health: {name.replace('_', ' ')}" in capsys.readouterr().err


def test_length_collapse_is_provoked_by_rewarding_short_answers(tmp_path: Path, capsys: Any) -> None:
    rows, warnings = train_and_read(trainer(tmp_path, negative_lengths, health_thresholds={"window": 2}, **FAST))
    assert_provoked("length_collapse", rows, warnings, capsys)
    report = build_report(tmp_path / "run").read_text()
    assert "length collapse" in report  # warnings.log is shown in the report


def test_length_explosion_is_provoked_by_rewarding_long_answers(tmp_path: Path, capsys: Any) -> None:
    tok = make_tokenizer()
    model = make_model(tok)
    with torch.no_grad():  # make EOS likely, so completions start short (~1-2 tokens of 24)
        ids = tok(["1+2=", "3+4=", "5+5="], return_tensors="pt", padding=True)
        hidden = model.model(**ids).last_hidden_state[:, -1].mean(0)
        model.lm_head.weight[tok.eos_token_id] = hidden / hidden.norm()
    args = config(tmp_path, max_completion_length=24, health_thresholds={"window": 1}, **FAST)
    run = RLOOTrainer(model=model, reward_funcs=lengths, args=args, train_dataset=dataset(), processing_class=tok)
    rows, warnings = train_and_read(run)
    assert rows[0]["completions/mean_length"] < 6
    assert_provoked("length_explosion", rows, warnings, capsys)


def test_kl_and_entropy_collapse_are_provoked_by_a_large_learning_rate(tmp_path: Path, capsys: Any) -> None:
    thresholds = {"window": 2, "kl_explosion": 0.5, "entropy_collapse": 0.5}
    rows, warnings = train_and_read(trainer(tmp_path, frac7, beta=0.01, health_thresholds=thresholds, **FAST))
    assert_provoked("kl_explosion", rows, warnings, capsys)
    assert "entropy_collapse" in flagged(rows) and "health: entropy collapse" in warnings


def constant_after(calls: int) -> Any:
    """``frac7`` for ``calls`` calls (the policy moves away from the reference), then 1.0 for all."""
    seen = {"calls": 0}

    def constant(completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
        seen["calls"] += 1
        return frac7(completion_ids) if seen["calls"] <= calls else [1.0] * len(completion_ids)

    return constant


def test_reward_collapse_is_seen_through_a_kl_penalty_that_breaks_ties(tmp_path: Path, capsys: Any) -> None:
    run = trainer(tmp_path, constant_after(4), beta=0.05, health_thresholds={"window": 2}, **FAST)
    rows, warnings = train_and_read(run)
    last = rows[-1]  # every task reward 1.0, but the KL penalty (the policy has moved) tells them apart
    assert last["frac_reward_zero_std"] < 0.5 and last["frac_task_reward_zero_std"] == 1.0
    assert_provoked("reward_collapse", rows, warnings, capsys)


def test_train_up_eval_down_is_provoked_by_an_eval_set_with_the_opposite_reward(tmp_path: Path, capsys: Any) -> None:
    train = [{**row, "sign": 1.0} for row in dataset(16)]
    evaluation = [{**row, "sign": -1.0} for row in dataset(8)]
    args = config(tmp_path, eval_steps=3, health_thresholds={"window": 2}, **FAST)
    tok = make_tokenizer()
    run = RLOOTrainer(
        make_model(tok), signed_frac7, args, train_dataset=train, eval_dataset=evaluation, processing_class=tok
    )
    rows, warnings = train_and_read(run)
    assert_provoked("train_up_eval_down", rows, warnings, capsys)


def test_loss_spike_is_provoked_by_a_reward_that_jumps_in_scale(tmp_path: Path, capsys: Any) -> None:
    rows, warnings = train_and_read(
        trainer(tmp_path, scaled_after(6, 1e4), learning_rate=1e-3, max_steps=8, health_thresholds={"window": 2})
    )
    assert_provoked("loss_spike", rows, warnings, capsys)
    assert "grad_norm" in next(line for line in warnings.splitlines() if "loss spike" in line)


def test_a_healthy_run_raises_no_health_warning(tmp_path: Path) -> None:
    rows, warnings = train_and_read(trainer(tmp_path, frac7, learning_rate=1e-3, max_steps=12))
    assert flagged(rows) == set() and "health:" not in warnings


def count_text_sevens(completions: list[str], **kwargs: Any) -> list[float]:
    return [text.count("7") / max(len(text), 1) for text in completions]


def test_a_normal_lora_run_raises_no_loss_spike(tmp_path: Path) -> None:
    """lora-share_of_sevens-s1 of benchmarks/health_calibration.py: the KL-only steps between its
    signal steps made 2 loss_spike warnings of a normal 30-step LoRA run (issue 24)."""
    from peft import LoraConfig

    model = save_tiny_model(tmp_path / "tiny")
    args = RLOOConfig(
        output_dir=str(tmp_path / "run"),
        num_generations=4,
        max_completion_length=16,
        max_steps=30,
        logging_steps=1,
        learning_rate=1e-4,
        seed=1,
        save_steps=1000,
    )
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    prompts = [{"prompt": f"{a}+{b}="} for a in range(10) for b in range(10)]
    rows, _ = train_and_read(RLOOTrainer(str(model), count_text_sevens, args, prompts, peft_config=lora))
    assert sum(row["frac_task_reward_zero_std"] == 1.0 for row in rows) >= 3  # the KL-only steps are there
    assert "loss_spike" not in flagged(rows)


def test_the_docs_table_is_the_thresholds_table() -> None:
    page = (REPO / "docs" / "reliability.md").read_text()  # scripts/regen_docs.py writes it
    start, end = "<!-- health-thresholds:start -->\n", "\n<!-- health-thresholds:end -->"
    assert page[page.index(start) + len(start) : page.index(end)] == thresholds_markdown()


def test_the_monitors_and_the_report_name_one_fix_per_symptom() -> None:
    """A KL explosion seen live and seen by the report's diagnostics gets the same fix, from one table."""
    monitor = HealthMonitor({**default_health_thresholds(), "window": 2})
    memory: dict[str, Any] = {}
    alerts = [a for step in range(1, 6) for a in monitor.observe_step(memory, step, {"kl": 3.0})]
    (live,) = [a.message for a in alerts if a.name == "kl_explosion"]
    (report,) = diagnose([{"step": float(step), "kl": 0.01 if step == 1 else 3.0} for step in range(1, 9)])
    fix = f"Fix: {SYMPTOMS['kl_explosion'].fix}"
    assert live.endswith(fix) and report.endswith(fix)
    monitored = {name: (s.threshold, s.meaning) for name, s in SYMPTOMS.items() if s.monitored}
    assert {k: v for k, v in HEALTH_THRESHOLDS.items() if k != "window"} == monitored
