"""FSDP2 (sharded parameters) on 2 CPU processes (gloo) trains as one process on the same global
batch, saves full weights and resumes; the launch files in ``examples/accelerate`` parse and
rloo's start-up runs or refuses each engine. Every run launches real processes (``torchrun`` with
the variables ``accelerate launch`` sets, or ``accelerate launch`` with ``fsdp2_cpu.yaml``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.utils import DistributedType
from safetensors.torch import load_file

from rloo.generation.rollout import generate_rollouts
from rloo.generation.sampling import SamplingParams
from rloo.tiny import build_tiny_llama
from rloo.training.parallel.distributed import check_engine
from rloo.training.parallel.fsdp import ShardingSettings, sharding_settings
from rloo.training.setup.optimization import prepare_training
from tests.helpers.fsdp_runs import CASES
from tests.helpers.launch import (
    BIN,
    REPO,
    assert_ok,
    assert_same_metrics,
    free_port,
    max_param_diff,
    metrics,
    python,
    torchrun,
    write_run_file,
)
from tests.helpers.processes import child_env

EXAMPLES = REPO / "examples" / "accelerate"
FSDP_ENV = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}  # what accelerate launch exports
PARAM_ATOL = 1e-4  # as tests/training/parallel/test_distributed.py: summation-order noise; a wrong factor moves ~1e-2


def launch_env(config: Path) -> dict[str, str]:
    """The engine variables ``accelerate launch --config_file config`` exports (FSDP and DeepSpeed)."""
    cluster = load_config_from_file(str(config))
    env = {f"FSDP_{key.removeprefix('fsdp_').upper()}": str(v).lower() for key, v in cluster.fsdp_config.items()}
    if cluster.distributed_type == DistributedType.FSDP:
        env["ACCELERATE_USE_FSDP"] = "true"
    if cluster.distributed_type == DistributedType.DEEPSPEED:
        env["ACCELERATE_USE_DEEPSPEED"] = "true"
    return env


# ---------------------------------------------------------------------------- launch files and start-up
def test_launch_files_parse_and_start_up_runs_or_refuses_their_engine() -> None:
    engines = {}
    for config in sorted(EXAMPLES.glob("*.yaml")):
        cluster = load_config_from_file(str(config))  # accelerate's own loader
        assert cluster.num_processes >= cluster.num_machines, config.name
        env = launch_env(config)
        if cluster.distributed_type == DistributedType.DEEPSPEED:
            with pytest.raises(ValueError, match=r"DeepSpeed, which rloo does not support.*fsdp2\.yaml"):
                check_engine(cluster.distributed_type, env)
            # on CPU accelerate drops DeepSpeed (MULTI_CPU): the variable alone is refused too
            with pytest.raises(ValueError, match="DeepSpeed"):
                check_engine(DistributedType.MULTI_CPU, env)
            engines[config.stem] = "refused"
            continue
        settings = check_engine(cluster.distributed_type, env)
        engines[config.stem] = "fsdp2" if settings is not None else "ddp"
        # on CPU accelerate runs FSDP configs as MULTI_CPU: rloo still shards, from the variables
        assert check_engine(DistributedType.MULTI_CPU, env) == settings
    assert engines == {
        "ddp": "ddp",
        "ddp_cpu": "ddp",
        "fsdp2": "fsdp2",
        "fsdp2_cpu": "fsdp2",
        "multi_node": "ddp",
        "zero2": "refused",
        "zero3": "refused",
    }
    assert subprocess.run(["bash", "-n", str(EXAMPLES / "slurm.sbatch")]).returncode == 0


def test_fsdp_settings_and_what_is_refused() -> None:
    assert sharding_settings(DistributedType.MULTI_GPU, {}) is None
    wrap = {**FSDP_ENV, "FSDP_RESHARD_AFTER_FORWARD": "false", "FSDP_TRANSFORMER_CLS_TO_WRAP": "A, B"}
    assert sharding_settings(DistributedType.FSDP, wrap) == ShardingSettings(False, ("A", "B"))
    offload = {**FSDP_ENV, "FSDP_OFFLOAD_PARAMS": "true"}  # refused before issue 29
    offloaded = ShardingSettings(offload_params=True)
    assert sharding_settings(DistributedType.FSDP, offload) == offloaded
    refused = {
        "FSDP version 1; rloo runs FSDP2 only": {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1"},
        "gradient_checkpointing: true": {**FSDP_ENV, "FSDP_ACTIVATION_CHECKPOINTING": "true"},
    }
    for message, env in refused.items():
        with pytest.raises(ValueError, match=message):
            sharding_settings(DistributedType.FSDP, env)
    with pytest.raises(ValueError, match="XLA, which rloo does not support"):
        check_engine(DistributedType.XLA, {})
    two_processes = SimpleNamespace(num_processes=2)
    for name in ("sync_ref_model", "torch_compile", "fp16", "log_grad_variance", "max_staleness"):
        args = SimpleNamespace(**{"sync_ref_model": False, "torch_compile": False, "fp16": False, name: True})
        with pytest.raises(ValueError, match=f"{name} not supported with FSDP"):
            prepare_training(two_processes, torch.nn.Linear(2, 2), None, args, 1, ShardingSettings())
        # one process is sharded only to offload its parameters: refused alike
        with pytest.raises(ValueError, match=f"{name} not supported with FSDP"):
            prepare_training(SimpleNamespace(num_processes=1), torch.nn.Linear(2, 2), None, args, 1, offloaded)


def test_lockstep_generation_keeps_decoding_padding_until_every_process_is_done() -> None:
    """A process whose rows all ended keeps running the forward while others decode: the
    completions, their masks and log-probs are those it would have had alone, padded."""
    model = build_tiny_llama(12, seed=1).eval()
    kwargs = {
        "num_generations": 2,
        "max_new_tokens": 8,
        "params": SamplingParams(),
        "eos_token_ids": list(range(12)),  # every token ends a row: done after one step
        "pad_token_id": 0,
        "sampling_seed": 3,
    }
    alone = generate_rollouts(model, [[1, 2], [3]], [0, 1], **kwargs)
    asked: list[bool] = []

    def others_need_five_steps(done: bool) -> bool:
        asked.append(done)
        return len(asked) >= 5

    step = generate_rollouts(model, [[1, 2], [3]], [0, 1], all_done=others_need_five_steps, **kwargs)
    assert alone.completion_ids.shape[1] == 1 and step.completion_ids.shape[1] == 5
    assert asked == [True] * 5
    assert torch.equal(step.completion_mask[:, :1], alone.completion_mask) and step.completion_mask[:, 1:].sum() == 0
    assert torch.equal(step.completion_ids[:, :1], alone.completion_ids) and step.completion_ids[:, 1:].eq(0).all()
    assert torch.equal(step.sampling_logprobs[:, :1], alone.sampling_logprobs)
    assert torch.equal(step.truncated, alone.truncated)


# ---------------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case of ``tests/helpers/fsdp_runs.py`` trained by one process, unsharded: what sharded runs equal."""
    out = tmp_path_factory.mktemp("one")
    assert_ok(python("tests/helpers/fsdp_runs.py", str(out)))
    return out


def assert_trained_alike(one: Path, other: Path, names: tuple[str, ...] = tuple(CASES)) -> None:
    for name in names:
        full_one, full_other = (
            load_file(str(one / f"{name}.safetensors")),
            load_file(str(other / f"{name}.safetensors")),
        )
        assert {k: v.shape for k, v in full_one.items()} == {k: v.shape for k, v in full_other.items()}, name
        assert max_param_diff(one / f"{name}.safetensors", other / f"{name}.safetensors") < PARAM_ATOL, name
        assert_same_metrics(metrics(one / f"{name}.json"), metrics(other / f"{name}.json"))


@pytest.mark.system
def test_two_fsdp_processes_train_as_one_and_save_full_weights(tmp_path: Path, one_process: Path) -> None:
    """A full model (separate reference, old log-probs from extra passes, clipping) and LoRA (the
    reference is the sharded policy with adapters disabled; evaluation with a filler batch; the
    best model saved and loaded back): the same parameters and metrics as one process, written as
    full (consolidated) safetensors by the trainer's own save."""
    two = tmp_path / "two"
    result = torchrun("tests/helpers/fsdp_runs.py", str(two), extra_env=FSDP_ENV)
    assert_ok(result)
    assert "(fp32, FSDP2)" in result.stderr + result.stdout  # it did shard
    assert_trained_alike(one_process, two)
    saved = sorted(p.name for p in (two / "world2" / "lora" / "run" / "final").iterdir())
    assert "adapter_model.safetensors" in saved and "model.safetensors" not in saved  # LoRA: the adapter only


@pytest.mark.system
def test_parameter_offload_trains_as_one_unsharded_process(tmp_path: Path, one_process: Path) -> None:
    """``fsdp_offload_params: true`` (refused before issue 29): the shards, gradients and optimizer state in
    CPU memory (torch's CPUOffloadPolicy, unpinned: pinning needs an accelerator), on 2 processes and on one
    (sharded over itself only to offload; LoRA: its frozen base offloaded too): the same parameters and metrics
    as the unsharded process.
    On a CPU the shards' device is the compute device, so the copies to and from the GPU, and the
    gradient norm's reduction on the GPU (:func:`rloo.training.parallel.fsdp._full_norm`), are not run here."""
    offload = {**FSDP_ENV, "FSDP_OFFLOAD_PARAMS": "true"}
    two, alone = tmp_path / "two", tmp_path / "alone"
    result = torchrun("tests/helpers/fsdp_runs.py", str(two), extra_env=offload)
    assert_ok(result)  # fsdp_runs.py asserts the policy (and reference) were sharded with CPUOffloadPolicy
    assert "(fp32, FSDP2)" in result.stderr + result.stdout
    assert_trained_alike(one_process, two)
    result = python("tests/helpers/fsdp_runs.py", str(alone), "lora", extra_env=offload)  # the frozen base offloaded
    assert_ok(result)
    assert "(fp32, FSDP2)" in result.stderr + result.stdout  # one process, sharded
    assert_trained_alike(one_process, alone, ("lora",))


def accelerate_fsdp(run_file: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [str(BIN / "accelerate"), "launch", "--config_file", str(EXAMPLES / "fsdp2_cpu.yaml")]
    command += [f"--main_process_port={free_port()}", "-m", "rloo", "train", str(run_file), *extra]
    return subprocess.run(command, cwd=REPO, env=child_env(**(env or {})), capture_output=True, text=True, timeout=300)


@pytest.mark.system
def test_fsdp_through_accelerate_launch_resumes_exactly_after_a_sigterm(tmp_path: Path) -> None:
    """``accelerate launch --config_file examples/accelerate/fsdp2_cpu.yaml``: a run stopped by a
    SIGTERM and resumed from its checkpoint (full weights, full optimizer state loaded back into
    the shards) ends with the weights and metrics of the run that went straight through."""
    straight = write_run_file(tmp_path, tmp_path / "straight", max_steps=6)
    result = accelerate_fsdp(straight)
    assert_ok(result)
    assert "(fp32, FSDP2)" in result.stderr + result.stdout
    stopped = write_run_file(tmp_path, tmp_path / "stopped", max_steps=6)
    result = accelerate_fsdp(stopped, env={"RLOO_TEST_SIGTERM_AT": "3"})
    assert result.returncode != 0 and "checkpoint saved" in result.stderr + result.stdout, result.stderr[-3000:]
    checkpoint = max((tmp_path / "stopped").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    weights = load_file(str(checkpoint / "model.safetensors"))  # full tensors, not one process's shards
    final = load_file(str(tmp_path / "straight" / "final" / "model.safetensors"))
    assert {k: v.shape for k, v in weights.items()} == {k: v.shape for k, v in final.items()}
    resumed = accelerate_fsdp(stopped, "--resume")
    assert_ok(resumed)
    assert f"resumed from {checkpoint}" in resumed.stderr + resumed.stdout
    assert (
        max_param_diff(tmp_path / "straight/final/model.safetensors", tmp_path / "stopped/final/model.safetensors")
        == 0.0
    )
    assert metrics(tmp_path / "stopped" / "metrics.jsonl") == metrics(tmp_path / "straight" / "metrics.jsonl")
