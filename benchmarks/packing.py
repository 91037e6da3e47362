"""Padding-free passes against the padded ones (``padding_free``), pass by pass, on varied-length rows.

    .venv/bin/python benchmarks/packing.py                      # CPU: bench_vs_trl's `small` model, float32
    python3 benchmarks/packing.py --model qwen0.5b --bf16       # a GPU: Qwen2.5-0.5B's shape, bf16 autocast
    .venv/bin/python benchmarks/packing.py --steps              # also whole steps of bench_vs_trl's varied case

The rows are bench_vs_trl.py's varied-length case: P prompts x K completions, completion lengths geometric
(a constant end probability per token, 12% reaching the limit T, median about a third of it), prompts of the
arithmetic kind (8 to 24 tokens) or, with ``--prompt-tokens N``, few-shot prompts of N tokens. For each
layout rule (``padding_free`` False: shared prompts in length buckets; True: packed where the FLOPs model says
so) it prints the layout each pass took, the FLOPs model's count for every layout with its ratio to the
minimum (:func:`rloo.forward.packing.minimum_flops`), and the median seconds of the reference/old
log-prob pass (no gradient) and of a training pass (forward + backward), the two rules interleaved.

``--steps`` adds whole RLOO steps of ``bench_vs_trl.py``'s ``small-varied`` case (4 prompts x 8 x 128 tokens),
``padding_free`` off and on, interleaved: seconds per step and the log-prob and update phases, with the
matmul FLOPs counted per step (benchmarks/common.py's counter) and their ratio to the step's minimum.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

from rloo.forward.logprobs import completion_logprobs  # noqa: E402
from rloo.forward.packing import choose_layout, forward_cost, minimum_flops, packs_rows  # noqa: E402
from rloo.forward.shared_prompt import distinct_prompts, may_share  # noqa: E402
from rloo.generation.rollout import left_pad  # noqa: E402

REACH = 0.12  # share of completions at the limit, as bench_vs_trl's varied case


def build(name: str, device: str) -> Any:
    """A random-init model: ``small`` (bench_vs_trl's: hidden 512, 8 layers, 32k vocabulary) or ``qwen0.5b``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if name == "qwen0.5b":
        config: Any = Qwen2Config(
            vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
            num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
        )  # fmt: skip
        model: Any = Qwen2ForCausalLM(config)
    else:
        sizes = {"small": (512, 8, 8, 1024, 32000), "tiny": (64, 2, 4, 128, 4096)}[name]
        hidden, layers, heads, mlp, vocab = sizes
        config = LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=mlp, max_position_embeddings=4096,
        )  # fmt: skip
        model = LlamaForCausalLM(config)
    return model.to(device)


def varied_rows(prompts: int, k: int, limit: int, prompt_tokens: int, vocab: int, seed: int) -> dict[str, Any]:
    """Left-padded prompts (each repeated K times) and right-padded completions of geometric lengths."""
    generator = torch.Generator().manual_seed(seed)
    hazard = 1.0 - REACH ** (1.0 / limit)
    prompt_lists, completions = [], []
    for _ in range(prompts):
        length = prompt_tokens or int(torch.randint(8, 25, (1,), generator=generator))
        prompt = torch.randint(5, vocab, (length,), generator=generator).tolist()
        for _ in range(k):
            u = float(torch.rand(1, generator=generator))
            completions.append(min(limit, 1 + int(math.log(1.0 - u) / math.log(1.0 - hazard))))
            prompt_lists.append(prompt)
    prompt_ids, prompt_mask = left_pad(prompt_lists, 0, torch.device("cpu"))
    width = max(completions)
    completion_ids = torch.randint(5, vocab, (len(completions), width), generator=generator)
    columns = torch.arange(width)
    completion_mask = (columns[None, :] < torch.tensor(completions)[:, None]).long()
    completion_ids = completion_ids * completion_mask
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "lengths": completions}  # fmt: skip


def flops_table(model: Any, rows: dict[str, Any]) -> dict[str, Any]:
    """The FLOPs model's count (one forward) of each layout the pass may take, the minimum, and the choice."""
    cost = forward_cost(model)
    masks = rows["prompt_ids"], rows["prompt_mask"], rows["completion_mask"]
    choice = choose_layout(*masks, cost, shared=may_share(model), packed=True)
    groups = distinct_prompts(rows["prompt_ids"], rows["prompt_mask"])
    inverse = groups[1].tolist() if groups is not None else list(range(len(rows["lengths"])))
    prompt_lengths = [int(n) for n in rows["prompt_mask"].sum(dim=1).tolist()]
    minimum = minimum_flops(prompt_lengths, rows["lengths"], inverse, cost)
    return {"flops": dict(choice.flops), "minimum": minimum, "chosen": choice.layout, "bins": len(choice.bins or [])}


def timed_pass(model: Any, rows: dict[str, Any], padding_free: bool, grad: bool, device: str, bf16: bool) -> float:
    on = {key: value.to(device) for key, value in rows.items() if isinstance(value, torch.Tensor)}
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.set_grad_enabled(grad), torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        out = completion_logprobs(
            model, on["prompt_ids"], on["prompt_mask"], on["completion_ids"], on["completion_mask"], 1.0,
            with_entropy=grad, padding_free=padding_free,
        )  # fmt: skip
        if grad:
            (out.logprobs * on["completion_mask"]).sum().backward()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def scenario(model: Any, rows: dict[str, Any], args: argparse.Namespace, device: str) -> dict[str, Any]:
    """One model set-up: the layouts' FLOPs and the passes' seconds with ``padding_free`` off and on."""
    table = flops_table(model, rows)
    print("  FLOPs model, one forward of the pass (GFLOPs, ratio to the minimum):")
    for name, flops in [*table["flops"].items(), ("minimum", table["minimum"])]:
        print(f"    {name:8s} {flops / 1e9:10.2f}  {flops / table['minimum']:5.2f}x")
    bins = f" in {table['bins']} bins" if table["chosen"] == "packed" else ""
    print(f"    taken with padding_free: {table['chosen']}{bins}")
    times: dict[str, dict[str, list[float]]] = {"no grad": {"off": [], "on": []}, "training": {"off": [], "on": []}}
    for _ in range(args.warmup):
        for flag in (False, True):
            timed_pass(model, rows, flag, True, device, args.bf16)
    for repeat in range(args.repeats):
        for flag in (False, True) if repeat % 2 == 0 else (True, False):
            key = "on" if flag else "off"
            times["no grad"][key].append(timed_pass(model, rows, flag, False, device, args.bf16))
            model.zero_grad(set_to_none=True)
            times["training"][key].append(timed_pass(model, rows, flag, True, device, args.bf16))
    print(f"  seconds per pass, median of {args.repeats} interleaved (padding_free off -> on):")
    seconds: dict[str, Any] = {}
    for kind, by_flag in times.items():
        off, on = statistics.median(by_flag["off"]), statistics.median(by_flag["on"])
        seconds[kind] = {"off": off, "on": on, "runs": by_flag}
        print(f"    {kind:9s} {off:8.4f} -> {on:8.4f}  ({off / on:4.2f}x)")
    return {**table, "seconds": seconds}


def pass_benchmark(args: argparse.Namespace, device: str) -> dict[str, Any]:
    model = build(args.model, device)
    model.train()
    rows = varied_rows(args.prompts, args.k, args.limit, args.prompt_tokens, model.config.vocab_size, seed=0)
    lengths, prompt_lengths = rows["lengths"], rows["prompt_mask"].sum(dim=1)
    precision = "bf16 autocast" if args.bf16 else "float32"
    print(f"model {args.model} on {device} ({precision}); packs rows: {packs_rows(model)}")
    print(
        f"{len(lengths)} rows: completions median {statistics.median(lengths)}, max {max(lengths)} of {args.limit}; "
        f"prompts of {int(prompt_lengths.min())}-{int(prompt_lengths.max())} tokens, each shared by {args.k} rows"
    )
    out = {"model": args.model, "device": device, "bf16": args.bf16, "lengths": lengths}
    print("\nplain training passes (prompt sharing allowed):")
    out["default"] = scenario(model, rows, args, device)
    model.gradient_checkpointing_enable()
    print("\nwith gradient checkpointing (no prompt sharing: no cache in the training forward):")
    out["gradient checkpointing"] = scenario(model, rows, args, device)
    return out


def step_benchmark(repeats: int) -> dict[str, Any]:
    """Whole steps of bench_vs_trl's small-varied case, padding_free off and on, interleaved."""
    from bench_vs_trl import CASES, build_models, run_child
    from summary import minimum_flops as step_minimum

    case = CASES["realistic"][0]
    folder = Path(tempfile.mkdtemp())
    model_dir = build_models(folder)[case.model]
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    python = Path(sys.executable)
    for repeat in range(repeats):
        for key in ("off", "on") if repeat % 2 == 0 else ("on", "off"):
            runs[key].append(run_child(python, "run_rloo.py", model_dir, case, {"padding_free": key == "on"}))
    print(f"\nwhole steps, {case.name} ({case.num_prompts} x {case.num_generations} x {case.max_completion_length}), "
          f"{repeats} runs each, steps 2-{case.steps}, medians:")  # fmt: skip
    out: dict[str, Any] = {}
    for key, results in runs.items():
        steps = [step for run in results for step in run["steps"][1:]]
        info = results[0]["info"]
        ratio = [s["flops"] / step_minimum(info, results[0]["case"], s["completion_tokens"]) for s in steps]
        out[key] = {name: statistics.median(s[name] for s in steps) for name in ("seconds", "logprobs", "train")}
        out[key]["flops_ratio"] = statistics.median(ratio)
        print(f"  padding_free {key:3s}: step {out[key]['seconds']:.2f} s, log-probs {out[key]['logprobs']:.2f} s, "
              f"update {out[key]['train']:.2f} s, matmul FLOPs {out[key]['flops_ratio']:.2f}x the minimum")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small", choices=["tiny", "small", "qwen0.5b"])
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--limit", type=int, default=128, help="max completion tokens")
    parser.add_argument("--prompt-tokens", type=int, default=0, help="0: arithmetic prompts of 8-24 tokens")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", action="store_true", help="also whole steps of bench_vs_trl's varied case")
    parser.add_argument("--step-repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = {"passes": pass_benchmark(args, device)}
    if args.steps:
        result["steps"] = step_benchmark(args.step_repeats)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
