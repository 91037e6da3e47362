"""rloo against TRL 1.16's RLOOTrainer on one GPU, phase by phase, on the same model, data and settings (issue 38).

    bash benchmarks/gpu_vs_trl.sh            # the driver (make bench-gpu): about 9.5 minutes on an H100 or H200
    QUICK=1 bash benchmarks/gpu_vs_trl.sh    # a tiny dry run on a CPU, seconds per part

The driver calls this script once per implementation and variant, each in a process of its own (peak memory is
per process, and a part that hangs loses only its own numbers):

    gpu_vs_trl.py setup DIR [--quick]         the machine line; the model folders DIR/fixed and DIR/varied
    gpu_vs_trl.py run IMPL CASES DIR OUT ...  rloo or trl on the cases (fixed, varied), JSON into OUT as it goes
    gpu_report.py OUT                         the tables against the hardware's floors, the last lines printed

The model is random-init with Qwen2.5-0.5B's shape (:func:`gpu_checks.qwen_shape`: 151,936-token vocabulary, tied
embeddings) and the character tokenizer padded to that vocabulary, saved by ``setup``. **fixed**: 512-token
prompts, completions that never end (a random model rarely samples EOS). **varied**: the same weights with a
constant EOS hazard (:mod:`varied_lengths`, 12% of completions reach the limit), prompts of 384-512 tokens.
Both implementations: 8 prompts x 8, 256 new tokens, ``per_device_train_batch_size=16``,
``steps_per_generation=4``, beta 0.04, lr 1e-6, seed 0, ``bf16=True`` over float32 weights, no gradient
checkpointing, each with its own defaults otherwise; TRL with ``use_vllm=False`` (no vLLM on the GPU machine) and,
as a variant, ``use_transformers_continuous_batching`` where the installed TRL and transformers have it. The first
generation batch is a warm-up; with ``--profile`` the last one is profiled (:mod:`gpu_phases`) and timed apart.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from gpu_phases import Recorder  # noqa: E402
from gpu_runners import TRAINING, Spec, continuous_batching_unsupported, run_rloo, run_trl  # noqa: E402

# prompt tokens (fixed), the varied prompts' range, new tokens, the share of varied completions at the limit
SIZES = {"prompt": 512, "varied_prompts": [384, 512], "completion": 256, "reach": 0.12, "vocab": 151_936}
QUICK_SIZES = {"prompt": 16, "varied_prompts": [10, 16], "completion": 8, "reach": 0.3, "vocab": 256}
# rloo: cuDNN attention off, TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1, the captured decode step with the fused LM head;
# both: use_transformers_continuous_batching (rloo: its engine seam, rloo/generation/continuous_batching.py)
VARIANTS = ("as-is", "torch-order", "cudnn-off", "avoid-recompile", "graphs-fused", "cb")


# ---------------------------------------------------------------------------------------------- setup
def versions() -> dict[str, Any]:
    found: dict[str, Any] = {"torch": torch.__version__}
    for name in ("transformers", "accelerate", "trl", "triton", "peft", "datasets"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    order = getattr(torch._C, "_get_sdp_priority_order", None)
    if order is not None:
        from torch.nn.attention import SDPBackend

        found["sdp_priority_order"] = [SDPBackend(int(x)).name for x in order()]
    switches = ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "cudnn_sdp_enabled", "math_sdp_enabled")
    found["sdp_enabled"] = {name: getattr(torch.backends.cuda, name)() for name in switches}  # a variant's check
    return found


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def setup(folder: Path, quick: bool) -> None:
    """The machine line, then DIR/fixed and DIR/varied (the same weights with the EOS hazard) and DIR/sizes.json."""
    from gpu_checks import qwen_shape
    from transformers import AutoModelForCausalLM
    from varied_lengths import arrange_model, hazard_for

    from rloo.tiny import build_char_tokenizer

    print(json.dumps({"device": device_name(), **versions()}), flush=True)
    sizes = QUICK_SIZES if quick else SIZES
    tokenizer = build_char_tokenizer(vocab_size=sizes["vocab"])
    config = qwen_shape(tiny=quick)
    config.vocab_size = sizes["vocab"]
    config.pad_token_id, config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    config.bos_token_id = tokenizer.bos_token_id  # TRL would align it (and say so); rloo reads none
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init on the GPU: seconds, not tens
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(folder / "fixed")
    arrange_model(model, tokenizer.eos_token_id, sizes["vocab"], hazard_for(sizes["completion"], sizes["reach"]))
    model.save_pretrained(folder / "varied")
    (folder / "sizes.json").write_text(json.dumps({**sizes, "quick": quick}))


# ---------------------------------------------------------------------------------------------- a run
def model_dims(model: Any) -> dict[str, Any]:
    from common import model_sizes

    config = model.config
    total, head, body = model_sizes(model)
    return {
        "layers": config.num_hidden_layers,
        "hidden": config.hidden_size,
        "heads": config.num_attention_heads,
        "kv_heads": config.num_key_value_heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        "vocab": config.vocab_size,
        "parameters": total,
        "head_parameters": head,
        "body_parameters": body,
    }


# ---------------------------------------------------------------------------------------------- results
def write_entry(path: Path, key: str, value: dict[str, Any]) -> None:
    """``path``'s JSON object with ``key`` set to ``value``, replaced whole (never half-written)."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data, indent=1))
    os.replace(partial, path)


def run_case(spec: Spec, out: Path, key: str) -> bool:
    """One implementation on one case; its record is rewritten after every batch. True when it finished."""
    record: dict[str, Any] = {
        "impl": spec.impl,
        "case": spec.case,
        "variant": spec.variant,
        "device": device_name(),
        "versions": versions(),
        "settings": {**TRAINING, **spec.sizes, "batches": spec.batches, "profile": spec.profile},
        "env": {k: v for k, v in os.environ.items() if k.startswith(("TORCH_CUDNN", "RLOO_"))},
        "status": "running",
        "batches": [],
        "profile": None,
    }
    if spec.variant == "cb" and (reason := continuous_batching_unsupported(spec.impl)) is not None:
        write_entry(out, key, {**record, "status": "unsupported", "reason": reason})
        print(f"{key}: unsupported ({reason})", flush=True)
        return True
    rec = Recorder(spec.device, spec.trace, (100, 16) if not spec.sizes["quick"] else (2, 4))

    def done(batch: dict[str, Any]) -> None:
        record["batches"].append(batch)
        if batch["profiled"]:
            record["profile"] = rec.profile_summary(batch.get("decode_steps", 0))
        write_entry(out, key, record)
        shown = {k: v for k, v in batch["phases"].items() if k in ("batch", "sampling", "logprobs", "update")}
        print(f"{key} batch {batch['index']}: {json.dumps(shown)}", flush=True)

    def started(model: Any) -> None:
        record["model"] = model_dims(model)  # before any batch: a run cut short still has its floors
        write_entry(out, key, record)

    write_entry(out, key, record)
    try:
        (run_rloo if spec.impl == "rloo" else run_trl)(spec, rec, started, done)
        record["status"] = "done"
    except Exception:
        record["status"], record["error"] = "error", traceback.format_exc()[-4000:]
        traceback.print_exc()
    write_entry(out, key, record)
    return record["status"] == "done"


def run(options: argparse.Namespace) -> int:
    from accelerate.state import AcceleratorState

    if options.variant in ("torch-order", "avoid-recompile"):
        # rloo's loop prefers flash and efficient attention to cuDNN (rloo/generation/attention_backend.py):
        # these variants keep torch's own order (cuDNN first on SM 9.0/10.0), the suspect of the bf16 slowdown
        os.environ["RLOO_SDPA_PRIORITY"] = "torch"
    if options.variant == "cudnn-off":
        torch.backends.cuda.enable_cudnn_sdp(False)
    if options.variant == "avoid-recompile" and os.environ.get("TORCH_CUDNN_SDPA_AVOID_RECOMPILE") != "1":
        raise SystemExit("the avoid-recompile variant needs TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 in the environment")
    if options.variant == "graphs-fused":
        os.environ["RLOO_LM_HEAD_KERNEL"] = "fused"  # read at each pass (rloo/forward/fused_head.py)
    sizes = json.loads((options.dir / "sizes.json").read_text())
    failed = 0
    for case in options.cases.split(","):
        AcceleratorState._reset_state(reset_partial_state=True)  # one mixed-precision setting per process otherwise
        spec = Spec(
            options.impl, case, options.variant, options.dir, sizes, options.batches, options.profile, options.trace
        )
        key = case if options.variant == "as-is" else f"{options.variant} {case}"
        failed += not run_case(spec, options.out, key)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("setup", help="the machine line and the model folders")
    made.add_argument("dir", type=Path)
    made.add_argument("--quick", action="store_true", help="a tiny model of the same family, few tokens")
    one = commands.add_parser("run", help="one implementation on some cases, in this process")
    one.add_argument("impl", choices=["rloo", "trl"])
    one.add_argument("cases", help="fixed, varied or fixed,varied")
    one.add_argument("dir", type=Path, help="setup's folder")
    one.add_argument("out", type=Path, help="the JSON file to add this run to")
    one.add_argument("--variant", choices=VARIANTS, default="as-is")
    one.add_argument("--batches", type=int, default=3, help="generation batches, the first a warm-up")
    one.add_argument("--profile", action="store_true", help="profile the last batch (reduced in-process)")
    one.add_argument("--trace", type=Path, default=None, help="a gzipped Chrome trace of 16 decode steps of batch 1")
    options = parser.parse_args()
    if options.command == "setup":
        setup(options.dir, options.quick)
    else:
        sys.exit(run(options))


if __name__ == "__main__":
    main()
