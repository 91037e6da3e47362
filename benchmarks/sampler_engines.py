"""rloo's own sampler against transformers' continuous batching behind rloo's engine seam
(``rloo.generation.continuous_batching``, ``use_transformers_continuous_batching``), by prompt length, in one process.

    .venv/bin/python benchmarks/sampler_engines.py                       # the benchmark's small model, K = 8
    .venv/bin/python benchmarks/sampler_engines.py --quick               # tiny model, a smoke run
    python3 benchmarks/sampler_engines.py --device cuda --dtype bfloat16 --prompt-tokens 128,512   # a GPU

For each prompt length: P prompts x K completions of ``--tokens`` new tokens (EOS masked out: every row runs them
all), each engine called as the trainer calls it (the same arguments, per-completion seeds), alternating (the
order swapped each round, a warm-up of each first); seconds are medians, with the device synchronized. Also the
largest difference between each engine's log-prob of its sampled tokens and rloo's own forward's (both engines
record them; continuous batching's come from its paged attention, rloo's sampler's from its decode step), and
the process's peak RSS. ``--cb-config '{"max_memory_percent": 0.9}'`` hands the engine its own cache sizing
back (a share of the free memory: on a CPU, of the machine's RAM) to measure what rloo's sizing saves.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from common import prompts  # noqa: E402
from shared_prefix import eos_masked_model  # noqa: E402

ENGINES = ("rloo", "continuous batching")


def scored_gap(model: Any, rollout: Any) -> float:
    """The largest ``|engine's log-prob - rloo's forward's|`` over the sampled tokens (one no-grad forward)."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    width = rollout.prompt_ids.shape[1]
    logprobs = torch.log_softmax(logits[:, width - 1 : -1].float(), -1)
    ours = logprobs.gather(-1, rollout.completion_ids[..., None])[..., 0] * rollout.completion_mask
    return float((ours - rollout.sampling_logprobs).abs().max())


def measure(
    model: Any, tokenizer: Any, ids: list[list[int]], k: int, tokens: int, rounds: int, cb_config: dict[str, Any]
) -> dict[str, Any]:
    """Median seconds of each engine over ``rounds`` (after a warm-up round), and each one's log-prob gap;
    ``cb_config``: transformers' ``ContinuousBatchingConfig`` keywords."""
    from rloo.generation.continuous_batching import ContinuousBatchingSampler
    from rloo.generation.rollout import generate_rollouts
    from rloo.generation.sampling import SamplingParams

    engines = {"rloo": generate_rollouts, "continuous batching": ContinuousBatchingSampler(cb_config)}
    common = {
        "num_generations": k,
        "max_new_tokens": tokens,
        "params": SamplingParams(),
        "eos_token_ids": [tokenizer.eos_token_id],
        "pad_token_id": tokenizer.pad_token_id,
        "compact_at": 0.25,
    }
    times: dict[str, list[float]] = {name: [] for name in ENGINES}
    gaps = dict.fromkeys(ENGINES, 0.0)
    for round_ in range(rounds + 1):
        for name in ENGINES if round_ % 2 == 0 else ENGINES[::-1]:
            start = time.perf_counter()
            with torch.no_grad():
                rollout = engines[name](model, ids, list(range(len(ids))), sampling_seed=round_, **common)
            if rollout.completion_ids.is_cuda:
                torch.cuda.synchronize()
            if round_:  # round 0 warms both up
                times[name].append(time.perf_counter() - start)
            gaps[name] = max(gaps[name], scored_gap(model, rollout))
    ours, theirs = (statistics.median(times[name]) for name in ENGINES)
    return {
        "rloo_s": ours,
        "continuous_batching_s": theirs,
        "ratio": theirs / ours,
        "rloo_logprob_gap": gaps["rloo"],
        "continuous_batching_logprob_gap": gaps["continuous batching"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the comparison (``argv``: the command line's arguments) and return ``{"settings", "rows"}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", help="a model of common.MODEL_SIZES")
    parser.add_argument("--prompt-tokens", default="32,128,320", help="comma-separated prompt lengths")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens a row")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the model's weights")
    parser.add_argument("--quick", action="store_true", help="tiny model, one length, 1 round")
    parser.add_argument("--cb-config", type=json.loads, default={}, help="ContinuousBatchingConfig keywords, JSON")
    parser.add_argument("--output", default="", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.prompt_tokens, args.rounds, args.tokens, args.prompts = "tiny", "16", 1, 8, 2
    report: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "output"}}
    report["rows"] = compare(args)
    report["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {report['peak_rss_mib']:.0f} MiB")
    if args.output:
        Path(args.output).write_text(json.dumps(report, indent=1))
    return report


def compare(args: argparse.Namespace) -> list[dict[str, Any]]:
    """:func:`measure` at each of ``args.prompt_tokens``, printed as a table row as it comes."""
    model, tokenizer = eos_masked_model(args)
    rows = []
    print("| prompt tokens | rloo s | continuous batching s | CB / rloo | log-prob gap rloo | log-prob gap CB |")
    print("|---|---|---|---|---|---|")
    for length in (int(n) for n in args.prompt_tokens.split(",")):
        ids = [tokenizer(row["prompt"])["input_ids"] for row in prompts(args.prompts, length)]
        timed = measure(model, tokenizer, ids, args.k, args.tokens, args.rounds, args.cb_config)
        row = {"prompt_tokens": length, **timed}
        rows.append(row)
        print(
            f"| {length} | {row['rloo_s']:.3f} | {row['continuous_batching_s']:.3f} | {row['ratio']:.2f} "
            f"| {row['rloo_logprob_gap']:.1e} | {row['continuous_batching_logprob_gap']:.1e} |",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main()
