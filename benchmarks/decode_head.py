"""A CPU decode step's LM head (``rloo.generation.decode_head``): ``nn.Linear``'s kernel, the weight-left product
over the whole vocabulary, and the same in vocabulary blocks (rloo's), by rows, in one process.

    .venv/bin/python benchmarks/decode_head.py                        # 32k x 512, rows 2-128
    .venv/bin/python benchmarks/decode_head.py --quick                # a smoke run

The three alternate call by call (the order reversed each round); milliseconds are medians. Each is checked
against ``nn.Linear``'s logits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def kernels(head: nn.Linear) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """The head's three products of ``(B, H)`` hidden states: name -> function."""
    import rloo.generation.decode_head as decode_head

    def blocked(block: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(hidden: torch.Tensor) -> torch.Tensor:
            saved, decode_head.VOCAB_BLOCK = decode_head.VOCAB_BLOCK, block
            try:
                return decode_head.weight_left_linear(head, hidden)
            finally:
                decode_head.VOCAB_BLOCK = saved

        return run

    return {
        "linear": lambda hidden: nn.functional.linear(hidden, head.weight, head.bias),
        "weight_left_whole": blocked(head.out_features),
        "weight_left_blocks": blocked(decode_head.VOCAB_BLOCK),
    }


def measure(vocab: int, hidden: int, rows: list[int], rounds: int) -> list[dict[str, Any]]:
    """Median milliseconds of each kernel at each row count, and its largest difference from ``nn.Linear``'s."""
    torch.manual_seed(0)
    head = nn.Linear(hidden, vocab, bias=False).requires_grad_(False)
    functions = kernels(head)
    results = []
    for count in rows:
        states = torch.randn(count, hidden)
        expected = functions["linear"](states)
        times: dict[str, list[float]] = {name: [] for name in functions}
        differences = {name: float((f(states) - expected).abs().max()) for name, f in functions.items()}
        for round_ in range(rounds):
            order = list(functions.items())
            for name, function in order if round_ % 2 else order[::-1]:
                start = time.perf_counter()
                function(states)
                times[name].append(time.perf_counter() - start)
        row = {"rows": count, **{f"{name}_ms": statistics.median(t) * 1e3 for name, t in times.items()}}
        results.append(row | {"max_difference": max(differences.values())})
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--rows", default="2,4,8,16,32,64,128")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--quick", action="store_true", help="a small head, two row counts, 3 rounds")
    parser.add_argument("--output", default="", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.vocab, args.hidden, args.rows, args.rounds = 10_000, 64, "2,32", 3
    rows = measure(args.vocab, args.hidden, [int(n) for n in args.rows.split(",")], args.rounds)
    print(f"head {args.vocab} x {args.hidden}, {torch.get_num_threads()} threads, median ms of {args.rounds} calls")
    print("| rows | nn.Linear | weight-left, whole | weight-left, blocks | largest difference |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['rows']} | {row['linear_ms']:.2f} | {row['weight_left_whole_ms']:.2f} "
            f"| {row['weight_left_blocks_ms']:.2f} | {row['max_difference']:.1e} |"
        )
    report = {"settings": {k: v for k, v in vars(args).items() if k != "output"}, "rows": rows}
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
