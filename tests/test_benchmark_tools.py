"""The rloo-vs-TRL benchmark's own pieces: its prompts, the varied-length policy, FLOP counts by hand; the GPU
benchmark's floors by hand and its dry run on a CPU."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from common import FlopCounter, model_sizes, prompts  # noqa: E402
from summary import minimum_flops  # noqa: E402
from varied_lengths import arrange, hazard_for  # noqa: E402

from rloo.tiny import build_char_tokenizer, build_tiny_llama, save_tiny_model  # noqa: E402


def test_long_prompts_have_exactly_the_asked_length_and_end_with_the_question() -> None:
    rows = prompts(5, chars=200)
    assert [len(r["prompt"]) for r in rows] == [200] * 5
    assert rows[1]["prompt"].endswith("\n17+23=") and rows[1]["answer"] == "40"
    assert prompts(2) == [{"prompt": "10+10=", "answer": "20"}, {"prompt": "17+23=", "answer": "40"}]


def test_hazard_gives_the_asked_share_at_the_limit() -> None:
    h = hazard_for(128, 0.12)
    assert (1 - h) ** 128 == pytest.approx(0.12)
    assert math.log(2) / h == pytest.approx(42.4, abs=0.5)  # the median of the geometric lengths


def test_arranged_model_ends_completions_at_the_asked_rate(tmp_path: Path) -> None:
    """Every position's p(EOS) is the hazard (to a few %), whatever the context."""
    source = save_tiny_model(tmp_path / "src", hidden_size=64, num_layers=2, num_heads=4, vocab_size=512)
    target = arrange(source, tmp_path / "varied", 0.05)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(target).eval()
    eos = AutoTokenizer.from_pretrained(target).eos_token_id
    ids = torch.randint(eos + 1, 512, (3, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        p_end = torch.softmax(model(input_ids=ids).logits.float(), dim=-1)[..., eos]
    assert float(p_end.mean()) == pytest.approx(0.05, rel=0.05)
    assert float(p_end.min()) > 0.04 and float(p_end.max()) < 0.06
    original = AutoModelForCausalLM.from_pretrained(source).eval()
    with torch.no_grad():
        assert float(torch.softmax(original(input_ids=ids).logits, dim=-1)[..., eos].max()) < 0.01


def test_flop_counter_counts_each_forward_and_backward_by_hand() -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(len(tokenizer), hidden_size=32, num_layers=2, num_heads=4)
    total, head, body = model_sizes(model)
    assert head == model.lm_head.weight.numel() and body == total - head  # tied: the head is the embedding
    counter = FlopCounter()
    counter.attach(model)
    counter.attach(model)  # once per model
    ids = torch.randint(0, len(tokenizer), (3, 7))
    with torch.no_grad():
        model(input_ids=ids, logits_to_keep=2)
    assert counter.flops == 2 * body * 21 + 2 * head * 6
    counter.flops = 0.0
    model(input_ids=ids, logits_to_keep=1).logits.sum().backward()
    assert counter.flops == 3 * (2 * body * 21 + 2 * head * 3)


def test_minimum_flops_by_hand() -> None:
    info = {"prompt_length": 10, "body_parameters": 100, "head_parameters": 7}
    case = {"num_prompts": 2, "num_generations": 4}
    # body: 2 prompts x 10 + 30 completion tokens - 8 rows = 42 tokens; head: 30 tokens; x (1 + 1 + 3)
    assert minimum_flops(info, case, 30) == 2 * (100 * 42 + 7 * 30) * 5


def test_the_offload_benchmark_runs_each_case_with_the_same_options(tmp_path: Path) -> None:
    """``benchmarks/offload_memory.py`` runs each case in a process of its own: that process must get the
    model and workload the command line asked for, and run one case."""
    from offload_memory import CASES, case_command, parse

    asked = parse(["--quick", "--layers", "3", "--prompt-length", "48", "--weights", "bfloat16", "--timeout", "9"])
    command = case_command("both", asked, tmp_path / "case.json")
    again = parse(command[2:])
    assert again.case == "both" and again.out == str(tmp_path / "case.json") and "both" in CASES
    assert {k: v for k, v in vars(again).items() if k not in ("case", "out", "timeout")} == {
        k: v for k, v in vars(asked).items() if k not in ("case", "out", "timeout")
    }


def test_the_lm_head_benchmark_runs_every_case_quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """``benchmarks/lm_head_kernels.py --quick``: the chunked head and the fused head's torch fold at two
    vocabulary tiles, with and without gradient, each agreeing with the chunked head; the head-kernel
    variable put back."""
    from lm_head_kernels import main

    monkeypatch.setenv("RLOO_LM_HEAD_KERNEL", "fused")
    report = main(["--quick"])
    rows = report["results"]
    assert [(r["mode"], r["kernel"], r["vocab_tile"]) for r in rows] == [
        (mode, kernel, tile)
        for mode in ("logprobs", "train")
        for kernel, tile in [("chunked", None), ("fused", 256), ("fused", 1000)]
    ]
    assert all("error" not in r and "ms" in r for r in rows)
    assert all(r["max_differences"]["logprobs"] < 1e-3 and r["max_differences"]["entropy"] < 1e-3 for r in rows)
    assert all(r["max_differences"]["weight"] < 0.02 for r in rows if r["mode"] == "train")  # bf16 autocast
    assert os.environ["RLOO_LM_HEAD_KERNEL"] == "fused"


def gpu_run(lengths: list[tuple[list[int], list[int]]], device: str = "NVIDIA H100 80GB HBM3") -> dict[str, Any]:
    """A ``gpu_vs_trl.py`` run record with one batch per (prompt lengths, completion lengths), the first a warm-up."""
    batches = [
        {
            "index": i,
            "profiled": False,
            "seconds": 10.0 + i,
            "phases": {"sampling": [2.0 + i], "logprobs": [0.5, 0.25]},
            "own": {"update": [0.1 * i, 0.2 * i]},
            "peak_bytes": {"batch": 2**30 * i},
            "forwards": {"logprobs": {"calls": 2, "per_call": {"2": 2}}, "update": {"calls": 2, "per_call": {"1": 2}}},
            "prompt_lengths": prompts,
            "completion_lengths": completions,
            "decode_steps": max(completions),
            "mean_completion_length": sum(completions) / len(completions),
        }
        for i, (prompts, completions) in enumerate(lengths)
    ]
    model = {"layers": 1, "kv_heads": 1, "head_dim": 2, "parameters": 100, "body_parameters": 60, "head_parameters": 40}
    settings = {"num_generations": 2, "steps_per_generation": 2}
    return {"device": device, "status": "done", "settings": settings, "model": model, "batches": batches}


def test_gpu_report_medians_skip_the_warm_up_and_the_floors_by_hand() -> None:
    from gpu_report import floors, numbers, peaks_for

    run = gpu_run([([9, 9], [9, 9]), ([3, 3], [2, 1]), ([3, 3], [2, 1])])
    got = numbers(run)
    assert got is not None and got["timed_batches"] == [1, 2]
    assert got["sampling"] == 3.5 and got["decode_ms"] == pytest.approx(1750.0)  # 3 s / 2 steps and 4 s / 2 steps
    assert got["logprobs"] == 0.75 and got["batch"] == 11.5 and got["peak_gib"] == 2.0
    assert got["update"] == pytest.approx(0.2) and got["update_slowest_over_median"] == pytest.approx(2.0)  # 0.1-0.4
    bandwidth, flops = peaks_for(run["device"]) or (0.0, 0.0)
    assert (bandwidth, flops) == (3.0e12, 800e12) and peaks_for("cpu") is None
    floor = floors(run, (bandwidth, flops))
    assert floor is not None
    kv = 2 * 1 * 1 * 2 * 2 * ((2 * 3 + 1) + (1 * 3 + 0))  # K and V x layers x heads x dim x 2 B, over the contexts
    assert floor["decode_ms"] == pytest.approx(1000 * (200 + kv / 2) / bandwidth)
    assert floor["sampling"] == pytest.approx((2 * 200 + kv) / bandwidth + 2 * 60 * 6 / 2 / flops)
    assert floor["logprob_flops"] == 2 * (2 * 60 * 9 + 2 * 40 * 3)  # reference and old: 9 tokens, 3 through the head
    assert floor["update_flops"] == (6 * 60 * 9 + 6 * 40 * 3) / 2  # each optimizer step trains half the rows
    assert floor["update"] == pytest.approx(floor["update_flops"] / flops + 32 * 100 / bandwidth)
    assert floor["batch"] == pytest.approx(floor["sampling"] + floor["logprobs"] + 2 * floor["update"])


def test_gpu_report_names_the_fastest_sampler_and_the_fused_heads_ratios() -> None:
    from gpu_report import verdict

    lengths = [([4, 4], [2, 2])] * 3
    slow, fast = gpu_run(lengths), gpu_run(lengths)
    for batch in fast["batches"]:
        batch["phases"] = {"sampling": [0.5], "logprobs": [0.1]}
    cb = {**gpu_run(lengths), "status": "error"}  # an unfinished run is left out
    lines = verdict({"fixed": slow}, {"graphs-fused fixed": fast, "cb fixed": cb})
    fastest = "captured decode step is the fastest (eager loop (as is) 3.5 s, captured decode step 0.5 s)"
    assert lines[0] == f"verdict, sampler: {fastest}"
    assert lines[1] == "verdict, logprobs with the fused head: 0.13x the chunked head's"  # 0.1 / 0.75
    assert verdict({}, {}) == ["verdict: no finished as-is fixed run to compare with"]


@pytest.mark.system
def test_the_gpu_benchmark_dry_run_leaves_every_phase_and_the_table(tmp_path: Path) -> None:
    """``QUICK=1 bash benchmarks/gpu_vs_trl.sh``, its rloo and TRL fixed-length parts (the others run the same code
    on other settings): each implementation's JSON has every phase of every batch, the forwards per phase and the
    profiled last batch's reduced profile, and the last lines printed are the table with each phase measured."""
    env = {**os.environ, "OUT": str(tmp_path), "QUICK": "1", "PARTS": "rloo-fixed trl-fixed", "PY": sys.executable}
    done = subprocess.run(
        ["bash", str(BENCHMARKS / "gpu_vs_trl.sh")],
        cwd=BENCHMARKS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = (tmp_path / "log.txt").read_text() if (tmp_path / "log.txt").exists() else ""
    assert done.returncode == 0, done.stdout[-3000:] + log[-3000:]
    for impl in ("rloo", "trl"):
        run = json.loads((tmp_path / f"{impl}.json").read_text())["fixed"]
        assert run["status"] == "done", run.get("error")
        assert [b["profiled"] for b in run["batches"]] == [False, True]
        for batch in run["batches"]:
            assert {"batch", "sampling", "logprobs", "update"} <= set(batch["phases"])
            assert len(batch["own"]["update"]) == 4  # steps_per_generation optimizer steps
            assert 0 < batch["decode_steps"] <= 8 and batch["peak_bytes"]["batch"] is None  # no peak on a CPU
            forwards = batch["forwards"]
            assert forwards["sampling"]["calls"] >= batch["decode_steps"]
            assert forwards["logprobs"]["calls"] >= 2 and forwards["update"]["calls"] >= 4
        phases = run["profile"]["phases"]
        assert {"sampling", "logprobs", "update"} <= set(phases)
        assert any("scaled_dot_product" in op for op in phases["sampling"]["attention_ops"])
        assert phases["update"]["aten_ops"] > 0 and phases["update"]["host_syncs"] is None  # counted on CUDA only
    with gzip.open(tmp_path / "trace_decode.json.gz") as trace:
        assert json.load(trace)["traceEvents"]
    summary = json.loads((tmp_path / "gpu-vs-trl-cpu.json").read_text())
    assert summary["tables"]["main"][0].startswith("| phase | rloo | TRL |")
    assert len(list(tmp_path.iterdir())) <= 8  # what the GPU machine sends back
    lines = done.stdout.strip().splitlines()
    table = lines[lines.index(summary["tables"]["main"][0]) :]
    assert table == summary["tables"]["main"]  # the last lines
    timed = [row for row in table if row.startswith("| fixed: ") and (", s |" in row or ", ms |" in row)]
    measured = [row.split(" | ") for row in timed]
    assert len(measured) == 5  # sampling, decode step, log-prob passes, update, generation batch
    for cells in measured:
        assert float(cells[1]) > 0 and float(cells[2]) > 0, cells


def test_the_shared_prefix_benchmark_compares_both_decodes_quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """``benchmarks/shared_prefix.py --quick``: both decodes at each prompt length, the same tokens; the shared
    prefix's minimum prompt and its variable put back."""
    import shared_prefix as benchmark

    import rloo.generation.shared_prefix as shared_prefix

    monkeypatch.setenv("RLOO_SHARED_PREFIX", "1")
    report = benchmark.main(["--quick"])
    assert [row["prompt_tokens"] for row in report["rows"]] == [16, 96]
    assert all(
        row["plain_s"] > 0 and row["shared_s"] > 0 and row["max_logprob_difference"] < 1e-4 for row in report["rows"]
    )
    assert shared_prefix.MIN_PREFIX_TOKENS == 64 and os.environ["RLOO_SHARED_PREFIX"] == "1"


def test_the_decode_head_benchmark_times_the_three_products_quick() -> None:
    """``benchmarks/decode_head.py --quick``: each product at each row count, equal to ``nn.Linear``'s logits;
    rloo's block size put back."""
    import decode_head as benchmark

    from rloo.generation import decode_head

    block = decode_head.VOCAB_BLOCK
    report = benchmark.main(["--quick"])
    assert [row["rows"] for row in report["rows"]] == [2, 32]
    assert all(row["max_difference"] < 1e-4 and row["weight_left_blocks_ms"] > 0 for row in report["rows"])
    assert block == decode_head.VOCAB_BLOCK


def test_the_sampler_engines_benchmark_times_both_engines_quick() -> None:
    """``benchmarks/sampler_engines.py --quick``: rloo's sampler and transformers' continuous batching on the same
    prompts, each one's log-probs those of rloo's forward."""
    import sampler_engines as benchmark

    report = benchmark.main(["--quick"])
    (row,) = report["rows"]
    assert row["prompt_tokens"] == 16 and row["rloo_s"] > 0 and row["continuous_batching_s"] > 0
    assert row["rloo_logprob_gap"] < 1e-4 and row["continuous_batching_logprob_gap"] < 1e-4
