"""Data-parallel training on 2 processes (gloo on CPU) equals one process on the same global batch.

Every test launches real processes: ``torchrun`` (one or two "nodes" rendezvousing on
127.0.0.1) or ``accelerate launch``. About a minute in all on 2 CPU cores.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from accelerate.utils import DistributedType

from rloo.generation.sampling import completion_uniforms
from rloo.training.parallel.distributed import Ranks, check_engine, gradient_buckets, reduce_step_metrics
from tests.helpers.dist_runs import CASES, case_name
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

# float noise of a different summation order, amplified by Adam's first steps; a wrong
# normalizer or a rank-local statistic moves parameters by ~1e-2 (learning rate 1e-2)
PARAM_ATOL = 1e-4


# ---------------------------------------------------------------------------- the pieces, one process
def test_gradients_are_reduced_in_buckets_not_one_copy_of_all() -> None:
    # before: one flat copy of every gradient (a second full gradient in memory, issue 25)
    sizes = [3, 5, 2, 7, 20, 1]
    grads = [torch.zeros(n) for n in sizes]
    buckets = gradient_buckets(grads, max_numel=8)
    assert [[g.numel() for g in bucket] for bucket in buckets] == [[3, 5], [2], [7], [20], [1]]
    assert [g for bucket in buckets for g in bucket] == grads  # every gradient once, in order
    mixed = gradient_buckets([torch.zeros(2), torch.zeros(2, dtype=torch.float64)], max_numel=8)
    assert len(mixed) == 2  # one dtype per flat buffer


def _sum_in_buckets(rank: int, port: int, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    for p in model.parameters():
        p.grad = torch.full_like(p, float(rank + 1)) * torch.arange(p.numel()).view_as(p)
    Ranks(rank, 2).sum_gradients(model, bucket_numel=5)  # 4 gradients of 12, 3, 6, 2 elements: 4 buckets
    if rank == 0:
        torch.save([p.grad for p in model.parameters()], out)
    torch.distributed.destroy_process_group()


@pytest.mark.system
def test_bucketed_gradient_sums_over_two_processes(tmp_path: Path) -> None:
    out = str(tmp_path / "grads.pt")
    torch.multiprocessing.spawn(_sum_in_buckets, args=(free_port(), out), nprocs=2)
    for grad in torch.load(out):
        torch.testing.assert_close(grad, 3.0 * torch.arange(grad.numel()).view_as(grad).float())


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


def test_data_parallel_engines_run_unsharded() -> None:
    for engine in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        assert check_engine(engine, env={}) is None
    # the launch files (DDP, FSDP2, DeepSpeed) and the SLURM script: tests/training/parallel/test_fsdp.py


# ---------------------------------------------------------------------------- the update
@pytest.mark.system
def test_two_processes_update_as_one_on_the_same_global_batch(tmp_path: Path) -> None:
    """Every loss aggregation mode, advantage normalization off and on, and a batch-mean baseline
    (reinforce_pp): same parameters after two steps, same logged metrics (the gradient variance too,
    and the compute_metrics hook's: it got every process's eval completions, in the same order)."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert_ok(python("tests/helpers/dist_runs.py", str(one)))
    assert_ok(torchrun("tests/helpers/dist_runs.py", str(two)))
    for case in CASES:
        name = case_name(*case)
        assert max_param_diff(one / f"{name}.safetensors", two / f"{name}.safetensors") < PARAM_ATOL, name
        assert_same_metrics(metrics(one / f"{name}.json"), metrics(two / f"{name}.json"))
        if case[2] in ("reinforce_pp", "lora+eval"):  # log_grad_variance: over both processes' groups
            assert all(row["grad_var/groups"] == 4.0 for row in metrics(two / f"{name}.json") if "reward" in row)
    # an evaluation after each of the 2 steps: one call each, by the main process, on all 5 x K = 2 completions
    for out in (one, two):
        assert (out / "compute_metrics_calls.txt").read_text().splitlines() == ["0 10", "0 10"]
    logged = metrics(two / f"{case_name('token_mean', False, 'lora+eval')}.json")
    evaluated = [row for row in logged if "eval_reward" in row]
    assert len(evaluated) == 2 and all(row["eval_completions_seen"] == 10.0 for row in evaluated)


# ---------------------------------------------------------------------------- the CLI, end to end
@pytest.mark.system
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


@pytest.mark.system
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


@pytest.mark.system
def test_the_python_api_and_accelerate_launch(tmp_path: Path) -> None:
    """With no output_dir (issue 24), both processes train into the one fresh folder the main one chose."""
    run_file = write_run_file(tmp_path, tmp_path / "accelerate", max_steps=2)
    run_file.write_text("".join(line for line in run_file.read_text().splitlines(True) if "output_dir" not in line))
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
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_ok(result)
    assert "2 processes x 2 prompts" in result.stderr + result.stdout
    assert [folder.name for folder in (tmp_path / "runs").iterdir()] == ["rloo"]
    assert (tmp_path / "runs" / "rloo" / "final" / "model.safetensors").is_file()
