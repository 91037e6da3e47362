"""Issue 25's checks on a lent GPU, in one run: the bf16 step-0 KL, the memory plan against
``torch.cuda.max_memory_allocated``, and the step time of a Qwen2.5-0.5B-shaped model.

    python benchmarks/gpu_checks.py                # on the GPU machine (prints markdown for BENCHMARKS.md)
    python benchmarks/gpu_checks.py --tiny         # the same code on a 2-layer model (a CPU dry run)

The model is random-init with Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads, 2 KV heads, MLP 4864,
151,936-token vocabulary, tied embeddings): no weights can be downloaded there. bf16 mixed precision over
float32 weights (``bf16=True``), as rloo trains by default on a GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from transformers import Qwen2Config

if TYPE_CHECKING:
    from memory_plan import Case

MiB = 2**20


def qwen_shape(tiny: bool, **sizes: int) -> Qwen2Config:
    """Qwen2.5-0.5B's shape (``tiny``: 2 layers of hidden 64, the same vocabulary); ``sizes`` override it."""
    small = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}
    real = {"num_hidden_layers": 24, "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14}
    return Qwen2Config(
        vocab_size=151_936,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        **{**(small if tiny else real), **sizes},
    )


def kl_at_step_zero(device: str, tiny: bool) -> dict[str, Any]:
    """policy == reference at step 0 under bf16: the logged KL (both sides from the same no-grad passes)
    and, for comparison, the gap the sampler's decode log-probs would have put into it."""
    from memory_measure import measure_step

    seen: dict[str, Any] = {}

    def instrument(trainer: Any) -> None:
        maker = trainer.experience
        original = maker.logprobs

        def logprobs(rollout: Any) -> Any:
            out = original(rollout)
            if "gap" not in seen:
                mask = rollout.completion_mask.bool()
                decode = rollout.sampling_logprobs[mask].float()
                reference = out.reference[mask].float()
                diff = reference - decode
                k3 = torch.exp(diff) - diff - 1
                lengths = rollout.completion_mask.sum(1)
                seen["gap"] = {
                    "decode vs forward |log p| mean": float(diff.abs().mean()),
                    "decode vs forward |log p| max": float(diff.abs().max()),
                    "k1 from decode log-probs, per-token mean": float((-diff).mean()),
                    "k3 from decode log-probs, per-token mean": float(k3.mean()),
                    "k3 from decode log-probs, summed per completion (mean)": float(k3.sum() / len(lengths)),
                    "same-pass old vs reference, max |diff|": float((out.old - out.reference)[mask].abs().max()),
                }
            return out

        maker.logprobs = logprobs

    config = {
        "num_generations": 8,
        "per_device_train_batch_size": 16,
        "max_completion_length": 64 if tiny else 256,
        "bf16": True,
        "beta": 0.04,
        "kl_estimator": "k3",
    }
    measured = measure_step(
        qwen_shape(tiny), config, 128 if tiny else 512, device=device, steps=1, instrument=instrument
    )
    first = next(e for e in measured.log_history if "kl" in e)
    return {"logged kl at step 1": first["kl"], **seen["gap"]}


def gpu_cases(tiny: bool) -> list[Case]:
    from memory_plan import Case  # imported here: gpu_vs_trl.py imports qwen_shape without any trainer

    model = qwen_shape(tiny)
    tc, tp = (64, 128) if tiny else (256, 512)
    base = {"num_generations": 8, "max_completion_length": tc, "bf16": True, "beta": 0.04}
    return [
        Case(
            "full fine-tuning, 8 prompts x 8, 4 micro-batches of 16",
            model,
            tp,
            {**base, "per_device_train_batch_size": 16, "steps_per_generation": 4},
        ),
        Case(
            "LoRA r=16 (q, v), same batch",
            model,
            tp,
            {**base, "per_device_train_batch_size": 16, "steps_per_generation": 4},
            lora_rank=16,
        ),
        Case(
            "gradient checkpointing, 1,000-token prompts, micro-batch 32",
            model,
            1000 if not tiny else 200,
            {**base, "per_device_train_batch_size": 32, "steps_per_generation": 2, "gradient_checkpointing": True},
        ),
    ]


def main() -> None:
    from memory_measure import measure_step
    from memory_plan import predict

    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--out", default=None)
    parser.add_argument("--skip-kl", action="store_true")
    parser.add_argument("--case", type=int, default=None, help="run this memory case only (one per process)")
    options = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    results: dict[str, Any] = {"device": name, "torch": torch.__version__}
    print(f"device: {name}, torch {torch.__version__}", flush=True)
    if options.case is None and not options.skip_kl:
        try:
            results["kl"] = kl_at_step_zero(device, options.tiny)
            print(json.dumps(results["kl"], indent=1), flush=True)
        except Exception:
            traceback.print_exc()
    if options.case is None:  # each memory case in a process of its own: max_memory_allocated is per process
        for number in range(len(gpu_cases(options.tiny))):
            flags = ["--case", str(number)] + (["--tiny"] if options.tiny else [])
            out = [] if options.out is None else ["--out", f"{options.out}.case{number}"]
            subprocess.run([sys.executable, __file__, *flags, *out], check=False)
        return
    results["measured"] = {}
    rows = ["| case | phase | predicted MiB | measured MiB | ratio |", "|---|---|---|---|---|"]
    timings = []
    for case in gpu_cases(options.tiny)[options.case : options.case + 1]:
        plan = predict(case)
        try:
            measured = measure_step(case.model, case.config, case.prompt_length, case.lora(), device=device, steps=2)
        except Exception:
            traceback.print_exc()
            continue
        results["measured"][case.name] = measured.phases
        for phase in ("sampling", "log-probs", "training"):
            predicted = plan.phase(phase).total
            if phase == "training":
                predicted = max(predicted, plan.phase("optimizer step").total)
            got = measured.phases[phase]
            rows.append(
                f"| {case.name} | {phase} | {predicted / MiB:,.0f} | {got / MiB:,.0f} | {predicted / got:.2f} |"
            )
            print(rows[-1], flush=True)
        timing = (
            {k: v for k, v in measured.log_history[-2].items() if k.startswith("timing/")}
            if len(measured.log_history) > 1
            else {}
        )
        timings.append(
            {
                "case": case.name,
                "generation batch seconds": measured.step_seconds,
                "mean completion length": measured.completion_tokens,
                **timing,
            }
        )
        print(json.dumps(timings[-1]), flush=True)
        results["memory"], results["timings"] = rows, timings
        if options.out:  # after each case: a run cut short still reports what it measured
            Path(options.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
