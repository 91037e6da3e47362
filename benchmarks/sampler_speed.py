"""rloo's sampler against transformers' ``generate``, side by side: tokens/s and their ratio.

    .venv/bin/python benchmarks/sampler_speed.py                        # tiny and small models
    .venv/bin/python benchmarks/sampler_speed.py --models small --threads 1 --rounds 7

The comparison of ``bench_vs_trl.py``'s sampler table (which calls :func:`generation_speed`): the
benchmark models (``common.MODEL_SIZES``, built by ``rloo.tiny.save_tiny_model``), 4 prompts x 16
samples x 128 new tokens, temperature 1, no top-k/top-p, EOS masked out of the logits (a -inf bias
on its logit, a forward hook on ``lm_head``) so that every row runs all 128 tokens in both.
After a warm-up of each, the runs alternate (rloo, generate, generate, rloo, ...), so a load that
comes and goes weighs on both alike; figures are medians.

It also clocks the model's forward passes (hooks on the model): their share of each sampler's
time, and ``bound``: the ratio rloo would reach if its loop cost nothing beyond its forward passes
(``generate``'s time over rloo's forward time). Where rloo's forward share is high, the bound is
close to the ratio: what is left to gain is in the model's own forward (its matmuls and attention,
the same kernels ``generate`` runs), not in the sampling loop.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from common import MODEL_SIZES  # noqa: E402


class ForwardClock:
    """Seconds spent inside ``model``'s forward calls (hooks on the model itself)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.seconds, self._start = 0.0, 0.0
        model.register_forward_pre_hook(self._enter)
        model.register_forward_hook(self._leave)

    def _enter(self, *args: Any) -> None:
        self._start = time.perf_counter()

    def _leave(self, *args: Any) -> None:
        self.seconds += time.perf_counter() - self._start


def build_model(folder: Path, name: str) -> Path:
    """The benchmark model ``name`` of ``common.MODEL_SIZES`` and its tokenizer, saved under ``folder``."""
    from rloo.tiny import save_tiny_model

    size = MODEL_SIZES[name]
    return save_tiny_model(
        folder / name,
        vocab_size=size["vocab_size"],
        hidden_size=size["hidden_size"],
        num_layers=size["num_layers"],
        num_heads=size["num_heads"],
        intermediate_size=size["intermediate_size"],
    )


def generate_completions(model: Any, tokenizer: Any, texts: list[str], k: int, tokens: int) -> torch.Tensor:
    """``(P*k, <= tokens)`` completion ids from transformers' ``generate``, sampling from the full distribution
    (temperature 1, no top-k or top-p), stopping at EOS, with the torch generator as it is."""
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **batch,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=tokens,
            num_return_sequences=k,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    return out[:, batch["input_ids"].shape[1] :]


def generation_speed(
    model_dir: Path, name: str, rounds: int = 3, prompts: int = 4, k: int = 16, tokens: int = 128
) -> dict[str, Any]:
    """Tokens/s of our sampler and of ``generate`` on the model in ``model_dir`` (medians of
    ``rounds`` alternating runs each), and each one's share of time in the model's forward passes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rloo.generation.rollout import generate_rollouts
    from rloo.generation.sampling import SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    model.lm_head.register_forward_hook(
        lambda m, i, out: out.index_fill(-1, torch.tensor([tokenizer.eos_token_id]), -1e9)
    )
    clock = ForwardClock(model)
    ids = [tokenizer(f"{i}+{i}=")["input_ids"] for i in range(prompts)]

    def ours() -> int:
        out = generate_rollouts(
            model,
            ids,
            list(range(prompts)),
            num_generations=k,
            max_new_tokens=tokens,
            params=SamplingParams(),
            eos_token_ids=[tokenizer.eos_token_id],
            pad_token_id=tokenizer.pad_token_id,
            generator=torch.Generator().manual_seed(0),
        )
        return int(out.completion_mask.sum())

    def theirs() -> int:
        return generate_completions(model, tokenizer, [f"{i}+{i}=" for i in range(prompts)], k, tokens).numel()

    runs: dict[str, Callable[[], int]] = {"rloo": ours, "transformers": theirs}
    speeds: dict[str, list[float]] = {label: [] for label in runs}
    shares: dict[str, list[float]] = {label: [] for label in runs}
    for run in runs.values():
        run()
    for index in range(rounds):
        for label in runs if index % 2 == 0 else list(runs)[::-1]:
            clock.seconds = 0.0
            start = time.perf_counter()
            produced = runs[label]()
            seconds = time.perf_counter() - start
            speeds[label].append(produced / seconds)
            shares[label].append(clock.seconds / seconds)
    result: dict[str, Any] = {"model": name, "rows": prompts * k, "tokens": tokens}
    result.update({label: statistics.median(values) for label, values in speeds.items()})
    result["ratio"] = result["rloo"] / result["transformers"]
    result["forward_share"] = {label: statistics.median(values) for label, values in shares.items()}
    result["bound"] = result["ratio"] / result["forward_share"]["rloo"]
    result["runs"] = speeds
    print(
        f"generation {name}: rloo {result['rloo']:.0f} tok/s, transformers {result['transformers']:.0f} tok/s, "
        f"ratio {result['ratio']:.2f} (forward share: rloo {result['forward_share']['rloo']:.0%}, "
        f"transformers {result['forward_share']['transformers']:.0%}; bound {result['bound']:.2f})",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,small", help=f"comma-separated, of {sorted(MODEL_SIZES)}")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs of each sampler")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        results = [generation_speed(build_model(Path(tmp), name), name, args.rounds) for name in args.models.split(",")]
    print(json.dumps({"threads": torch.get_num_threads(), "generation": results}, indent=1))


if __name__ == "__main__":
    main()
