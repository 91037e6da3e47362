"""rloo's sampler with and without its shared-prefix decode attention (``rloo.generation.shared_prefix``), by
prompt length, in one process.

    .venv/bin/python benchmarks/shared_prefix.py                      # the benchmark's small model, K = 8
    .venv/bin/python benchmarks/shared_prefix.py --quick              # tiny model, a smoke run
    python3 benchmarks/shared_prefix.py --device cuda --dtype bfloat16 --prompt-tokens 128,512,2048   # a GPU

For each prompt length: P prompts x K completions of ``--tokens`` new tokens (EOS masked out: every row runs
them all) from the same per-completion draws, the two decodes alternating (the order swapped each round, a
warm-up of each first); seconds are medians. Every round compares their tokens and log-probs: the same
attention summed in another order, so the same distribution to float rounding, which can flip a draw that
falls at a near-tie. The shared prefix's
own minimum prompt length (``MIN_PREFIX_TOKENS``) is lifted here, so the short prompts show what it would cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from common import prompts  # noqa: E402
from sampler_speed import build_model  # noqa: E402


def measure(model: Any, tokenizer: Any, ids: list[list[int]], k: int, tokens: int, rounds: int) -> dict[str, Any]:
    """Seconds (medians over ``rounds``) of the plain and the shared-prefix decode of ``ids``; their largest
    log-prob difference over each row's tokens up to its first differing one, and the largest share of rows
    (over the rounds) with a differing token (float rounding flips a near-tie of the draw, more often the
    flatter the distribution: a random model's over 32k tokens is nearly uniform)."""
    from rloo.generation.rollout import generate_rollouts
    from rloo.generation.sampling import SamplingParams

    def run(shared: bool, seed: int) -> Any:
        os.environ["RLOO_SHARED_PREFIX"] = "1" if shared else "0"
        with torch.no_grad():
            return generate_rollouts(
                model,
                ids,
                list(range(len(ids))),
                num_generations=k,
                max_new_tokens=tokens,
                params=SamplingParams(),
                eos_token_ids=[tokenizer.eos_token_id],
                pad_token_id=tokenizer.pad_token_id,
                sampling_seed=seed,
                compact_at=0.25,
            )

    times: dict[bool, list[float]] = {False: [], True: []}
    difference, differ = 0.0, 0.0
    for round_ in range(rounds + 1):
        outs = {}
        for shared in (False, True) if round_ % 2 == 0 else (True, False):
            start = time.perf_counter()
            outs[shared] = run(shared, round_)
            if outs[shared].completion_ids.is_cuda:
                torch.cuda.synchronize()
            if round_:  # round 0 warms both up
                times[shared].append(time.perf_counter() - start)
        # a row's tokens up to its first difference: the rest follow other tokens
        same = (outs[False].completion_ids == outs[True].completion_ids).long().cumprod(dim=1).bool()
        differ = max(differ, float((~same[:, -1]).float().mean()))
        gap = (outs[False].sampling_logprobs - outs[True].sampling_logprobs).abs() * same
        difference = max(difference, float(gap.max()))
    plain, shared = statistics.median(times[False]), statistics.median(times[True])
    return {
        "plain_s": plain,
        "shared_s": shared,
        "ratio": shared / plain,
        "max_logprob_difference": difference,
        "rows_differing": differ,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the comparison (``argv``: the command line's arguments) and return ``{"settings", "rows"}``; the
    shared prefix's minimum and ``RLOO_SHARED_PREFIX`` are put back after."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", help="a model of common.MODEL_SIZES")
    parser.add_argument("--prompt-tokens", default="16,32,64,128,320", help="comma-separated prompt lengths")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens a row")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (RLOO_SHARED_PREFIX=1 turns it on there)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the model's weights")
    parser.add_argument("--quick", action="store_true", help="tiny model, two lengths, 2 rounds")
    parser.add_argument("--output", default="", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.prompt_tokens, args.rounds, args.tokens = "tiny", "16,96", 2, 16

    import rloo.generation.shared_prefix as shared_prefix

    minimum, variable = shared_prefix.MIN_PREFIX_TOKENS, os.environ.get("RLOO_SHARED_PREFIX")
    shared_prefix.MIN_PREFIX_TOKENS = 1
    try:
        rows = compare(args)
    finally:
        shared_prefix.MIN_PREFIX_TOKENS = minimum
        if variable is None:
            os.environ.pop("RLOO_SHARED_PREFIX", None)
        else:
            os.environ["RLOO_SHARED_PREFIX"] = variable
    report = {"settings": {k: v for k, v in vars(args).items() if k != "output"}, "rows": rows}
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=1))
    return report


def eos_masked_model(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(model, tokenizer)``: ``args.model`` of ``common.MODEL_SIZES`` in ``args.dtype`` on ``args.device``, in eval
    mode, its EOS logit masked out (every row decodes all its tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        folder = build_model(Path(tmp), args.model)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, args.dtype)).eval().to(args.device)
    model.lm_head.register_forward_hook(
        lambda module, inputs, out: out.index_fill(-1, torch.tensor([tokenizer.eos_token_id], device=out.device), -1e9)
    )
    return model, tokenizer


def compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    """:func:`measure` at each of ``args.prompt_tokens``, printed as a table row as it comes."""
    model, tokenizer = eos_masked_model(args)
    rows = []
    columns = ["prompt tokens", "plain s", "shared prefix s", "shared / plain", "largest log-prob difference"]
    print("| " + " | ".join([*columns, "rows with a flip"]) + " |")
    print("|---|---|---|---|---|---|")
    for length in (int(n) for n in args.prompt_tokens.split(",")):
        ids = [tokenizer(row["prompt"])["input_ids"] for row in prompts(args.prompts, length)]
        assert all(len(i) == length for i in ids), "the benchmark's tokenizer: one token a character"
        row = {"prompt_tokens": length, **measure(model, tokenizer, ids, args.k, args.tokens, args.rounds)}
        rows.append(row)
        print(
            f"| {length} | {row['plain_s']:.3f} | {row['shared_s']:.3f} | {row['ratio']:.2f} "
            f"| {row['max_logprob_difference']:.1e} | {row['rows_differing']:.0%} |",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main()
