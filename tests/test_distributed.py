"""Data-parallel training on 2 processes (gloo on CPU) equals one process on the same global batch.

Every test launches real processes: ``torchrun`` (one or two "nodes" rendezvousing on
127.0.0.1) or ``accelerate launch``. About a minute in all on 2 CPU cores.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from accelerate.utils import DistributedType
from safetensors.torch import load_file

from rloo.generation.sampling import completion_uniforms
from rloo.tiny import save_tiny_model
from rloo.training.distributed import SUPPORTED_ENGINES, Ranks, check_engine, reduce_step_metrics
from tests.helpers.dist_runs import CASES, case_name
from tests.helpers.processes import child_env

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TIMING = re.compile(
    r"^(timing/.*|tokens_per_second|step_time|train_runtime|train_samples_per_second|train_steps_per_second)$"
)
# float noise of a different summation order, amplified by Adam's first steps; a wrong
# normalizer or a rank-local statistic moves parameters by ~1e-2 (learning rate 1e-2)
PARAM_ATOL = 1e-4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(
    *args: str, nproc: int = 2, extra_env: dict[str, str] | None = None, **rdzv: Any
) -> subprocess.CompletedProcess[str]:
    launcher = [str(BIN / "torchrun"), f"--nproc_per_node={nproc}"]
    if rdzv:
        launcher += [f"--{k}={v}" for k, v in rdzv.items()]
    else:
        launcher += ["--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    return subprocess.run(
        [*launcher, *args], cwd=REPO, env=child_env(**(extra_env or {})), capture_output=True, text=True, timeout=300
    )


def python(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=child_env(**(extra_env or {})),
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_ok(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


def max_param_diff(a: Path, b: Path) -> float:
    x, y = load_file(str(a)), load_file(str(b))
    assert x.keys() == y.keys()
    return max(float((x[k] - y[k]).abs().max()) for k in x)


def metrics(path: Path) -> list[dict[str, float]]:
    rows = (
        json.loads(path.read_text())
        if path.suffix == ".json"
        else [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    )
    return [{k: v for k, v in row.items() if not TIMING.match(k)} for row in rows]


def assert_same_metrics(a: list[dict[str, float]], b: list[dict[str, float]]) -> None:
    assert len(a) == len(b)
    for row_a, row_b in zip(a, b, strict=True):
        assert row_a.keys() == row_b.keys()
        for key in row_a:
            assert row_a[key] == pytest.approx(row_b[key], rel=1e-5, abs=1e-6, nan_ok=True), key


# ---------------------------------------------------------------------------- the pieces, one process
def test_step_metrics_sum_the_loss_and_weight_token_means_by_tokens() -> None:
    per_rank = [
        {"loss": 0.5, "entropy": 2.0, "grad_norm": 1.0, "_tokens": 30.0},
        {"loss": -0.25, "entropy": 1.0, "grad_norm": 1.0, "_tokens": 10.0, "rewards/f/failed": 2.0},
    ]
    out = reduce_step_metrics(per_rank)
    assert out["loss"] == 0.25  # each rank's loss is its share of the global loss
    assert out["entropy"] == pytest.approx((2.0 * 30 + 1.0 * 10) / 40)  # 1.75, not the mean 1.5
    assert out["grad_norm"] == 1.0 and out["rewards/f/failed"] == 2.0  # a key only one rank has
    assert "_tokens" not in out
    nan = reduce_step_metrics([{"loss": float("nan")}, {"loss": 1.0}])["loss"]
    assert nan != nan  # a NaN on one rank reaches every rank: the step is skipped everywhere


def test_shards_are_contiguous_whole_groups_and_batches_come_back_in_order() -> None:
    prompts = list(range(8))
    assert [Ranks(r, 2).shard(prompts) for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert Ranks().map_batches(lambda idx, b: (b, idx), total=5, size=2) == [(0, [0, 1]), (1, [2, 3]), (2, [4])]


def test_a_completions_random_draws_do_not_depend_on_its_batch() -> None:
    together = completion_uniforms(0, [3, 4, 5], k=2, steps=6, device=torch.device("cpu"))
    alone = completion_uniforms(0, [4], k=2, steps=6, device=torch.device("cpu"))
    assert torch.equal(together[2:4], alone)  # group 4's two completions, wherever sampled
    assert not torch.equal(together[0], together[1])  # the K samples of a prompt differ
    assert not torch.equal(completion_uniforms(1, [4], 2, 6, torch.device("cpu")), alone)  # and the seed matters


def test_sharded_engines_are_refused_with_what_to_use() -> None:
    with pytest.raises(ValueError, match=r"FSDP, which rloo does not support yet.*examples/accelerate/ddp\.yaml"):
        check_engine(DistributedType.FSDP)
    check_engine(DistributedType.MULTI_GPU)


def test_example_launch_files_parse() -> None:
    folder = REPO / "examples" / "accelerate"
    for config in folder.glob("*.yaml"):
        values = yaml.safe_load(config.read_text())
        assert DistributedType(values["distributed_type"]).name in SUPPORTED_ENGINES, config.name
        assert values["num_processes"] >= values.get("num_machines", 1), config.name
    assert subprocess.run(["bash", "-n", str(folder / "slurm.sbatch")]).returncode == 0


# ---------------------------------------------------------------------------- the update
def test_two_processes_update_as_one_on_the_same_global_batch(tmp_path: Path) -> None:
    """Every loss aggregation mode, advantage normalization off and on, and a batch-mean baseline
    (reinforce_pp): same parameters after two steps, same logged metrics (the gradient variance too)."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert_ok(python("tests/helpers/dist_runs.py", str(one)))
    assert_ok(torchrun("tests/helpers/dist_runs.py", str(two)))
    for case in CASES:
        name = case_name(*case)
        assert max_param_diff(one / f"{name}.safetensors", two / f"{name}.safetensors") < PARAM_ATOL, name
        assert_same_metrics(metrics(one / f"{name}.json"), metrics(two / f"{name}.json"))
        if case[2] in ("reinforce_pp", "lora+eval"):  # log_grad_variance: over both processes' groups
            assert all(row["grad_var/groups"] == 4.0 for row in metrics(two / f"{name}.json") if "reward" in row)


# ---------------------------------------------------------------------------- the CLI, end to end
def write_run_file(tmp_path: Path, output_dir: Path, **overrides: Any) -> Path:
    model = tmp_path / "model"
    if not model.exists():
        save_tiny_model(model, chars="0123456789+= ")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}="}) + "\n" for a in range(10) for b in range(10)))
    values = {
        "model": str(model),
        "dataset": str(data),
        "reward_funcs": ["tests.helpers.models:frac7_stopping"],
        "output_dir": str(output_dir),
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 6,
        "learning_rate": 0.03,
        "lr_scheduler_type": "constant",
        "save_steps": 2,
        "max_steps": 12,
        "logging_steps": 1,
        "seed": 0,
        **overrides,
    }
    run_file = tmp_path / f"{output_dir.name}.yaml"
    run_file.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in values.items()))
    return run_file


def test_two_processes_learn_and_resume_exactly_after_a_sigterm(tmp_path: Path) -> None:
    straight = write_run_file(tmp_path, tmp_path / "straight")
    assert_ok(torchrun("-m", "rloo", "train", str(straight)))
    rows = metrics(tmp_path / "straight" / "metrics.jsonl")
    rewards = [r["reward"] for r in rows if "reward" in r]  # the last row is the run's summary
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.1, (first, last)  # it learns to write 7s

    stopped = write_run_file(tmp_path, tmp_path / "stopped")
    result = torchrun("-m", "rloo", "train", str(stopped), extra_env={"RLOO_TEST_SIGTERM_AT": "5"})
    assert result.returncode != 0  # 143 on every process: interrupted, checkpoint written
    saved = sorted((tmp_path / "stopped").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert saved, (result.stdout + result.stderr)[-3000:]
    assert "checkpoint saved" in result.stderr + result.stdout
    assert_ok(torchrun("-m", "rloo", "train", str(stopped), "--resume"))
    assert (
        max_param_diff(tmp_path / "straight/final/model.safetensors", tmp_path / "stopped/final/model.safetensors")
        == 0.0
    )
    assert metrics(tmp_path / "stopped" / "metrics.jsonl") == rows

    # the checkpoint holds 2 processes' random states and prompt shards: 1 process is refused
    newest = max((tmp_path / "stopped").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    one = python("-m", "rloo", "train", str(stopped), "--resume-from", newest.name)
    assert one.returncode == 2
    assert "written by a run of 2 process(es) and this run has 1: resume with 2" in one.stderr + one.stdout


def test_two_nodes_on_one_machine_train_as_two_processes(tmp_path: Path) -> None:
    """Two ``torchrun --nnodes 2`` launchers of one process each, rendezvousing on 127.0.0.1,
    train the same run as one launcher with two processes."""
    single = write_run_file(tmp_path, tmp_path / "single", max_steps=4)
    assert_ok(torchrun("-m", "rloo", "train", str(single)))
    nodes = write_run_file(tmp_path, tmp_path / "nodes", max_steps=4)
    port = free_port()
    launches = [
        subprocess.Popen(
            [
                str(BIN / "torchrun"),
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={rank}",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_id=rloo-test",
                "-m",
                "rloo",
                "train",
                str(nodes),
            ],
            cwd=REPO,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in launches]
    assert [p.returncode for p in launches] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    assert "2 processes x 2 prompts" in "".join(outputs)
    assert (
        max_param_diff(tmp_path / "single/final/model.safetensors", tmp_path / "nodes/final/model.safetensors") == 0.0
    )


def test_the_python_api_and_accelerate_launch(tmp_path: Path) -> None:
    run_file = write_run_file(tmp_path, tmp_path / "accelerate", max_steps=2)
    config = REPO / "examples" / "accelerate" / "ddp_cpu.yaml"
    result = subprocess.run(
        [
            str(BIN / "accelerate"),
            "launch",
            "--config_file",
            str(config),
            f"--main_process_port={free_port()}",
            "-m",
            "rloo",
            "train",
            str(run_file),
        ],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_ok(result)
    assert "2 processes x 2 prompts" in result.stderr + result.stdout
    assert (tmp_path / "accelerate" / "final" / "model.safetensors").is_file()
