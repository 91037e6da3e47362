"""The rloo-vs-TRL benchmark's own pieces: its prompts, the varied-length policy, FLOP counts by hand."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

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
